"""The TurboQuant verify route, checked in the engine against vLLM's own decode kernel
(``VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK=1``; the GPU cells' audit of the route, off by default).

The float32 token audit cannot see a verify window one position off on the kit: the recall kit's
attention gives a row's own position no weight bf16 can hold and lends the next draft 4% at most
(issue 49, results/gpu/2026-12-02-drift-tq-mutations/), so tokens and log-probabilities do not move.
This check looks at the attention output itself. Every call the route serves -- a uniform K+1
verify batch, a batch of one row per token, a uniform single-token decode -- is computed a second
time by vLLM's single-token decode kernel, ``triton_turboquant_decode_attention`` (the module of the
backend vLLM selected), one decode row per query token on the same cache, and the largest per-row,
per-head relative L2 difference is kept per route kind.

Independent of the route: each row's causal window is computed here from vLLM's
``query_start_loc`` and ``seq_lens`` (:func:`token_rows`), not from the route's
``routing.spec_verify_rows`` or the op's own offsets; the kernel is upstream's. The running figures
live on the device and are updated by torch ops only, so CUDA graphs that captured a routed call
update them on every replay; :func:`snapshot` reads them (``patch.routes`` snapshot, every rank).
"""
from __future__ import annotations

from typing import Any

import torch

from vllm_platform_ext import envs

GROUP = "turboquant_route_check"
KINDS = ("k1", "rows", "decode")
# a row's relative difference is taken against max(|ref row|, FLOOR x the call's largest |ref row|): a row
# whose attention output is near zero is not a relative blow-up
FLOOR = 1e-2
# device -> [len(KINDS), 5] float32: (largest relative difference over the rows both sides hold finite, calls,
# real rows non-finite in the route's output alone, in the decode kernel's alone, in both: the two agree there)
_STATE: dict[str, torch.Tensor] = {}


def enabled() -> bool:
    return envs.parse_bool(envs.TQ_ROUTE_CHECK, False)


def state(device: torch.device) -> torch.Tensor:
    """This device's running figures, made outside any graph capture (the first routed call is a
    warm-up or profile run; a first call inside a capture makes them there and says so)."""
    key = str(device)
    t = _STATE.get(key)
    if t is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{GROUP}: first routed call inside a CUDA graph capture on {device}: its figures "
                               "would be reset by every replay")
        t = _STATE[key] = torch.zeros(len(KINDS), 5, dtype=torch.float32, device=device)
    return t


def token_rows(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, n: int,
               slot_mapping: torch.Tensor | None = None):
    """``(block-table row, causal length, real)`` of each of the ``n`` query tokens: token ``j`` of a
    request with ``q`` tokens this step and ``seq_len`` positions (the new ones included) sees the
    first ``seq_len - q + 1 + j``. ``real`` is False for a captured graph's padding: a token past the
    last request's, a padded request's (its ``seq_len`` too short to hold its own tokens; vLLM
    pads with 0), or, given ``slot_mapping``, a token whose own slot is negative (PAD_SLOT_ID: nothing
    of it is written to the cache; vLLM 0.26's dummy K+1 runs are all such tokens, measured on the H200
    2026-12-03), whose rows vLLM throws away. Torch ops only, on the tensors' device."""
    num_reqs = seq_lens.shape[0]
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    tok = torch.arange(n, device=qsl.device, dtype=torch.int64)
    req = (torch.searchsorted(qsl, tok, right=True) - 1).clamp(0, num_reqs - 1)
    start, qlen = qsl[req], qsl[req + 1] - qsl[req]
    sl = seq_lens.to(torch.int64)[req]
    lens = sl - qlen + 1 + (tok - start)
    real = (tok < qsl[-1]) & (sl >= qlen) & (qlen > 0)
    if slot_mapping is not None:
        m = min(n, slot_mapping.shape[0])
        own = torch.zeros(n, dtype=torch.bool, device=qsl.device)
        own[:m] = slot_mapping[:m].to(qsl.device) >= 0
        real = real & own
    return block_table[req], lens.clamp_min(1).to(seq_lens.dtype), real


def relative_difference(got: torch.Tensor, ref: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """Largest per-row, per-head ``|got - ref| / max(|ref|, FLOOR x max |ref|)`` (L2 over the head dim)
    over the ``real`` rows (all where None), a 0-d float32 tensor; ``[rows, heads, head_dim]`` both. A
    NaN in a real row is NaN here; padding rows count for nothing, whatever they hold."""
    g, r = got.float(), ref.float()
    num = (g - r).norm(dim=-1)
    den = r.norm(dim=-1)
    if real is not None:
        keep = real[:, None].expand_as(num)
        num = torch.where(keep, num, torch.zeros_like(num))
        den = torch.where(keep, den, torch.zeros_like(den))
    den = torch.maximum(den, den.amax() * FLOOR).clamp_min(1e-30)
    return (num / den).amax()


def check(impl: Any, layer: Any, q: torch.Tensor, cache: torch.Tensor, attn_metadata: Any, got: torch.Tensor,
          kind: str) -> bool:
    """Run the route's ``n`` rows (``q``/``got`` ``[n, Hq, D]``) through vLLM's decode kernel and keep the
    difference under ``kind``; False when the impl's module has no such kernel (nothing kept)."""
    from vllm_platform_ext.patch.turboquant.upstream_rows import decode_kernel, rows_forward

    if decode_kernel(impl) is None:
        return False
    n = q.shape[0]
    bt, lens, real = token_rows(attn_metadata.query_start_loc, attn_metadata.seq_lens, attn_metadata.block_table, n,
                                getattr(attn_metadata, "slot_mapping", None))
    ref = torch.empty_like(got)
    if not rows_forward(impl, layer, q, cache, bt, lens, 1, ref):
        return False
    st = state(q.device)
    i = KINDS.index(kind)
    g_ok = torch.isfinite(got.float()).flatten(1).all(1)
    r_ok = torch.isfinite(ref.float()).flatten(1).all(1)
    both = real & g_ok & r_ok  # relative_difference gives the other rows nothing, whatever they hold
    torch.maximum(st[i, 0], relative_difference(got, ref, both), out=st[i, 0])
    st[i, 1].add_(1)
    st[i, 2].add_((real & ~g_ok & r_ok).sum())
    st[i, 3].add_((real & g_ok & ~r_ok).sum())
    st[i, 4].add_((real & ~g_ok & ~r_ok).sum())
    return True


def snapshot() -> dict:
    """``{"enabled", "<kind>_calls", "<kind>_max_rel", "<kind>_nonfinite_route|ref|both", ...}`` over this
    process's devices (rows: real rows summed over the calls; "both": non-finite on both sides, where the
    route agrees with vLLM's kernel, e.g. a row whose window holds a slot nothing wrote)."""
    out: dict = {"enabled": enabled()}
    for i, kind in enumerate(KINDS):
        vals = [t[i].tolist() for t in _STATE.values()]
        out[f"{kind}_calls"] = int(sum(v[1] for v in vals))
        out[f"{kind}_max_rel"] = max((v[0] for v in vals), default=0.0)
        out[f"{kind}_nonfinite_route"] = int(sum(v[2] for v in vals))
        out[f"{kind}_nonfinite_ref"] = int(sum(v[3] for v in vals))
        out[f"{kind}_nonfinite_both"] = int(sum(v[4] for v in vals))
    return out
