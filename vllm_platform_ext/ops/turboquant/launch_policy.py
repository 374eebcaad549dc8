"""Launch policy of the TurboQuant K+1 verify: which kernel, which tile and warp settings, how many
KV splits. Per-preset tables measured on an H200 plus shape rules on top of them. Every choice
looks at shapes only (requests, K+1, heads, row chunks), never at sequence lengths, so a CUDA graph
captured with dummy lengths keeps it. The flags ``USE_V2`` / ``USE_GLUON`` and the tables are read
at each call: tests and the tuning benchmarks change them here.
Imports only torch and Triton.
"""
from __future__ import annotations

import functools
import math

import torch
import triton

DEFAULT_MAX_KV_SPLITS = 32


@functools.lru_cache(maxsize=None)
def _cuda_properties(index: int):
    """A CUDA device's properties, read once per device: they do not change in a process, and a
    read costs 5-7 us (H200, torch 2.11); the op read them three times a call before
    (``results/gpu/2026-11-28-40-layer-c-vs-d-token-split/2026-11-28-w7-host-route.md``)."""
    return torch.cuda.get_device_properties(index)


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def device_capability(device: torch.device) -> tuple[int, int]:
    """``torch.cuda.get_device_capability(device)``, from the cached properties."""
    props = _cuda_properties(_cuda_index(device))
    return props.major, props.minor


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_properties(_cuda_index(device)).multi_processor_count
    return 132


def default_num_kv_splits(num_reqs: int, num_kv_heads: int, m_chunks: int, device: torch.device, max_splits: int) -> int:
    """Enough programs for ~2 waves; depends only on shapes (stable under CUDA graphs)."""
    progs = max(1, num_reqs * num_kv_heads * m_chunks)
    want = triton.cdiv(2 * _num_sms(device), progs)
    return int(max(1, min(max_splits, want)))


# Defaults from the H200 sweep in benchmarks/bench_turboquant.py --tune (B=64, K=3, 32K, 24/4 heads);
# any of them can be overridden per call.
LAUNCH_DEFAULTS = {
    "fp8": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 3, "GATHER": False},
    "mse": {"BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "GATHER": False},
}


def v2_num_kv_splits(num_reqs: int, num_kv_heads: int, m_chunks: int, device: torch.device, max_splits: int,
                     waves: int | None = None) -> int:
    """Split count for the word-load kernel: ~``waves`` (default V2_SPLIT_WAVES) programs per SM
    (more programs in flight hide the dependent block-table -> cache load latency); depends only
    on shapes."""
    progs = max(1, num_reqs * num_kv_heads * m_chunks)
    want = triton.cdiv((waves or V2_SPLIT_WAVES) * _num_sms(device), progs)
    return int(max(1, min(max_splits, want)))


# v2 kernel (word loads): per key type
USE_V2 = True
V2_SPLIT_WAVES = 4
V2_LAUNCH_DEFAULTS = {
    # Per preset, measured best on an H200 (B=64, K=3, 32K context, 24/4 heads, vLLM's page layout;
    # benchmarks/profile_turboquant.py sweep, numbers in results/bench/turboquant-kernels.md).
    # FP8_ASM / NIB_ASM: PTX dequant (cvt.rn.f16x2.e4m3x2 for fp8 keys on SM >= 8.9, lop3 for 4-bit
    # value nibbles); elsewhere (interpreter, SM < 8.9 fp8 keys) the portable shift/mask path runs.
    # PREFETCH: register double buffer of the next tile (helps 3-bit keys only).
    # MAX_BLOCK_M: more query rows run as row chunks of this size (chunks of one request and KV head
    # are launched next to each other and share the KV tiles through L2); WARPS_M64: num_warps
    # when BLOCK_M is 64.
    "turboquant_k8v4": {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "PREFETCH": False, "FP8_ASM": True,
                        "NIB_ASM": True, "MAX_BLOCK_M": 32},
    "turboquant_4bit_nc": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "PREFETCH": False, "NIB_ASM": True,
                           "MAX_BLOCK_M": 64},
    "turboquant_k3v4_nc": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "PREFETCH": False, "NIB_ASM": True,
                           "MAX_BLOCK_M": 64, "WARPS_M64": 8},
    "turboquant_3bit_nc": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "PREFETCH": True, "MAX_BLOCK_M": 32},
}


