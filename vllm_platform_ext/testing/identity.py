"""Token identity of a speculative cell against plain decoding on the same KV preset (issue 32:
"C's tokens equal those of TurboQuant plain decoding on the audit prompts").

Greedy speculative decoding should reproduce plain decoding token for token; in a real engine it
may not, because the verify batch has another shape than a decode step (other GEMM tilings, other
bf16 rounding). Where the two part, the prefix before is identical, so the float32 audit scored
both tokens at that position on the same context: their log-probability gap (the difference of
the two regrets) says whether the split was a near-tie (a few hundredths of a nat) or a wrong
token. Reported per prompt, never judged here: the cells' pass/fail stays the float32 audit.

The identity floor: plain decoding against itself when only the batch shape changes (the same
engine generating the prompts alone, reversed, in pairs, beside fillers: ``engine.COMPOSITIONS``).
Where plain decoding parts from itself on as many prompts as the speculative cell parts from it,
the split is the engine's batch-shape sensitivity (other bf16 GEMM tilings), not the verify path;
where the cell parts more often, it says nothing by itself about whose the split is (window 7's
``tq-ident`` suite runs vLLM's own verify path beside the plugin's for that).
"""
from __future__ import annotations


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ (the shorter length if one is a prefix of
    the other), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(spec_tokens: list[list[int]], plain_tokens: list[list[int]], spec_regrets: list | None = None,
            plain_regrets: list | None = None) -> list[dict | None]:
    """Per prompt: None where the speculative tokens equal plain decoding's, else ``{"pos": i}``
    plus, when both runs were audited and hold position ``i``, ``"gap"`` (the float32
    log-probability gap between the two tokens at ``i``) and each token's regret there
    (``spec_regret``, ``plain_regret``: 0 is float32's argmax)."""
    if len(spec_tokens) != len(plain_tokens):  # zip would drop the prompts past the shorter list
        raise ValueError(f"{len(spec_tokens)} speculative outputs against {len(plain_tokens)} plain ones: "
                         "compare the same prompts")
    out: list[dict | None] = []
    for p, (s, q) in enumerate(zip(spec_tokens, plain_tokens)):
        i = first_difference(s, q)
        if i is None:
            out.append(None)
            continue
        item: dict = {"pos": i}
        try:
            rs, rp = float(spec_regrets[p][i]), float(plain_regrets[p][i])
        except (TypeError, IndexError):
            pass
        else:  # the regrets say which of the two tokens float32 prefers there
            item.update(gap=round(abs(rs - rp), 4), spec_regret=round(rs, 4), plain_regret=round(rp, 4))
        out.append(item)
    return out


def summary(identity: list) -> str:
    """``"7/7 identical"`` or ``"2/7 identical; first differences at 26, 11, 9 (gap <= 0.031 nats; the
    speculative token the worse one in 1 of 3)"``."""
    if not identity:
        return "—"
    diffs = [d for d in identity if d is not None]
    text = f"{len(identity) - len(diffs)}/{len(identity)} identical"
    if diffs:
        text += "; first differences at " + ", ".join(str(d["pos"]) for d in diffs)
        gaps = [d for d in diffs if "gap" in d]
        if gaps:
            worse = sum(d["spec_regret"] > d["plain_regret"] for d in gaps)
            text += (f" (gap <= {max(d['gap'] for d in gaps):.3f} nats; the speculative token the worse one "
                     f"in {worse} of {len(gaps)})")
    return text


def floor(plain_tokens: list[list[int]], compositions: dict) -> dict:
    """``{composition: compare(its tokens, plain_tokens)}``: plain decoding against itself in each
    other batch composition its engine ran (``EngineRun.compositions``)."""
    return {name: compare(toks, plain_tokens) for name, toks in compositions.items()}


def floor_summary(identity_floor: dict) -> str:
    """``"plain decoding vs itself in other batches: alone 7/7, reversed 5/7"``, or ``""``."""
    if not identity_floor:
        return ""
    parts = [f"{name} {sum(d is None for d in ids)}/{len(ids)}" for name, ids in identity_floor.items()]
    return "plain decoding vs itself in other batches: " + ", ".join(parts)
