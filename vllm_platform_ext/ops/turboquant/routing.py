"""Which TurboQuant batches take the K+1 verify kernel, and how much scratch it needs.

Pure Python on host-side metadata (no GPU reads, no vLLM): safe to call every step and
during CUDA-graph capture.
"""
from __future__ import annotations

from typing import Sequence


def workspace_rows(max_num_seqs: int, num_spec_tokens: int) -> int:
    """Query rows the verify workspace must hold: ``max_num_seqs x (K+1)``.

    (The decode path's scratch has only ``max_num_seqs`` rows; routing ``B x (K+1)`` rows
    through it is the out-of-bounds write seen with the upstream routing fix.)
    """
    if max_num_seqs < 1 or num_spec_tokens < 0:
        raise ValueError(f"max_num_seqs {max_num_seqs} must be >= 1 and num_spec_tokens {num_spec_tokens} >= 0")
    return max_num_seqs * (num_spec_tokens + 1)


def uniform_verify_width(
    query_lens: Sequence[int],
    num_actual_tokens: int,
    max_query_len: int,
    num_spec_tokens: int,
    decode: bool = False,
) -> int:
    """``K+1`` when the batch is a uniform speculative-verify batch, else 0; with ``decode``, also
    1 for a uniform single-token decode batch of a speculative engine (the drafter's passes after
    its first, a target step whose requests drafted nothing).

    Uniform means: speculative decoding is configured (``num_spec_tokens >= 1``); every real
    request has the same query length ``w`` with ``2 <= w <= num_spec_tokens + 1``; only
    trailing CUDA-graph padding requests may have length 0; and the token count is exactly
    ``num_reqs x w`` (so request ``r`` owns rows ``r*w .. r*w + w - 1``).
    ``query_lens`` are the per-request lengths from the CPU copy of ``query_start_loc``.
    """
    if num_spec_tokens < 1:
        return 0
    w = int(max_query_len)
    n = len(query_lens)
    if n == 0 or w < (1 if decode else 2) or w > num_spec_tokens + 1 or num_actual_tokens != n * w:
        return 0
    seen_pad = False
    for q in query_lens:
        q = int(q)
        if q == w and not seen_pad:
            continue
        if q == 0:
            seen_pad = True
            continue
        return 0
    return w if int(query_lens[0]) == w else 0


def spec_verify_rows(query_lens: Sequence[int], num_actual_tokens: int,
                     num_spec_tokens: int) -> tuple[list[int], list[int]] | None:
    """One decode row per query token for a speculative batch that is not uniform but holds only
    decode and verify requests (every length ``<= num_spec_tokens + 1``, at least one ``>= 2``):
    ngram proposes fewer drafts, or none, for some requests. Returns ``(request of each row,
    tokens after the row in its request)``; row ``i`` then attends to the first
    ``seq_len[request] - after`` positions -- the same causal window as in the K+1 kernel. None for
    any other batch (a prefill chunk longer than K+1, no speculation, a token count that does not
    add up)."""
    if num_spec_tokens < 1:
        return None
    lens = [int(q) for q in query_lens]
    if not lens or sum(lens) != num_actual_tokens or max(lens) < 2 or max(lens) > num_spec_tokens + 1 \
            or min(lens) < 0:
        return None
    req = [r for r, q in enumerate(lens) for _ in range(q)]
    after = [q - 1 - t for q in lens for t in range(q)]
    return req, after


def synthetic_rows(block_table, seq_lens, num_reqs: int, k1: int):
    """vLLM PR #40914's routing of a uniform K+1 verify batch: one decode row per query token,
    ``B x (K+1)`` rows, row ``r*K1 + i`` with request ``r``'s block-table row and length
    ``seq_lens[r] - K1 + 1 + i`` (its causal window). Torch ops on the given tensors only (no
    host reads): graph-capturable. Returns ``(block_table_rows, seq_lens_rows)``."""
    import torch

    offsets = torch.arange(1 - k1, 1, device=seq_lens.device, dtype=seq_lens.dtype)
    rows_seq = (seq_lens[:num_reqs, None] + offsets).reshape(-1)
    rows_bt = block_table[:num_reqs].repeat_interleave(k1, dim=0)
    return rows_bt, rows_seq
