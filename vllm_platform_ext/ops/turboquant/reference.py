"""Torch reference for the TurboQuant KV cache: store (bytes as vLLM 0.32 writes them) and
dequantize-then-attend in float64. Independent of Triton and vLLM; also the ``cpu`` op.

Cache tensors are ``uint8[num_blocks, block_size, num_kv_heads, slot]`` views with any
strides (vLLM hands the backend a transposed head-major cache).
"""
from __future__ import annotations

import torch

from vllm_platform_ext.ops.turboquant.layout import (
    TQLayout,
    bytes_to_fp16,
    float_to_fp8,
    fp8_to_float,
    fp16_to_bytes,
    layout_for,
    midpoints,
    pack_indices,
    unpack_indices,
)


def _check_cache(kv_cache: torch.Tensor, lay: TQLayout) -> None:
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 4:
        raise ValueError(
            f"kv_cache must be uint8[num_blocks, block_size, num_kv_heads, slot], got {kv_cache.dtype} {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[3] < lay.slot_size:
        raise ValueError(f"kv_cache slot {kv_cache.shape[3]} B < {lay.preset} slot {lay.slot_size} B for head dim {lay.head_dim}")


# --------------------------------------------------------------------------------------
# store
# --------------------------------------------------------------------------------------
def quantize_slots(
    key: torch.Tensor,
    value: torch.Tensor,
    lay: TQLayout,
    PiT: torch.Tensor | None = None,
    centroids: torch.Tensor | None = None,
    fp8_e4b15: bool = False,
) -> torch.Tensor:
    """``key/value[N, H, D]`` -> ``uint8[N, H, slot_size]`` slot bytes."""
    n, h, d = key.shape
    if d != lay.head_dim or value.shape != key.shape:
        raise ValueError(f"key/value must both be [N, H, {lay.head_dim}], got {tuple(key.shape)} / {tuple(value.shape)}")
    parts = []
    if lay.key_fp8:
        parts.append(float_to_fp8(key.float(), fp8_e4b15))
    else:
        if PiT is None or centroids is None:
            raise ValueError(f"{lay.preset}: MSE keys need PiT and centroids")
        k = key.float().reshape(n * h, d)
        norms = k.norm(dim=1, keepdim=True)
        y = (k / (norms + 1e-8)) @ PiT.to(k.device, torch.float32)
        mids = midpoints(centroids.to(k.device, torch.float32))
        idx = torch.searchsorted(mids, y.contiguous(), right=True)  # == vLLM's `y >= mid` bisection
        parts.append(pack_indices(idx, lay.key_bits).reshape(n, h, lay.mse_bytes))
        parts.append(fp16_to_bytes(norms.reshape(n, h)))
    v = value.float()
    vmin = v.amin(-1)
    vmax = v.amax(-1)
    levels = 2**lay.value_bits - 1
    vscale = (vmax - vmin) / float(levels)
    vscale = torch.where(vscale > 1e-8, vscale, torch.full_like(vscale, 1e-8))
    q = ((v - vmin[..., None]) / vscale[..., None] + 0.5).to(torch.int32).clamp(0, levels)
    parts.append(pack_indices(q, lay.value_bits))
    parts.append(fp16_to_bytes(vscale))
    parts.append(fp16_to_bytes(vmin))
    out = torch.cat([p.reshape(n, h, -1) for p in parts], dim=-1)
    assert out.shape[-1] == lay.slot_size
    return out


def tq_store_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    preset: str,
    PiT: torch.Tensor | None = None,
    centroids: torch.Tensor | None = None,
    fp8_e4b15: bool = False,
) -> None:
    """Write ``key/value[N, Hk, D]`` into ``kv_cache`` at ``slot_mapping[N]`` (negative = skip)."""
    lay = layout_for(preset, key.shape[-1])
    _check_cache(kv_cache, lay)
    slots = quantize_slots(key, value, lay, PiT, centroids, fp8_e4b15).to(kv_cache.device)
    sm = slot_mapping.to(kv_cache.device).long()
    keep = sm >= 0
    sm, slots = sm[keep], slots[keep]
    bs = kv_cache.shape[1]
    kv_cache[sm // bs, sm % bs, :, : lay.slot_size] = slots


# --------------------------------------------------------------------------------------
# dequantize
# --------------------------------------------------------------------------------------
def dequantize_slots(
    slots: torch.Tensor,
    lay: TQLayout,
    PiT: torch.Tensor | None = None,
    centroids: torch.Tensor | None = None,
    fp8_e4b15: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``uint8[..., slot]`` -> ``(K, V)`` float64 ``[..., D]`` in the model's (unrotated) space."""
    d = lay.head_dim
    if lay.key_fp8:
        k = fp8_to_float(slots[..., :d], fp8_e4b15).double()
    else:
        if PiT is None or centroids is None:
            raise ValueError(f"{lay.preset}: MSE keys need PiT and centroids")
        idx = unpack_indices(slots[..., : lay.mse_bytes], lay.key_bits, d)
        c = centroids.double().to(slots.device)[idx]
        if lay.norm_correction:
            c = c / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16)
        norm = bytes_to_fp16(slots[..., lay.norm_offset : lay.norm_offset + 2]).double()
        k = norm[..., None] * (c @ PiT.double().to(slots.device).T)  # y = x @ PiT  =>  x = y @ PiT^T
    vi = unpack_indices(slots[..., lay.value_offset : lay.scale_offset], lay.value_bits, d).double()
    vs = bytes_to_fp16(slots[..., lay.scale_offset : lay.scale_offset + 2]).double()
    vz = bytes_to_fp16(slots[..., lay.scale_offset + 2 : lay.scale_offset + 4]).double()
    return k, vi * vs[..., None] + vz[..., None]


def gather_request_slots(kv_cache: torch.Tensor, block_row: torch.Tensor, length: int) -> torch.Tensor:
    """Slots of positions ``[0, length)`` of one request: ``uint8[length, Hk, slot]``."""
    bs = kv_cache.shape[1]
    pos = torch.arange(length, device=kv_cache.device)
    blocks = block_row.to(kv_cache.device).long()[pos // bs]
    return kv_cache[blocks, pos % bs]


# --------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------
def tq_attention_reference_varlen(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    preset: str,
    scale: float,
    centroids: torch.Tensor | None = None,
    PiT: torch.Tensor | None = None,
    fp8_e4b15: bool = False,
) -> torch.Tensor:
    """Causal attention of ``query[N, Hq, D]`` over the cache; float32 ``[N, Hq, D]``.

    Request ``r`` owns query rows ``[qsl[r], qsl[r+1])``; its last query row sits at position
    ``seq_lens[r] - 1``, so row ``i`` of a request of ``q`` rows sees ``seq_lens[r] - q + 1 + i``
    positions. Rows that see no position give zeros.
    """
    n, hq, d = query.shape
    lay = layout_for(preset, d)
    _check_cache(kv_cache, lay)
    hk = kv_cache.shape[2]
    if hq % hk:
        raise ValueError(f"query heads {hq} not a multiple of kv heads {hk}")
    g = hq // hk
    out = torch.zeros(n, hq, d, dtype=torch.float64, device=query.device)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for r in range(len(qsl) - 1):
        q0, q1 = qsl[r], qsl[r + 1]
        ql, sl = q1 - q0, int(lens[r])
        if ql <= 0 or sl <= 0:
            continue
        k, v = dequantize_slots(gather_request_slots(kv_cache, block_table[r], sl), lay, PiT, centroids, fp8_e4b15)
        k = k.to(query.device).repeat_interleave(g, dim=1)  # [L, Hq, D]
        v = v.to(query.device).repeat_interleave(g, dim=1)
        q = query[q0:q1].double()
        s = torch.einsum("thd,lhd->htl", q, k) * scale
        visible = sl - ql + 1 + torch.arange(ql, device=query.device)
        mask = torch.arange(sl, device=query.device)[None, :] < visible[:, None]  # [t, l]
        s = s.masked_fill(~mask[None], float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows seeing nothing -> 0
        out[q0:q1] = torch.einsum("htl,lhd->thd", p, v)
    return out.float()


def turboquant_verify_attention_reference(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    num_query_per_req: int,
    *,
    preset: str,
    scale: float,
    centroids: torch.Tensor | None = None,
    PiT: torch.Tensor | None = None,
    fp8_e4b15: bool = False,
    out: torch.Tensor | None = None,
    **_launch: object,
) -> torch.Tensor:
    """Uniform K+1 batch: ``query[B*(K+1), Hq, D]``, request ``b`` owns rows ``b*(K+1) ...``.

    Same signature as the Triton op (launch and workspace arguments are accepted and ignored).
    """
    n = query.shape[0]
    k1 = int(num_query_per_req)
    b = seq_lens.shape[0]
    if k1 < 1 or n != b * k1:
        raise ValueError(f"query rows {n} != num_reqs {b} x num_query_per_req {k1}")
    qsl = torch.arange(0, n + 1, k1)
    res = tq_attention_reference_varlen(
        query, kv_cache, block_table, seq_lens, qsl,
        preset=preset, scale=scale, centroids=centroids, PiT=PiT, fp8_e4b15=fp8_e4b15,
    ).to(query.dtype)
    if out is not None:
        out.copy_(res.reshape(out.shape))
        return out
    return res
