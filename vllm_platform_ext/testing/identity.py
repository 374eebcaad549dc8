"""Token identity of a speculative cell against plain decoding on the same KV preset (issue 32:
"C's tokens equal those of TurboQuant plain decoding on the audit prompts").

Greedy speculative decoding should reproduce plain decoding token for token; in a real engine it
may not, because the verify batch has another shape than a decode step (other GEMM tilings, other
bf16 rounding). Where the two part, the prefix before is identical, so the float32 audit scored
both tokens at that position on the same context: their log-probability gap (the difference of
the two regrets) says whether the split was a near-tie (a few hundredths of a nat) or a wrong
token. Reported per prompt (:func:`compare`), and judged where that is sound (:func:`split_problem`).

The split rule: a speculative run fails where, at a prompt's first difference from plain decoding
on the same KV preset, its token is worse than plain decoding's by more than :data:`SPLIT_NATS` in
float32 (``spec_regret - plain_regret``). On a bf16 KV cache the engine's decode step and its verify
step compute the same logits up to the rounding of other GEMM tilings, which moves a pair of tokens
by hundredths of a nat: in the committed GPU results every first difference of a bf16-KV
``qwen3_next`` or ``qwen3_5`` cell with the plugin is within 0.19 nats (the speculative token worse)
or 0.41 (plain worse), while each of upstream's wrong ngram cells there parts by 1.4 to 7.2 nats on
some prompt. A split past 0.5 nats on the identical prefix
is not rounding, even when the audit's count of bad positions stays under its limit (one wrong token
of hundreds). It is not applied (:func:`split_rule_skip` says why) where the float32 margin is not
the engine's: a quantizing KV preset (TurboQuant, fp8: the reference knows no quantization; passing
TurboQuant cells part at up to 2.34 nats), the batch-floor families (``cell_suites.BATCH_FLOOR_KINDS``,
the MoE form: a flipped expert moves logits by whole nats; passing cells part at 0.70 and plain
decoding from itself at 2.06), and checkpoints other than the kit's (their batch-shape sensitivity
is unmeasured). The kit's ``qwen3_next`` routes experts too (4, top 2) but has shown no such split
on bf16 KV; one would move it into ``BATCH_FLOOR_KINDS``.

The identity floor: plain decoding against itself when only the batch shape changes (the same
engine generating the prompts alone, reversed, in pairs, beside fillers: ``engine.COMPOSITIONS``).
Where plain decoding parts from itself on as many prompts as the speculative cell parts from it,
the split is the engine's batch-shape sensitivity (other bf16 GEMM tilings), not the verify path;
where the cell parts more often, it says nothing by itself about whose the split is (window 7's
``tq-ident`` suite runs vLLM's own verify path beside the plugin's for that).
"""
from __future__ import annotations

SPLIT_NATS = 0.5  # audit.BAD_NATS: a token worse by more than this is a wrong token, not a near-tie
UNQUANTIZED_KV = ("auto", "bfloat16", "float16")


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


def worse_splits(identity: list, nats: float = SPLIT_NATS) -> list[tuple[int, dict]]:
    """``(prompt, item)`` of each first difference of :func:`compare` where the speculative token's
    float32 regret exceeds plain decoding's by more than ``nats`` (items without regrets: none)."""
    return [(p, d) for p, d in enumerate(identity or [])
            if d is not None and "gap" in d and d["spec_regret"] - d["plain_regret"] > nats]


def split_rule_skip(model: str, kv: str) -> str | None:
    """Why the split rule does not judge a run of kit model ``model`` on KV dtype ``kv``; None: it does."""
    from vllm_platform_ext.testing.cell_suites import BATCH_FLOOR_KINDS
    from vllm_platform_ext.testing.tiny_models import KINDS

    if model not in KINDS:
        return f"{model!r} is not a kit model: its batch-shape sensitivity is unmeasured"
    if model in BATCH_FLOOR_KINDS:
        return f"{model}: expert routing flips under other batch shapes (a batch-floor family)"
    if kv not in UNQUANTIZED_KV:
        return f"KV {kv}: the float32 reference knows no quantization, its margin is not the engine's"
    return None


def split_problem(identity: list, model: str, kv: str, nats: float = SPLIT_NATS) -> str | None:
    """The split rule's verdict on a speculative run's :func:`compare` against plain decoding: a
    line naming each wrong split (prompt, position, both regrets), or None (none, or not judged)."""
    if split_rule_skip(model, kv):
        return None
    bad = worse_splits(identity, nats)
    if not bad:
        return None
    where = ", ".join(f"prompt {p + 1} at {d['pos']} ({d['spec_regret']:.2f} vs {d['plain_regret']:.2f})"
                      for p, d in bad)
    return (f"tokens part from plain decoding with the speculative token worse by > {nats:g} nats in "
            f"float32 at {len(bad)} prompt(s): {where}")