# Shape rules on top of V2_LAUNCH_DEFAULTS, first match wins. They look at shapes only (number of
# requests, K+1, KV heads, row chunks), never at sequence lengths, so a CUDA graph captured with
# dummy lengths keeps the right choice. "programs" = requests x KV heads x row chunks.
# Measured on an H200 (benchmarks/profile_turboquant.py grid, results/bench/2026-11-22-turboquant-tuning/SWEEP_turboquant.txt):
#  - plain decode with >= 128 programs: BLOCK_N 64, one dot's operand converted at a time
#    (ASM_SPLIT) and at most 168 registers (3 programs per SM): 1.09-1.13x at B = 32/64, 4K and 32K;
#  - small verify batches (<= 32 programs and K+1 <= 4, or <= 8 programs): BLOCK_N 64 with 3 stages:
#    1.13-1.49x at 4K context and for one request; B = 8 at 32K loses 5-7% (K+1 = 2..4; K = 5 is
#    left out: 0.82x at 32K). The split count cannot see the context length (CUDA graphs).
V2_SHAPE_RULES = {
    "turboquant_k8v4": [
        {"k1": (1, 1), "programs": (128, None), "set": {"BLOCK_N": 64, "ASM_SPLIT": True, "maxnreg": 168}},
        {"k1": (2, 4), "programs": (1, 32), "set": {"BLOCK_N": 64, "num_stages": 3}},
        {"k1": (5, None), "programs": (1, 8), "set": {"BLOCK_N": 64, "num_stages": 3}},
    ],
}


