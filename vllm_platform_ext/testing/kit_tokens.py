"""The kit's token alphabet: the char-level tokenizer's characters and the hot letters the kit's
``lm_head`` favours. Shared by :mod:`.tiny_models`, :mod:`.prompts` and :mod:`.mtp_distill`."""
from __future__ import annotations

VOCAB_SIZE = 256
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3; bos=1, eos=2 as in the config


def _tokenizer_chars(n: int) -> list[str]:
    """``n`` distinct single characters: printable ASCII, newline, then Latin-1 and beyond."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    c = 0xA1
    while len(chars) < n:
        ch = chr(c)
        if ch.isprintable() and not ch.isspace():
            chars.append(ch)
        c += 1
    return chars[:n]


def hot_token_ids(n: int = 16) -> list[int]:
    """Token ids of the first ``n`` lowercase letters ('a', 'b', ...) in the kit's tokenizer."""
    chars = _tokenizer_chars(VOCAB_SIZE - len(SPECIAL_TOKENS))
    letters = [c for c in chars if "a" <= c <= "z"][:n]
    if len(letters) < n:
        raise ValueError(f"at most 26 hot tokens, asked for {n}")
    return [len(SPECIAL_TOKENS) + chars.index(c) for c in letters]
