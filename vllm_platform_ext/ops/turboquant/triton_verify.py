"""Triton K+1 speculative-verify attention over a TurboQuant KV cache.

One program per (request, KV head, KV split[, row chunk]) reads each compressed KV tile once
and serves all ``(K+1) x GQA`` query rows of that request and KV head with tensor-core dots:

* rows ``m = t*G + g`` (query token ``t`` of the request, head ``g`` of the KV group) padded
  to a power of two (>= 16) and masked, so any GQA group (6, ...) and any K+1 (6, ...) work;
* in-chunk causal mask: row ``t`` sees positions ``< seq_len - (K+1) + 1 + t``;
* keys: fp8 bytes widened exactly to fp16 (k8v4), or Lloyd-Max indices -> centroids
  (rounded once to fp16) scored against the fp32-rotated query (rounded once to fp16), with
  the fp16 norm and the norm correction applied per token in fp32;
* values: indices (exact in fp16) times softmax weights pre-multiplied by the per-token
  scale (normalised by the tile's largest scale, so no fp16 underflow), zero points in fp32;
* split-KV with a fixed split count (graph-safe), combined by a second kernel; rows that see
  no position (captured dummy metadata, padded requests) give zeros, never NaN.

This module is the public op: it checks the arguments, picks the kernel and its launch settings
(:mod:`.launch_policy`) and launches it. The kernels live in :mod:`.kernels_v1` (byte loads, and the
split combine), :mod:`.kernels_v2` (word loads) and :mod:`.gluon_verify` (explicit layouts); the
scratch in :class:`~.workspace.VerifyWorkspace`, sized ``max_num_seqs x (K+1)`` rows and allocated
outside CUDA-graph capture; the Gluon codebook tables in :mod:`.codebook`. Which kernel a call took
is seen through :func:`trace_launches` (tests, profiling). Imports only torch and Triton.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

import torch
import triton

from vllm_platform_ext.ops.turboquant import launch_policy as policy
from vllm_platform_ext.ops.turboquant.codebook import _codebook_tables
from vllm_platform_ext.ops.turboquant.byte_kernels import _tq_verify_stage1, _tq_verify_stage2
from vllm_platform_ext.ops.turboquant.word_kernels import _tq_verify_v2
from vllm_platform_ext.ops.turboquant.layout import layout_for
from vllm_platform_ext.ops.turboquant.workspace import VerifyWorkspace, _workspace_view, workspace_splits

__all__ = ["turboquant_verify_attention", "VerifyWorkspace", "Launch", "trace_launches", "describe_kernels",
           "gluon_query_order"]

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Launch:
    """What one call launched: its stage-1 kernel ("gluon_k8v4", "gluon_mse", "gluon_t_*",
    "gluon_wg_k8v4", "v2" or "v1"), its KV split count and the fewest tiles per split."""

    kernel: str
    splits: int
    min_tiles: int

    @property
    def plan(self) -> tuple[int, int]:
        return self.splits, self.min_tiles


_TRACE: list[Launch] | None = None  # set only inside trace_launches()


@contextlib.contextmanager
def trace_launches() -> Iterator[list[Launch]]:
    """Debug hook: a list that receives a :class:`Launch` for every call made inside the block
    (tests and profiling read which kernel and split plan a shape took). Host-side only, so it also
    records the launch of a call being captured into a CUDA graph. Nests: the outer list is kept."""
    global _TRACE
    outer, _TRACE = _TRACE, []
    try:
        yield _TRACE
    finally:
        if outer is not None:
            outer.extend(_TRACE)
        _TRACE = outer


def _record(kernel: str, splits: int, min_tiles: int) -> None:
    if _TRACE is not None:
        _TRACE.append(Launch(kernel, int(splits), int(min_tiles)))


def _default_e4b15(device: torch.device) -> bool:
    return device.type == "cuda" and policy.device_capability(device) < (8, 9)


def turboquant_verify_attention(
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
    fp8_e4b15: bool | None = None,
    workspace: VerifyWorkspace | None = None,
    out: torch.Tensor | None = None,
    num_kv_splits: int | None = None,
    BLOCK_M: int | None = None,
    BLOCK_N: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    GATHER: bool | None = None,
    gluon: bool | None = None,
    inline_ptx: bool | None = None,
) -> torch.Tensor:
    """Attention of a uniform K+1 batch over a TurboQuant cache.

    query ``[B*(K+1), Hq, D]`` (request ``b`` owns rows ``b*(K+1) .. b*(K+1)+K``, in order);
    kv_cache ``uint8[num_blocks, block_size, Hk, slot]`` (any strides); block_table
    ``int32[>=B, max_blocks]``; seq_lens ``int32[B]`` (context length including the K+1 new
    tokens, which must already be stored). Returns ``[B*(K+1), Hq, D]`` in query dtype
    (written into ``out`` when given). ``num_query_per_req = 1`` is plain decode.
    ``gluon=False`` keeps every preset on the Triton kernel (None: the Gluon kernel where it can run).
    ``inline_ptx=False`` keeps the v2 kernel off its inline-PTX dequant paths (None: on a CUDA
    device); MetaX's op config sets both False: its Triton builds (3.0 / 3.6) lower to MACA, which
    has no PTX, and have no Gluon.
    """
    if query.dim() != 3:
        raise ValueError(f"query must be [tokens, num_q_heads, head_dim], got shape {tuple(query.shape)}")
    n, hq, d = query.shape
    lay = layout_for(preset, d)
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"query dtype {query.dtype} unsupported (float16, bfloat16, float32)")
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 4:
        raise ValueError(
            f"kv_cache must be uint8[num_blocks, block_size, num_kv_heads, slot], got {kv_cache.dtype} {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[3] < lay.slot_size:
        raise ValueError(f"kv_cache slot {kv_cache.shape[3]} B < {preset} slot {lay.slot_size} B at head dim {d}")
    hk = kv_cache.shape[2]
    if hq % hk:
        raise ValueError(f"num_q_heads {hq} is not a multiple of num_kv_heads {hk}")
    k1 = int(num_query_per_req)
    b = seq_lens.shape[0]
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be int32[num_reqs], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if k1 < 1 or n != b * k1:
        raise ValueError(f"query rows {n} != num_reqs {b} x num_query_per_req {k1} (batch is not uniform)")
    if block_table.dim() != 2 or block_table.dtype != torch.int32 or block_table.shape[0] < b:
        raise ValueError(f"block_table must be int32[>= {b}, max_blocks], got {block_table.dtype} {tuple(block_table.shape)}")
    if query.stride(2) != 1 or kv_cache.stride(3) != 1 or block_table.stride(1) != 1:
        raise ValueError("query, kv_cache and block_table need a contiguous last dimension")
    dev = query.device
    for name, t in (("kv_cache", kv_cache), ("block_table", block_table), ("seq_lens", seq_lens)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, query on {dev}")

    if lay.key_fp8:
        q_in = query
        cent = kv_cache  # unused by the fp8 path; any pointer will do
    else:
        if PiT is None or centroids is None:
            raise ValueError(f"{preset}: MSE keys need PiT [D, D] and centroids [{2 ** lay.key_bits}]")
        if tuple(PiT.shape) != (d, d):
            raise ValueError(f"PiT must be [{d}, {d}], got {tuple(PiT.shape)}")
        if centroids.numel() != 2**lay.key_bits or centroids.dtype != torch.float32:
            raise ValueError(
                f"{preset}: centroids must be float32[{2 ** lay.key_bits}], got {centroids.dtype} {tuple(centroids.shape)}"
            )
        q_in = query.float() @ PiT.float()
        cent = centroids.contiguous()
    if fp8_e4b15 is None:
        fp8_e4b15 = _default_e4b15(dev)

    rows = k1 * (hq // hk)
    cfg = policy._launch_config(rows, lay.key_fp8)
    kv16, kv32 = _word_views(kv_cache) if (policy.USE_V2 and d >= 64) else (None, None)
    max_block_m = policy.V2_LAUNCH_DEFAULTS[preset].get("MAX_BLOCK_M", 64) if kv16 is not None else 64
    gcfg = None
    if kv16 is not None and gluon is not False and _gluon_usable(lay, kv32, bool(fp8_e4b15), dev, d):
        gcfg = policy.gluon_launch_config(preset, b, hk, k1, triton.cdiv(rows, min(cfg["BLOCK_M"], 32)))
        if gcfg is not None:  # (a fresh dict:) the caller's tile and stage overrides, resolved once
            gcfg.update(BLOCK_N=BLOCK_N or gcfg["BLOCK_N"], num_stages=num_stages or gcfg["num_stages"])
            max_block_m = gcfg.get("MAX_BLOCK_M", max_block_m)
    block_m = BLOCK_M or min(cfg["BLOCK_M"], max_block_m)
    block_n = BLOCK_N or cfg["BLOCK_N"]
    m_chunks = triton.cdiv(rows, block_m)
    max_splits = workspace.max_kv_splits if workspace is not None else policy.DEFAULT_MAX_KV_SPLITS
    if workspace is not None:
        mid = workspace.mid
        if mid.device != dev or mid.dtype != torch.float32:
            raise ValueError(f"workspace must be float32 on {dev}, got {mid.dtype} on {mid.device}")
    min_tiles = 1  # fewest tiles per split (Gluon kernels; the others always split by 1)
    v2 = policy.v2_launch_config(preset, b, hk, k1, m_chunks) if kv16 is not None else {}
    # up to TRANSPOSED_ROWS rows per (request, KV head): the transposed Gluon kernel (rows as the MMA's N);
    # on Hopper with WGMMA, up to WG_ROWS rows its warpgroup-MMA form (M = the tile's positions: a multiple of 64)
    wg = (gcfg is not None and bool(gcfg.get("WGMMA")) and gcfg["BLOCK_N"] % 64 == 0
          and _wgmma_ok(dev))
    trans_rows = max(gcfg.get("TRANSPOSED_ROWS", 8), gcfg.get("WG_ROWS", 0) if wg else 0) if gcfg is not None else 0
    trans = gcfg is not None and rows <= min(64, trans_rows)
    if gcfg is not None and gcfg.get("SPLIT_FIT") and not gcfg.get("SPLIT_WAVES"):
        prog_rows = sum(policy.transposed_row_groups(rows)) if trans else block_m
        ctas = policy.gluon_ctas_per_sm(gcfg, prog_rows, lay.key_fp8)
        if num_kv_splits:
            splits = num_kv_splits
        else:
            capacity = workspace_splits(mid, n, hq, d) if workspace is not None else policy.SMALL_BATCH_MAX_SPLITS
            splits, min_tiles = policy.gluon_split_plan(b * hk * (1 if trans else m_chunks), dev, max_splits, ctas,
                                                 capacity, prog_rows)
    elif kv16 is not None:
        waves = (gcfg or v2).get("SPLIT_WAVES")
        splits = num_kv_splits or policy.v2_num_kv_splits(b, hk, m_chunks, dev, max_splits, waves)
    else:
        splits = num_kv_splits or policy.default_num_kv_splits(b, hk, m_chunks, dev, max_splits)

    if workspace is None:
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("turboquant_verify_attention: allocate a VerifyWorkspace before CUDA-graph capture")
        mid = torch.empty(n, hq, splits, d + 1, dtype=torch.float32, device=dev)
    else:
        mid = _workspace_view(mid, n, hq, splits, d)
    if out is None:
        out = torch.empty(n, hq, d, dtype=query.dtype, device=dev)
    elif tuple(out.shape) != (n, hq, d) or out.stride(2) != 1:
        raise ValueError(f"out must be [{n}, {hq}, {d}] with a contiguous last dim, got {tuple(out.shape)}")
    if n == 0:
        return out

    if kv16 is not None and gcfg is None:  # the v2 kernel's launch values
        if BLOCK_N:
            v2["BLOCK_N"] = BLOCK_N
        if block_m >= 64 and "WARPS_M64" in v2:
            v2["num_warps"] = v2["WARPS_M64"]
        cent16 = cent.to(torch.float16) if not lay.key_fp8 else kv16
        asm_ok = dev.type == "cuda" and not _interpreting() and inline_ptx is not False
        fp8_asm = bool(v2.get("FP8_ASM", False) and asm_ok and lay.key_fp8 and kv32 is not None and not fp8_e4b15
                       and policy.device_capability(dev) >= (8, 9))
        nib_asm = bool(v2.get("NIB_ASM", False) and asm_ok and lay.value_bits == 4)
        key_scale = 1.0 if (not lay.key_fp8 or fp8_e4b15 or fp8_asm) else 256.0
    if gcfg is not None:  # (only set with the word views)
        from vllm_platform_ext.ops.turboquant import gluon_verify as GV

        kernel = ("gluon_wg_" if trans and wg else "gluon_t_" if trans else "gluon_") + (
            "k8v4" if lay.key_fp8 else "mse")
        # the kernels read the query as it is: scaled by softmax scale * log2(e) (keys decoded exactly),
        # converted to fp16 and put in the key decodes' head-dim order (gluon_query_order) in-kernel
        wm = min(gcfg["WM"], block_m // 16)  # warps along the rows (16 each) x along the positions
        wn = gcfg["WN"]
        if lay.key_fp8:
            kv, lut, units = kv32, kv32, 4  # (no codebook: any pointer for LUT)
            key_args = dict(PREFETCH=bool(gcfg.get("PREFETCH", False)))
        else:
            lut, fold = _codebook_tables(cent, lay.key_bits, gcfg.get("FOLD", True))
            kv, units = kv16, 2
            key_args = dict(KEY_BITS=lay.key_bits, VAL_BITS=lay.value_bits, NORM_W=lay.mse_bytes // 2,
                       NORM_CORRECTION=lay.norm_correction, PREFETCH=bool(gcfg.get("PREFETCH", False)), FOLD=fold)
        args = (q_in, kv, block_table, seq_lens, lut, mid,
                q_in.stride(0), q_in.stride(1),
                kv.stride(0), kv.stride(1), kv.stride(2),
                block_table.stride(0),
                mid.stride(0), mid.stride(1), mid.stride(2),
                float(scale) * _LOG2E, k1, splits)
        common = dict(G=hq // hk, PAGE=kv_cache.shape[1], BLOCK_N=gcfg["BLOCK_N"],
                      VAL_W=lay.key_packed_size // units, SZ_W=lay.scale_offset // units,
                      STAGES=gcfg["num_stages"], MIN_TILES=min_tiles, BASE_SPLITS=policy.DEFAULT_MAX_KV_SPLITS, **key_args,
                      **({"maxnreg": gcfg["maxnreg"]} if gcfg.get("maxnreg") else {}))
        if trans:  # every warp along the positions (WG: one warpgroup on Hopper MMAs)
            ra, rb = policy.transposed_row_groups(rows)
            nw = 4 if wg else gcfg["WM"] * wn
            wg_args = dict(WG=True, WG_DEPTH=gcfg.get("WG_DEPTH", 1)) if wg else {}
            GV._tq_verify_t_gluon[(hk, b, splits)](*args, RA=ra, RB=rb, NW=nw, num_warps=nw, **wg_args, **common)
        else:
            GV._tq_verify_gluon[(hk * m_chunks, b, splits)](*args, BLOCK_M=block_m, M_CHUNKS=m_chunks, WM=wm, WN=wn,
                                                            num_warps=wm * wn, **common)
    elif kv16 is not None:
        kernel = "v2"
        _tq_verify_v2[(hk * m_chunks, b, splits)](
            q_in, kv16, kv32 if (lay.key_fp8 and kv32 is not None) else kv16, block_table, seq_lens, cent16, mid,
            q_in.stride(0), q_in.stride(1),
            kv16.stride(0), kv16.stride(1), kv16.stride(2),
            block_table.stride(0),
            mid.stride(0), mid.stride(1), mid.stride(2),
            float(scale) * _LOG2E * key_scale,
            k1, splits,
            G=hq // hk, BLOCK_M=block_m, M_CHUNKS=m_chunks,
            D=d, PAGE=kv_cache.shape[1], BLOCK_N=v2["BLOCK_N"],
            KEY_FP8=lay.key_fp8, KEY_W32=bool(lay.key_fp8 and kv32 is not None), KEY_BITS=lay.key_bits,
            NORM_W=lay.mse_bytes // 2, NORM_CORRECTION=lay.norm_correction, VAL_BITS=lay.value_bits,
            VAL_W=lay.key_packed_size // 2, SZ_W=lay.scale_offset // 2, PREFETCH=bool(v2["PREFETCH"]),
            FP8_ASM=fp8_asm, NIB_ASM=nib_asm, ASM_SPLIT=bool(v2.get("ASM_SPLIT", False)),
            num_warps=num_warps or v2["num_warps"], num_stages=num_stages or v2["num_stages"],
            **({"maxnreg": v2["maxnreg"]} if v2.get("maxnreg") and asm_ok else {}),
        )
    else:
        kernel = "v1"
        _launch_v1(q_in, kv_cache, block_table, seq_lens, cent, mid, scale, k1, splits, hq, hk, block_m, m_chunks,
                   d, block_n, lay, fp8_e4b15, cfg, GATHER, num_warps, num_stages)
    _record(kernel, splits, min_tiles)
    _tq_verify_stage2[(n, hq)](
        mid, out,
        mid.stride(0), mid.stride(1), mid.stride(2),
        out.stride(0), out.stride(1),
        splits,
        D=d, S_POW2=triton.next_power_of_2(splits),
        SPLIT4=bool(gcfg is not None or (kv16 is not None and lay.value_bits == 4)),  # Gluon: always split
        num_warps=4 if d >= 256 else 2,
    )
    return out


def gluon_query_order(q: torch.Tensor) -> torch.Tensor:
    """The query [n, heads, 256] with its head dim in the Gluon kernels' order: column
    ``m * 64 + 16 c + r`` (sub-tile m, 16-wide chunk c, MMA k-row r = 2t + i + 8h; the operand
    layout gives a thread the register pairs of k-rows 2t + 8h, 2t + 8h + 1) holds the element that
    the key decodes pair with it, 4 (16c + 2t + 8h + m // 2) + 2 (m % 2) + i, for both key kinds:

    * fp8 keys (``ptx.FP8W``): k-row 2t + 8h + i reads key word 16c + 2t + 8h + i, and sub-tile m
      takes bytes 2 (m % 2), +1 of word 16c + 2t + 8h + m // 2;
    * MSE index words (``ptx.LUT8W`` ...): k-rows 2t + 8h, +1 read staged word w = 8c + t + 4h
      (halfwords 2w, 2w + 1; halfword j holds elements 4j..4j+3), and sub-tile m takes nibbles
      2 (m % 2), +1 of its halfword m // 2.

    In digits, element (c, h, t, m // 2, m % 2, i) goes to column (m // 2, m % 2, c, h, t, i): one
    permuting copy. The kernels build this order themselves while loading the query
    (``gluon_verify._load_query``: column j of sub-tile e reads element 8 (j // 2) + 2 e + j % 2);
    this is its host-side definition, for tests and tools."""
    n, hq, d = q.shape
    if d != 256:
        raise ValueError(f"the Gluon kernels' query order is defined for head dim 256, got {d}")
    return q.reshape(n, hq, 4, 2, 4, 2, 2, 2).permute(0, 1, 5, 6, 2, 3, 4, 7).reshape(n, hq, d)


def _word_views(kv_cache: torch.Tensor):
    """(int16 view, int32 view or None) of the byte cache, or (None, None) when the slots are
    not 2-byte aligned (then the byte-load kernel runs)."""
    if kv_cache.device.type != "cuda" and not _interpreting():
        return None, None
    try:
        kv16 = kv_cache.view(torch.int16)
    except RuntimeError:
        return None, None
    if kv16.data_ptr() % 2:
        return None, None
    try:
        kv32 = kv_cache.view(torch.int32)
        if kv32.data_ptr() % 4:
            kv32 = None
    except RuntimeError:
        kv32 = None
    return kv16, kv32


def describe_kernels() -> list[tuple[str, str, str]]:
    """(preset, stage-1 kernel a head-dim-256 call on this process's GPU takes, why) for doctor.
    Per call the slots' alignment and the fp8 flavour can still send k8v4 to the v2 kernel."""
    from vllm_platform_ext.ops.dispatch import active_platform

    if active_platform() == "maca":
        why = ("MetaX: Triton kernel (op config gluon=False, inline_ptx=False): MetaX's Triton (3.0 on "
               "vLLM-metax v0.23, 3.6 elsewhere) lowers to MACA, which has no PTX, and has no Gluon")
        return [(preset, "v2 (v1 where slots are byte-aligned)", why) for preset in policy.V2_LAUNCH_DEFAULTS]
    has_gluon = _gluon_available()
    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    rows = []
    for preset in policy.V2_LAUNCH_DEFAULTS:
        fp8 = layout_for(preset, 256).key_fp8
        name, need = ("gluon_k8v4", (8, 9)) if fp8 else ("gluon_mse", (8, 0))
        if not (policy.USE_GLUON and preset in policy.GLUON_LAUNCH_DEFAULTS):
            rows.append((preset, "v2", "no Gluon kernel for this preset" if policy.USE_GLUON else "launch_policy.USE_GLUON is off"))
        elif not has_gluon:
            rows.append((preset, "v2", "this Triton has no Gluon"))
        elif cap is None:
            rows.append((preset, f"{name} on SM >= {need[0]}.{need[1]}", "no CUDA device in this process"))
        elif cap < need:
            why = "no hardware fp8 conversion" if fp8 else "no mma.sync / ldmatrix"
            rows.append((preset, "v2", f"SM {cap[0]}.{cap[1]} < {need[0]}.{need[1]}: {why}"))
        else:
            wg = cap == (9, 0) and any(r["set"].get("WGMMA") for r in policy.GLUON_SHAPE_RULES.get(preset, ()))
            rows.append((preset, name, f"Gluon, SM {cap[0]}.{cap[1]}; <= 8 query rows per KV head (and 33-40 "
                                       "over >= 256 programs): transposed (gluon_t)"
                                       + ("; by shape rule (WGMMA): transposed on warpgroup MMAs (gluon_wg)"
                                          if wg else "")
                                       + ("; e4b15 keys or 2-byte-aligned slots: v2" if fp8 else "")))
    return rows


def _gluon_usable(lay, kv32, fp8_e4b15: bool, dev: torch.device, d: int) -> bool:
    """The Gluon kernel can serve this call: head dim 256 on a CUDA GPU with Gluon present, and
    either fp8 (e4nv) keys with 4-byte-aligned slots on SM >= 8.9 (hardware fp8 conversion), or
    MSE keys (2-byte-aligned slots suffice) on SM >= 8.0 (mma.sync, ldmatrix, prmt)."""
    if not (d == 256 and dev.type == "cuda" and _gluon_ok()):
        return False
    cap = policy.device_capability(dev)
    if lay.key_fp8:
        return bool(lay.value_bits == 4 and kv32 is not None and not fp8_e4b15 and cap >= (8, 9))
    return cap >= (8, 0)


def _wgmma_ok(dev: torch.device) -> bool:
    """Hopper warpgroup MMAs (``_tq_verify_t_gluon`` with WG): SM 9.0 only, not under the interpreter."""
    return dev.type == "cuda" and not _interpreting() and policy.device_capability(dev) == (9, 0)


def _gluon_available() -> bool:
    """This Triton has Gluon (gluon_verify imports and defines its kernel)."""
    try:
        from vllm_platform_ext.ops.turboquant import gluon_verify as GV
    except Exception:  # noqa: BLE001
        return False
    return GV.AVAILABLE


def _gluon_ok() -> bool:
    """Gluon is here and we are not under the interpreter, which cannot run it."""
    return _gluon_available() and not _interpreting()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _launch_v1(q_in, kv_cache, block_table, seq_lens, cent, mid, scale, k1, splits, hq, hk, block_m, m_chunks,
               d, block_n, lay, fp8_e4b15, cfg, GATHER, num_warps, num_stages):
    b = seq_lens.shape[0]
    _tq_verify_stage1[(b, hk * m_chunks, splits)](
        q_in, kv_cache, block_table, seq_lens, cent, mid,
        q_in.stride(0), q_in.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        block_table.stride(0),
        mid.stride(0), mid.stride(1), mid.stride(2),
        float(scale) * _LOG2E,
        k1, splits,
        G=hq // hk, BLOCK_M=block_m, M_CHUNKS=m_chunks,
        D=d, PAGE=kv_cache.shape[1], BLOCK_N=block_n,
        KEY_FP8=lay.key_fp8, FP8_E4B15=bool(fp8_e4b15), KEY_BITS=lay.key_bits, MSE_BYTES=lay.mse_bytes,
        NORM_CORRECTION=lay.norm_correction, VAL_BITS=lay.value_bits, KPS=lay.key_packed_size,
        VAL_DATA_BYTES=lay.value_data_bytes,
        GATHER=cfg["GATHER"] if GATHER is None else bool(GATHER),
        num_warps=num_warps or cfg["num_warps"], num_stages=num_stages or cfg["num_stages"],
    )