# Explicit-layout (Gluon) kernel, gluon_verify.py: where Triton has Gluon, every preset takes it instead
# of the v2 kernel (k8v4 on SM >= 8.9, which converts fp8 in hardware; the MSE presets on SM >= 8.0).
# Measured on an H200 (benchmarks/profile_turboquant.py grid results/bench/2026-11-22-turboquant-tuning/turboquant_grid_*.json, log in
# results/bench/2026-11-22-turboquant-tuning/SWEEP_turboquant.txt): one stage and at most 168 registers (3 programs per SM) is the fastest setting
# almost everywhere (k8v4 B = 64, K = 3, 32K, 24/4: 1.83 ms vs 2.09 ms with two stages, 2.44 ms for v2).
# WM x WN: warps along the rows (16 each, at most BLOCK_M/16) x along the positions. MAX_BLOCK_M: query
# rows per program (more go to row chunks). SPLIT_FIT: split-KV count from gluon_num_kv_splits (whole
# waves of 3 programs per SM: 1.05-1.2x over ~4 programs per SM on 12 of 13 grid cases).
# MSE presets: tiles staged through registers (one shared buffer), PREFETCH reads the next tile's
# block-table entries while this tile is staged (1.02-1.06x), FOLD looks 4-bit keys up in the
# symmetric codebook's positive half (1.13x at 4bit_nc B = 64, K = 3, 32K).
USE_GLUON = True
GLUON_LAUNCH_DEFAULTS = {
    "turboquant_k8v4": {"BLOCK_N": 64, "num_stages": 1, "WM": 1, "WN": 4, "maxnreg": 168, "MAX_BLOCK_M": 32,
                        "SPLIT_FIT": True, "TRANSPOSED_ROWS": 8},
    "turboquant_4bit_nc": {"BLOCK_N": 64, "num_stages": 1, "WM": 1, "WN": 4, "maxnreg": 168, "MAX_BLOCK_M": 32,
                           "PREFETCH": True, "FOLD": True, "SPLIT_FIT": True, "TRANSPOSED_ROWS": 8},
    "turboquant_k3v4_nc": {"BLOCK_N": 64, "num_stages": 1, "WM": 1, "WN": 4, "maxnreg": 168, "MAX_BLOCK_M": 32,
                           "PREFETCH": True, "FOLD": True, "SPLIT_FIT": True, "TRANSPOSED_ROWS": 8},
    "turboquant_3bit_nc": {"BLOCK_N": 64, "num_stages": 1, "WM": 1, "WN": 4, "maxnreg": 168, "MAX_BLOCK_M": 32,
                           "PREFETCH": True, "FOLD": True, "SPLIT_FIT": True, "TRANSPOSED_ROWS": 8},
}
# First match wins; shapes only (see V2_SHAPE_RULES). Programs counted with 32-row chunks.
#  - <= 8 programs (one request): two stages, no register cap: 1.08x over the default (B = 1, K = 3);
#  - K+1 >= 5 (36+ rows): all rows in one 64-row program instead of two 32-row chunks (each chunk
#    re-reads the tile), two stages: 1.10x at B = 64, 1.20x at B = 8 (32K), equal at B = 8 (4K).
#  - k8v4 K+1 = 1-4 over > 8 programs: block-table entries read one issue ahead (PREFETCH): plain decode
#    1.02-1.04x (B = 32/64, 24/4 and 16/2); K+1 = 2 1.02-1.06x, K+1 = 3-4 on the warpgroup-MMA form
#    1.03-1.05x (24/4 B = 64 32K K = 3 1.61 -> 1.54 ms; 16/2 K+1 = 4, then still on the row-major
#    kernel, 0.99x, within spread); K+1 >= 5 0.98-1.00x: off there (log S2, S3; session 6 measured the
#    row-major kernel at K = 3 0.99-1.00x).
#  - MSE presets (one shared buffer, so no stage changes): <= 8 programs: no register cap, 1.10x
#    (3bit_nc B = 1, K = 3, 32K); K+1 >= 5: one 64-row program, no cap, 1.12-1.18x (3bit_nc, 4bit_nc
#    B = 64 and B = 8 at 32K, k3v4_nc B = 8 at 4K).
#  - plain decode over >= 256 programs: register cap 80 for k8v4 (6 programs per SM); over >= 128: 128
#    for MSE (4 per SM). The split-KV programs then fit one wave instead of ~2 at 3 per SM: k8v4 24/4 B = 64 4K
#    1.05-1.06x, 32K 1.01x; 4bit_nc B = 32/64 1.04-1.07x, 3bit_nc B = 64 1.03-1.04x, k3v4_nc 1.05x. With fewer
#    programs the lower cap is slower (0.93-0.98x: k8v4 B = 32 and 16/2 B = 64, MSE B = 8).
#  - TRANSPOSED_ROWS: rows per (request, KV head) up to which the transposed kernel runs (rows as the
#    MMA's N in groups of 8): by default plain decode with GQA <= 8 (1.00-1.08x k8v4, 1.08-1.11x MSE);
#    K+1 = 6 with GQA 6 (36 rows as 32 + 8, not 64) over >= 256 programs too, no cap: 1.21x k8v4
#    (two stages), 1.28x 4bit_nc / 3bit_nc (B = 64, 32K); equal or slower at B = 8 (4K), and for 12,
#    16, 24 and 48 rows (0.66-0.95x: per-row softmax reductions across 8 lanes cost more than the
#    saved MMAs).
#  - k8v4 K+1 >= 5 over > 8 programs on Hopper (WGMMA, SM 9.0 only): the transposed kernel on
#    warpgroup MMAs for up to WG_ROWS = 48 rows (36 as 32 + 8, 48 as 32 + 16; 49-64 rows would spill),
#    two stages, no cap, one chunk of MMAs in flight (WG_DEPTH 1): 1.06-1.09x over the mma.sync
#    kernels at 24/4 (B = 64 32K, B = 32 4K), 1.11-1.13x at 16/2 B = 64, 1.22x at 24/4 B = 8 4K; with
#    these settings K+1 = 4 (24 / 32 rows) was 0.94-0.98x (it has its own, next), MSE presets at K+1 = 6
#    1.00-1.03x: off there (log Q1, Q2).
#  - k8v4 K+1 = 3-4 over > 8 programs on Hopper: the warpgroup-MMA form for up to 32 rows (24/4
#    heads: 16 + 8; 16/2 heads at K+1 = 4: one group of 32), one stage, the 168-register cap, no
#    chunk in flight (WG_DEPTH 0): 1.04-1.09x over the row-major kernel at 24 rows (24/4 B = 64 32K
#    K+1 = 4 1.78 -> 1.64 ms, K+1 = 3 1.09x; B = 8 1.05-1.07x; log R2), 1.02-1.09x at 32 rows (16/2
#    B = 64 32K 0.874 -> 0.801 ms, with PREFETCH; it lost before the row sums were folded, 0.73-0.87x:
#    log S8); 24 rows as one group of 32 0.94-0.96x; K+1 = 2 (12-16 rows) is 1-3% faster on the
#    row-major kernel (log R2).
_K5_WGMMA = {"WGMMA": True, "WG_ROWS": 48, "WG_DEPTH": 1}
_MSE_RULES = [
    {"k1": (1, None), "programs": (1, 8), "set": {"maxnreg": None}},
    {"k1": (1, 1), "programs": (128, None), "set": {"maxnreg": 128}},
    {"k1": (5, None), "programs": (256, None), "set": {"MAX_BLOCK_M": 64, "maxnreg": None, "TRANSPOSED_ROWS": 40}},
    {"k1": (5, None), "programs": (1, None), "set": {"MAX_BLOCK_M": 64, "maxnreg": None}},
]
GLUON_SHAPE_RULES = {
    "turboquant_k8v4": [
        {"k1": (1, None), "programs": (1, 8), "set": {"num_stages": 2, "maxnreg": None}},
        {"k1": (5, None), "programs": (256, None),
         "set": {"MAX_BLOCK_M": 64, "num_stages": 2, "maxnreg": None, "TRANSPOSED_ROWS": 40, **_K5_WGMMA}},
        {"k1": (5, None), "programs": (1, None),
         "set": {"MAX_BLOCK_M": 64, "num_stages": 2, "maxnreg": None, **_K5_WGMMA}},
        {"k1": (3, 4), "programs": (9, None), "set": {"WGMMA": True, "WG_ROWS": 32, "WG_DEPTH": 0, "PREFETCH": True}},
        {"k1": (1, 1), "programs": (256, None), "set": {"PREFETCH": True, "maxnreg": 80}},
        {"k1": (1, 2), "programs": (9, None), "set": {"PREFETCH": True}},
    ],
    "turboquant_4bit_nc": _MSE_RULES,
    "turboquant_k3v4_nc": _MSE_RULES,
    "turboquant_3bit_nc": _MSE_RULES,
}


def gluon_ctas_per_sm(cfg: dict, rows: int = 32, key_fp8: bool = True) -> int:
    """Programs of the Gluon kernel one SM holds at once: the fewest that its register cap (no cap:
    assume 255) and warps allow (168 registers x 4 warps -> 3) and that its shared memory allows
    (``gluon_shared_bytes`` per program, 228 KB per SM, 1 KB reserved per program)."""
    regs = cfg.get("maxnreg") or 255
    warps = cfg["WM"] * cfg["WN"]
    by_regs = 65536 // (regs * 32 * warps)
    by_smem = (228 * 1024) // (gluon_shared_bytes(cfg, rows, key_fp8) + 1024)
    return max(1, min(by_regs, by_smem, 64 // warps))


def gluon_shared_bytes(cfg: dict, rows: int, key_fp8: bool) -> int:
    """Shared memory of one Gluon program (at most 1 KB over what the compiler allocates) holding
    ``rows`` query rows (padded as the kernel pads them): per stage, a tile of key words (64 per
    position for fp8, 32 for index words), 32 value words and the scale/zero word (plus the key
    norm for MSE); the fp16 query [rows, 256] and the softmax weights [rows, BLOCK_N]."""
    bn = cfg["BLOCK_N"]
    stage = bn * ((64 if key_fp8 else 33) + 32 + 1) * 4
    return cfg["num_stages"] * stage + rows * 512 + rows * bn * 2 + 1024


def gluon_num_kv_splits(programs: int, device: torch.device, max_splits: int, ctas_per_sm: int,
                        min_fill: float = 0.85) -> int:
    """Split count that fills whole waves: the smallest s whose programs x s make at least ~one wave
    of the GPU's program slots (SMs x ctas_per_sm) and fill their last wave to ``min_fill``. A split
    count that leaves a last wave mostly empty costs that whole wave (H200, k8v4 plain decode 16/2,
    B = 64, 32K: 5 splits = 1.6 waves 0.895 ms, 3 splits = 0.97 waves 0.750 ms). Shapes only."""
    slots = _num_sms(device) * ctas_per_sm
    for s in range(1, max_splits + 1):
        w = programs * s / slots
        if w >= 0.9 and w / math.ceil(w) >= min_fill:
            return s
    return int(max(1, min(max_splits, triton.cdiv(slots, max(1, programs)))))


# One request: where the programs at the usual split cap (DEFAULT_MAX_KV_SPLITS) fill at most half
# of the SMs (16/2 heads: 2 programs x 32 splits on 132 SMs) and a program holds at most
# SMALL_BATCH_MAX_ROWS rows, up to SMALL_BATCH_MAX_SPLITS splits, but none shorter than
# SMALL_BATCH_MIN_TILES tiles (or than the usual split, when that is shorter): 16K and 32K contexts
# spread over twice the SMs, 4K and 8K keep their splits. H200, 16/2 heads, B = 1, K = 0-3: 32K
# 1.25-1.44x, 16K 1.06-1.21x; 48-row programs (K+1 = 6) and 4 programs (24/4 heads) lose with more
# splits (results/bench/2026-11-22-turboquant-tuning/SWEEP_turboquant.txt, T1).
SMALL_BATCH_MAX_SPLITS = 64
SMALL_BATCH_MIN_TILES = 4
SMALL_BATCH_MAX_ROWS = 32


def gluon_split_plan(programs: int, device: torch.device, max_splits: int, ctas_per_sm: int, capacity: int,
                     rows: int) -> tuple[int, int]:
    """(split count, fewest tiles per split) of the Gluon kernels for ``programs`` (request, KV head,
    row chunk) programs of ``rows`` query rows each: ``gluon_num_kv_splits`` under ``max_splits``,
    one tile minimum; but where ``programs x DEFAULT_MAX_KV_SPLITS`` programs would fill at most half
    of the SMs and ``rows <= SMALL_BATCH_MAX_ROWS``, SMALL_BATCH_MAX_SPLITS splits (no more than
    ``capacity``, the splits the workspace holds for this call) of at least
    min(SMALL_BATCH_MIN_TILES, the tiles of a DEFAULT_MAX_KV_SPLITS split) tiles each
    (:func:`split_tiles`). Shapes only (stable under CUDA graphs)."""
    if programs * DEFAULT_MAX_KV_SPLITS <= _num_sms(device) // 2 and rows <= SMALL_BATCH_MAX_ROWS:
        splits = max(max_splits, min(SMALL_BATCH_MAX_SPLITS, capacity))
        if splits > DEFAULT_MAX_KV_SPLITS:
            return splits, SMALL_BATCH_MIN_TILES
    return gluon_num_kv_splits(programs, device, max_splits, ctas_per_sm), 1


def split_tiles(seq_len: int, num_splits: int, block_n: int, min_tiles: int = 1) -> int:
    """Tiles per split of a request of ``seq_len`` positions, as the kernels compute it: the length
    cut in ``num_splits`` whole-tile parts; with ``min_tiles`` > 1 no fewer than min(min_tiles, the
    tiles of a DEFAULT_MAX_KV_SPLITS split). Split s holds positions [s, s + 1) x tiles x block_n."""
    tiles = triton.cdiv(triton.cdiv(seq_len, num_splits), block_n)
    if min_tiles > 1:
        tiles = max(tiles, min(min_tiles, triton.cdiv(triton.cdiv(seq_len, DEFAULT_MAX_KV_SPLITS), block_n)))
    return tiles


def _apply_rules(cfg: dict, rules, num_reqs: int, num_kv_heads: int, k1: int, m_chunks: int) -> dict:
    progs = num_reqs * num_kv_heads * m_chunks

    def within(x, bounds):
        lo, hi = bounds
        return x >= lo and (hi is None or x <= hi)

    for rule in rules:
        if within(k1, rule["k1"]) and within(progs, rule["programs"]):
            cfg.update(rule["set"])
            break
    return cfg


def gluon_launch_config(preset: str, num_reqs: int, num_kv_heads: int, k1: int, m_chunks: int) -> dict | None:
    """Launch settings of the Gluon kernel for this shape, or None when the preset has none."""
    if not USE_GLUON or preset not in GLUON_LAUNCH_DEFAULTS:
        return None
    return _apply_rules(dict(GLUON_LAUNCH_DEFAULTS[preset]), GLUON_SHAPE_RULES.get(preset, ()), num_reqs,
                        num_kv_heads, k1, m_chunks)


def v2_launch_config(preset: str, num_reqs: int, num_kv_heads: int, k1: int, m_chunks: int) -> dict:
    """Launch settings of the word-load kernel for this shape: the preset's table entry with the
    first matching V2_SHAPE_RULES entry applied."""
    return _apply_rules(dict(V2_LAUNCH_DEFAULTS[preset]), V2_SHAPE_RULES.get(preset, ()), num_reqs, num_kv_heads,
                        k1, m_chunks)


def _launch_config(rows: int, key_fp8: bool) -> dict:
    block_m = max(16, min(64, triton.next_power_of_2(rows)))
    return {"BLOCK_M": block_m, **LAUNCH_DEFAULTS["fp8" if key_fp8 else "mse"]}


@functools.lru_cache(maxsize=256)
def transposed_row_groups(rows: int) -> tuple[int, int]:
    """Row groups (RA, RB) of the transposed Gluon kernel for ``rows`` query rows per (request, KV
    head): powers of two (RB may be 0) covering ``rows`` rounded up to a multiple of 8, e.g. 6 -> (8, 0),
    24 -> (16, 8), 36 -> (32, 8), 48 -> (32, 16), 56 -> (32, 32)."""
    if not 1 <= rows <= 64:
        raise ValueError(f"the transposed kernel takes 1..64 rows per KV head, got {rows}")
    r8 = 8 * triton.cdiv(rows, 8)
    ra = 1 << (r8.bit_length() - 1)
    rb = r8 - ra
    return ra, (triton.next_power_of_2(rb) if rb else 0)
