"""GPU tests of the TurboQuant K+1 verify kernel (run on the GPU machine).

Against a float64 dequantize-then-attend reference (``reference.py``) and against vLLM's own
Triton store/decode kernels, loaded without vLLM from the files named by ``VLLM_TQ_SRC``
(``.carry/vllm_tq``: copies from the vLLM 0.32 wheel) or from an installed vLLM.

``python tests/ops/test_turboquant_gpu.py --sanitize`` runs a small sweep meant for
``compute-sanitizer`` (every preset, K+1 in {1, 4, 6}, GQA 6 and 8, split-KV, padding rows).
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

from vllm_platform_ext.ops.turboquant import layout as L
from vllm_platform_ext.ops.turboquant import reference as R
from vllm_platform_ext.ops.turboquant import triton_verify as TV
from vllm_platform_ext.ops.turboquant import launch_policy as LP

pytestmark = pytest.mark.gpu

_TRACE: list = []


@pytest.fixture(autouse=True)
def _launches():
    """Every launch of the op in a test, through its debug hook (TV.trace_launches)."""
    with TV.trace_launches() as rec:
        _TRACE[:] = [rec]
        yield rec
    _TRACE.clear()


def last_launch() -> TV.Launch:
    """What the op's last call in this test launched (kernel, split plan)."""
    return _TRACE[0][-1]


PRESETS = list(L.PRESETS)
D = 256
PAGE = 16


def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture(scope="module")
def upstream():
    _need_cuda()
    from vllm_platform_ext.testing import turboquant_upstream

    return turboquant_upstream.load(os.environ.get("VLLM_TQ_SRC"))


def _tables(preset: str, dev="cuda"):
    lay = L.layout_for(preset, D)
    return lay, L.lloyd_max_centroids(D, lay.centroid_bits).to(dev), L.hadamard(D, dev)


def make_cache(preset, seq_lens, hk, *, dev="cuda", seed=0, e4b15=False, store=None, layout="head"):
    """Random K/V stored (reference store unless ``store`` given) into a cache whose pages are
    head-major (``layout="head"``) or vLLM 0.32's LBNHC ``[block, position, kv head, slot]``
    (``layout="vllm"``, what its TurboQuant backend hands the kernels).

    Returns (cache view [nb, PAGE, hk, slot], block_table int32 [B, max_blocks]).
    """
    g = torch.Generator(device="cpu").manual_seed(seed)
    lay, cent, H = _tables(preset, dev)
    nblk = [(s + PAGE - 1) // PAGE for s in seq_lens]
    total = sum(nblk) + 1
    if layout == "line":
        view = line_cache_view(preset, total, hk, dev)
    elif layout == "vllm":
        view = torch.zeros(total, PAGE, hk, lay.slot_size_aligned, dtype=torch.uint8, device=dev)
    else:
        view = torch.zeros(total, hk, PAGE, lay.slot_size_aligned, dtype=torch.uint8, device=dev).transpose(1, 2)
    perm = torch.randperm(total - 1, generator=g) + 1  # block 0 stays the null block
    bt = torch.zeros(len(seq_lens), max(max(nblk), 1), dtype=torch.int32)
    o = 0
    for r, nb in enumerate(nblk):
        bt[r, :nb] = perm[o : o + nb].int()
        o += nb
    bt = bt.to(dev)
    for r, s in enumerate(seq_lens):
        if s == 0:
            continue
        k = (torch.randn(s, hk, D, generator=g) * (0.3 if e4b15 else 1.5)).to(dev, torch.bfloat16)
        v = torch.randn(s, hk, D, generator=g).to(dev, torch.bfloat16)
        pos = torch.arange(s, device=dev)
        slots = (bt[r].long()[pos // PAGE] * PAGE + pos % PAGE).int()
        if store is None:
            R.tq_store_reference(k, v, view, slots, preset, PiT=H, centroids=cent, fp8_e4b15=e4b15)
        else:
            store(k, v, view, slots)
    return view, bt


def line_cache_view(preset, num_blocks, hk, dev="cuda"):
    """A cache allocated as the installed vLLM line allocates it (its backend's
    ``get_kv_cache_shape``; from 0.29 the LBNHC memory behind the logical [B, H, N, C] view), seen
    as the op's [blocks, block_size, heads, slot] through the layout probed from that backend."""
    # the GPU machine runs these beside the line under test: a missing backend is a failure, not a skip
    import vllm.v1.attention.backends.turboquant_attn as tq
    from vllm_platform_ext.patch.turboquant import cache_view

    backend = tq.TurboQuantAttentionBackend
    slot = L.layout_for(preset, D).slot_size_aligned
    try:
        shape = backend.get_kv_cache_shape(num_blocks, PAGE, hk, D, cache_dtype_str=preset)
        cache = torch.zeros(shape, dtype=torch.uint8, device=dev)
    except (AttributeError, NotImplementedError):
        cache = torch.zeros(num_blocks, PAGE, hk, slot, dtype=torch.uint8, device=dev).permute(0, 2, 1, 3)
    layout = cache_view.probe(backend)
    view = layout.op_view(cache)
    assert layout.check(view, hk, slot) is None
    return view


def rel_err(out, ref):
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)).item()


def run_both(preset, seq_lens, hq, hk, k1, *, qdtype=torch.float32, seed=0, layout="head", **kw):
    lay, cent, H = _tables(preset)
    view, bt = make_cache(preset, seq_lens, hk, seed=seed, layout=layout)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(seq_lens) * k1, hq, D, device="cuda").to(qdtype)
    args = dict(preset=preset, scale=D**-0.5, centroids=cent, PiT=H)
    out = TV.turboquant_verify_attention(q, view, bt, sl, k1, **args, **kw)
    ref = R.turboquant_verify_attention_reference(q.float(), view, bt, sl, k1, **args)
    return out, ref, (q, view, bt, sl, args)


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_store_bytes_match_vllm_store(upstream, preset):
    lay, cent, H = _tables(preset)
    mids = L.midpoints(cent)

    def vllm_store(k, v, view, slots):
        upstream.store.triton_turboquant_store(
            k, v, view, slots, H, mids, mse_bits=lay.key_bits, key_packed_size=lay.key_packed_size,
            value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8,
        )

    a, _ = make_cache(preset, [300, 77], 4, seed=3, layout="line")
    b, _ = make_cache(preset, [300, 77], 4, seed=3, store=vllm_store, layout="line")
    kps, so = lay.key_packed_size, lay.scale_offset
    # keys (fp8 bytes, or indices + norm) and value scale/zero: bit-exact
    assert torch.equal(a[..., :kps], b[..., :kps]), f"{preset}: key bytes differ from vLLM's store"
    assert torch.equal(a[..., so : so + 4], b[..., so : so + 4]), f"{preset}: value scale/zero differ"
    # value indices: vLLM's GPU kernel divides with Triton's fast fp32 division, so at exact
    # rounding ties an index may land one level off; never more, and only rarely
    ia = L.unpack_indices(a[..., kps:so], lay.value_bits, D)
    ib = L.unpack_indices(b[..., kps:so], lay.value_bits, D)
    off = (ia != ib).float().mean().item()
    assert (ia - ib).abs().max().item() <= 1 and off < 2e-3, f"{preset}: value indices differ at {off:.2%}"
    print(f"{preset}: value indices one level apart at {off:.4%} of elements")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("heads", [(24, 4), (16, 2)])
@pytest.mark.parametrize("k1", [1, 2, 4, 6])
def test_verify_matches_float64_reference(preset, heads, k1):
    _need_cuda()
    hq, hk = heads
    out, ref, _ = run_both(preset, [k1, 700, 4096 + k1], hq, hk, k1)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("heads", [(24, 4), (16, 2)])
@pytest.mark.parametrize("k1", [1, 4])
def test_vllm_page_layout_matches_reference(preset, heads, k1):
    """vLLM's LBNHC pages: one head's positions sit Hk slots apart."""
    _need_cuda()
    hq, hk = heads
    out, ref, _ = run_both(preset, [k1 + 5, 1500, 4096 + k1], hq, hk, k1, layout="vllm")
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc"])
def test_portable_and_asm_dequant_agree(preset):
    """The PTX dequant (fp8 cvt, nibble lop3) and the portable shift/mask path give the same answer."""
    _need_cuda()
    key = preset
    saved = dict(LP.V2_LAUNCH_DEFAULTS[key])
    outs = []
    LP.USE_GLUON = False  # k8v4 would otherwise take the Gluon kernel
    try:
        for asm, split in ((False, False), (True, False), (True, True)):
            LP.V2_LAUNCH_DEFAULTS[key] = {**saved, "FP8_ASM": asm, "NIB_ASM": asm, "ASM_SPLIT": split}
            torch.manual_seed(11)  # same queries for all paths
            out, ref, _ = run_both(preset, [7, 3000], 24, 4, 4, layout="vllm")
            assert rel_err(out, ref) < 3e-3, (asm, split)
            outs.append(out)
            assert last_launch().kernel == "v2"
    finally:
        LP.V2_LAUNCH_DEFAULTS[key] = saved
        LP.USE_GLUON = True
    assert rel_err(outs[1], outs[0]) < 1e-3
    assert torch.equal(outs[2], outs[1])  # one position at a time: same conversions, same dots


@pytest.mark.parametrize("layout", ["vllm", "head"])
@pytest.mark.parametrize("heads", [(24, 4), (16, 2)])
@pytest.mark.parametrize("k1,warps", [(1, (1, 4)), (4, (1, 4)), (4, (2, 2)), (6, (1, 4))])
@pytest.mark.parametrize("block_n,stages,max_bm,extra", [
    (64, 1, 32, {}), (64, 2, 64, {}), (128, 3, 32, {}), (64, 1, 32, {"PREFETCH": True}), (64, 2, 32, {"PREFETCH": True}),
])
def test_gluon_k8v4_matches_reference(layout, heads, k1, warps, block_n, stages, max_bm, extra):
    """The explicit-layout (Gluon) k8v4 kernel: masked tails, split-KV, row chunks (K+1 = 6:
    36 rows in two chunks of 32, or one of 64), one to three cp.async stages, a padding request and
    rows that see nothing give zeros; block-table entries read one issue ahead (PREFETCH)."""
    _need_cuda()
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    if not GV.AVAILABLE or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs Triton with Gluon and SM >= 8.9")
    _check_gluon_settings("turboquant_k8v4", {"BLOCK_N": block_n, "num_stages": stages, "WM": warps[0],
                                              "WN": warps[1], "MAX_BLOCK_M": max_bm, **extra},
                          heads, k1, layout, "gluon_k8v4")


def _check_gluon_settings(preset, cfg, heads, k1, layout, kernel):
    """One Gluon launch setting (shape rules off) against the float64 reference, on requests with
    a padding entry (length 0) and one of length 2 whose first K+1-2 rows see nothing (zeros)."""
    saved, saved_rules = dict(LP.GLUON_LAUNCH_DEFAULTS[preset]), LP.GLUON_SHAPE_RULES
    LP.GLUON_LAUNCH_DEFAULTS[preset] = cfg
    LP.GLUON_SHAPE_RULES = {}
    try:
        hq, hk = heads
        lens = [k1 + 3, 0, 700, 4096 + k1, 2]
        out, ref, _ = run_both(preset, lens, hq, hk, k1, layout=layout, num_kv_splits=3)
        wg = cfg.get("WGMMA") and torch.cuda.get_device_capability() == (9, 0)  # on Hopper MMAs
        if k1 * hq // hk <= min(64, max(cfg.get("TRANSPOSED_ROWS", 8), cfg.get("WG_ROWS", 0) if wg else 0)):
            kernel = kernel.replace("gluon_", "gluon_wg_" if wg else "gluon_t_")  # the transposed kernel
        assert last_launch().kernel == kernel
    finally:
        LP.GLUON_LAUNCH_DEFAULTS[preset], LP.GLUON_SHAPE_RULES = saved, saved_rules
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 3e-3
    assert out[k1:2 * k1].abs().max().item() == 0.0  # padding request (length 0)
    if k1 > 2:  # the request of length 2: its first K+1-2 rows see no position
        assert out[4 * k1:5 * k1 - 2].abs().max().item() == 0.0


MSE_PRESETS = ["turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"]


@pytest.mark.parametrize("preset", MSE_PRESETS)
@pytest.mark.parametrize("layout", ["vllm", "head"])
@pytest.mark.parametrize("heads", [(24, 4), (16, 2)])
@pytest.mark.parametrize("k1,cfg", [
    (1, {}), (4, {}), (4, {"PREFETCH": True}), (6, {"MAX_BLOCK_M": 64}), (4, {"BLOCK_N": 32, "WM": 2, "WN": 2}),
    (2, {"maxnreg": None, "BLOCK_N": 128}), (4, {"FOLD": False}),
])
def test_gluon_mse_matches_reference(preset, layout, heads, k1, cfg):
    """The explicit-layout kernel on the MSE presets: 2-byte-aligned slots (every other row starts
    mid-word), codebook lookups by byte permutes (4-bit keys: folded onto the symmetric codebook's
    positive half, or the general 16-entry lookup with FOLD off), norm correction, 3-bit fields
    widened to nibbles, block-table entries read a tile ahead (PREFETCH);
    masked tails, split-KV, row chunks, a padding request and rows that see nothing give zeros."""
    _need_cuda()
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    if not GV.AVAILABLE:
        pytest.skip("needs Triton with Gluon")
    _check_gluon_settings(preset, {**LP.GLUON_LAUNCH_DEFAULTS[preset], **cfg}, heads, k1, layout, "gluon_mse")


_SMALL_ROW_CFGS = [{}, {"BLOCK_N": 32, "num_stages": 1}, {"BLOCK_N": 128, "maxnreg": None}, {"WM": 1, "WN": 2},
                   {"PREFETCH": False}]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("heads,k1,cfg", [
    *[(h, k, c) for h, k in (((24, 4), 1), ((16, 2), 1), ((8, 2), 2), ((32, 8), 2)) for c in _SMALL_ROW_CFGS],
    ((24, 4), 4, {}), ((24, 4), 4, {"maxnreg": None}), ((24, 4), 6, {}), ((24, 4), 6, {"maxnreg": None}),
    ((24, 4), 6, {"BLOCK_N": 32}), ((16, 2), 6, {}),
])
def test_gluon_transposed_and_row_major_agree(preset, heads, k1, cfg):
    """The transposed kernel (``_tq_verify_t_gluon``: rows as the MMA's N, in row groups of 8 (6 or 8
    rows), 16 + 8 (24), 32 + 8 (36) and 32 + 16 (48)) and the row-major kernel both match the
    float64 reference, including the in-chunk causal mask, a padding request and a request shorter
    than K+1, and agree with each other."""
    _need_cuda()
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    need = (8, 9) if preset == "turboquant_k8v4" else (8, 0)
    if not GV.AVAILABLE or torch.cuda.get_device_capability() < need:
        pytest.skip("needs Triton with Gluon and the preset's SM")
    base = {**LP.GLUON_LAUNCH_DEFAULTS[preset], **cfg}
    if k1 * heads[0] // heads[1] > 32:
        base["MAX_BLOCK_M"] = 64  # the row-major kernel in one 64-row program
    outs = []
    kind = "k8v4" if preset == "turboquant_k8v4" else "mse"
    for trans in (64, 0):
        cfg_t = {**base, "TRANSPOSED_ROWS": trans}
        _check_gluon_settings(preset, cfg_t, heads, k1, "vllm", f"gluon_{kind}")
        saved, saved_rules = dict(LP.GLUON_LAUNCH_DEFAULTS[preset]), LP.GLUON_SHAPE_RULES
        LP.GLUON_LAUNCH_DEFAULTS[preset], LP.GLUON_SHAPE_RULES = cfg_t, {}
        try:
            torch.manual_seed(3)
            out, _, _ = run_both(preset, [k1 + 1000, 5], *heads, k1, layout="vllm", num_kv_splits=2)
            assert last_launch().kernel == (f"gluon_t_{kind}" if trans else f"gluon_{kind}")
        finally:
            LP.GLUON_LAUNCH_DEFAULTS[preset], LP.GLUON_SHAPE_RULES = saved, saved_rules
        outs.append(out)
    assert rel_err(outs[0], outs[1]) < 3e-3


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("heads,k1", [((24, 4), 1), ((16, 2), 1), ((32, 8), 2), ((24, 4), 2), ((24, 4), 4),
                                      ((16, 2), 4), ((24, 4), 6), ((16, 2), 6)])
@pytest.mark.parametrize("extra", [{"WG_DEPTH": 0}, {"WG_DEPTH": 1, "maxnreg": None}, {"num_stages": 2}])
def test_gluon_wgmma_matches_reference(preset, heads, k1, extra):
    """The transposed kernel on Hopper warpgroup MMAs (``_tq_verify_wg_gluon``: decoded key and
    value words as register A operands, query and softmax weights as shared-memory B operands, row
    groups 8, 16 + 8, 32, 32 + 8, 32 + 16; chunks of MMAs in flight, WG_DEPTH) against the float64
    reference, with the causal mask, a padding request and a request shorter than K+1."""
    _need_cuda()
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    if not GV.AVAILABLE or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs Triton with Gluon and SM 9.0")
    if extra.get("num_stages", 1) > 1 and preset != "turboquant_k8v4":
        pytest.skip("MSE tiles are staged through registers (one stage)")
    kind = "k8v4" if preset == "turboquant_k8v4" else "mse"
    cfg = {**LP.GLUON_LAUNCH_DEFAULTS[preset], "TRANSPOSED_ROWS": 64, "WGMMA": True, **extra}
    _check_gluon_settings(preset, cfg, heads, k1, "vllm", f"gluon_{kind}")


@pytest.mark.parametrize("heads,num_reqs", [((24, 4), 8), ((24, 4), 64), ((16, 2), 8), ((16, 2), 64)])
@pytest.mark.parametrize("k1", [3, 4, 6])
def test_k8v4_wgmma_rule_matches_reference(heads, num_reqs, k1):
    """What ships for k8v4 verify batches over > 8 programs (GLUON_SHAPE_RULES: on Hopper the
    warpgroup-MMA transposed kernel up to WG_ROWS rows: K+1 = 3-4 as 16 + 8 rows (24/4 heads) or
    one group of 32 (16/2 heads at K+1 = 4), one stage, 168 registers; K+1 = 6, 36 rows as 32 + 8,
    48 as 32 + 16, two stages): bf16 queries, vLLM's page layout, ragged lengths, against the
    float64 reference."""
    _need_cuda()
    hq, hk = heads
    rows = k1 * hq // hk
    cfg = LP.gluon_launch_config("turboquant_k8v4", num_reqs, hk, k1, -(-rows // 32))
    assert cfg["WGMMA"], "the shape rule did not fire"
    lens = [k1 + (37 + 397 * i) % 5000 for i in range(num_reqs)]
    out, ref, _ = run_both("turboquant_k8v4", lens, hq, hk, k1, qdtype=torch.bfloat16, layout="vllm")
    if torch.cuda.get_device_capability() == (9, 0):
        assert last_launch().kernel == ("gluon_wg_k8v4" if rows <= cfg["WG_ROWS"] else "gluon_k8v4")
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("preset", MSE_PRESETS)
def test_gluon_mse_and_v2_agree(preset):
    """Same cache and queries through the Gluon kernel and the v2 Triton kernel (independent
    dequant paths: byte-permute lookups vs centroid gathers, sum of squares vs Gram diagonal)."""
    _need_cuda()
    torch.manual_seed(5)
    out_g, ref, (q, view, bt, sl, args) = run_both(preset, [5, 3000, 777], 24, 4, 4, layout="vllm")
    assert last_launch().kernel == "gluon_mse"
    out_v = TV.turboquant_verify_attention(q, view, bt, sl, 4, **args, gluon=False)
    assert last_launch().kernel == "v2"
    assert rel_err(out_g, ref) < 3e-3 and rel_err(out_v, ref) < 3e-3
    assert rel_err(out_g, out_v) < 3e-3


@pytest.mark.parametrize("num_reqs,k1", [(32, 1), (8, 4), (1, 6)])
def test_shape_rule_launches_match_reference(num_reqs, k1):
    """The launch settings picked by V2_SHAPE_RULES (plain decode over >= 128 programs: BLOCK_N 64,
    ASM_SPLIT, maxnreg 168; small verify batches: BLOCK_N 64, 3 stages) give the reference."""
    _need_cuda()
    preset = "turboquant_k8v4"
    rows = k1 * 6
    m_chunks = -(-rows // 32)
    cfg = LP.v2_launch_config(preset, num_reqs, 4, k1, m_chunks)
    assert cfg != LP.V2_LAUNCH_DEFAULTS[preset], "shape rule did not fire"
    lens = [k1 + (37 + 397 * i) % 5000 for i in range(num_reqs)]
    LP.USE_GLUON = False  # the v2 kernel's rules (k8v4 would otherwise take the Gluon kernel)
    try:
        out, ref, _ = run_both(preset, lens, 24, 4, k1, layout="vllm")
        assert last_launch().kernel == "v2"
    finally:
        LP.USE_GLUON = True
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("preset,num_reqs,maxnreg", [("turboquant_k8v4", 64, 80), ("turboquant_4bit_nc", 32, 128),
                                                    ("turboquant_3bit_nc", 32, 128)])
def test_gluon_plain_decode_register_cap_rules_match_reference(preset, num_reqs, maxnreg):
    """Plain decode over many programs (GLUON_SHAPE_RULES: k8v4 >= 256 programs at 80 registers,
    MSE >= 128 at 128) runs the transposed kernel with more programs per SM and split counts sized
    for them; bf16 queries as vLLM passes them, vLLM's page layout."""
    _need_cuda()
    cfg = LP.gluon_launch_config(preset, num_reqs, 4, 1, 1)
    assert cfg["maxnreg"] == maxnreg, "the shape rule did not fire"
    lens = [1 + (37 + 397 * i) % 3000 for i in range(num_reqs)]
    out, ref, _ = run_both(preset, lens, 24, 4, 1, qdtype=torch.bfloat16, layout="vllm")
    assert last_launch().kernel.startswith("gluon_t_")
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_3bit_nc"])
def test_bf16_queries_and_matches_vllm_decode_route(upstream, preset):
    lay, cent, H = _tables(preset)
    k1, hq, hk = 4, 24, 4
    out, ref, (q, view, bt, sl, args) = run_both(preset, [9, 2000, 513], hq, hk, k1, qdtype=torch.bfloat16,
                                                 layout="line")
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) < 1e-2
    # vLLM's decode kernel, one row per query token (the upstream routing fix)
    offs = torch.arange(k1, device="cuda", dtype=torch.int32)
    synth_sl = (sl[:, None] - k1 + 1 + offs[None, :]).reshape(-1).contiguous()
    synth_bt = bt.repeat_interleave(k1, dim=0).contiguous()
    up = upstream.decode.triton_turboquant_decode_attention(
        q, view, synth_bt, synth_sl, H, cent, D**-0.5, mse_bits=lay.key_bits, key_packed_size=lay.key_packed_size,
        value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8, norm_correction=lay.norm_correction, PiT=H,
    )
    assert rel_err(up, ref) < 1e-2
    assert rel_err(out, up) < 1.5e-2


def test_long_context_split_kv_and_fixed_splits_agree():
    _need_cuda()
    preset = "turboquant_k8v4"
    out, ref, (q, view, bt, sl, args) = run_both(preset, [32768 + 3, 5000], 24, 4, 4)
    assert rel_err(out, ref) < 3e-3
    one = TV.turboquant_verify_attention(q, view, bt, sl, 4, **args, num_kv_splits=1)
    many = TV.turboquant_verify_attention(q, view, bt, sl, 4, **args, num_kv_splits=32)
    assert rel_err(one, ref) < 3e-3 and rel_err(many, ref) < 3e-3


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_3bit_nc"])
@pytest.mark.parametrize("heads,k1", [((16, 2), 1), ((16, 2), 2), ((16, 2), 4), ((16, 2), 6), ((24, 4), 4)])
def test_single_request_split_plan_matches_reference(preset, heads, k1):
    """One request with 16/2 heads and <= 32 rows per program: 64 splits of >= min(4, a 32-split's)
    tiles (triton_verify.gluon_split_plan), the workspace sized as the wiring does (4 requests) and
    seen with more splits; at 4K + 5 positions 3 tiles (22 splits used), at 20000 5 tiles (63 used).
    48-row programs (K+1 = 6) and 24/4 heads keep <= 32 splits of one tile minimum."""
    _need_cuda()
    hq, hk = heads
    ws = TV.VerifyWorkspace.allocate(4, k1, hq, D, device="cuda")
    small = hk == 2 and k1 <= 4
    for ctx in (4096 + 5, 20000):
        out, ref, _ = run_both(preset, [ctx], hq, hk, k1, layout="vllm", workspace=ws, seed=ctx)
        if small:
            assert last_launch().plan == (LP.SMALL_BATCH_MAX_SPLITS, LP.SMALL_BATCH_MIN_TILES), (ctx, last_launch().plan)
        else:
            assert last_launch().plan[0] <= LP.DEFAULT_MAX_KV_SPLITS and last_launch().plan[1] == 1, (ctx, last_launch().plan)
        assert rel_err(out, ref) < 3e-3, (ctx, last_launch().kernel)


def test_single_request_graph_replays_long_and_short_lengths():
    """The single-request split plan under a CUDA graph captured with seq_lens = 1 (16/2 heads,
    max_num_seqs 1: the workspace's default split dimension holds the 64 splits)."""
    _need_cuda()
    preset, hq, hk, k1 = "turboquant_k8v4", 16, 2, 4
    lay, cent, H = _tables(preset)
    view, bt_real = make_cache(preset, [20000], hk, seed=9, layout="vllm")
    ws = TV.VerifyWorkspace.allocate(1, k1, hq, D, device="cuda")
    q = torch.zeros(k1, hq, D, device="cuda", dtype=torch.bfloat16)
    sl = torch.ones(1, dtype=torch.int32, device="cuda")
    bt = torch.zeros_like(bt_real)
    out = torch.empty(k1, hq, D, device="cuda", dtype=torch.bfloat16)
    args = dict(preset=preset, scale=D**-0.5, centroids=cent, PiT=H)
    fn = lambda: TV.turboquant_verify_attention(q, view, bt, sl, k1, **args, workspace=ws, out=out)  # noqa: E731
    fn()
    assert last_launch().plan == (LP.SMALL_BATCH_MAX_SPLITS, LP.SMALL_BATCH_MIN_TILES)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for n in (20000, 70, 4101):
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
        sl.fill_(n)
        bt.copy_(bt_real)
        graph.replay()
        torch.cuda.synchronize()
        ref = R.turboquant_verify_attention_reference(q.float(), view, bt, sl, k1, **args)
        assert rel_err(out, ref) < 1e-2, n


def test_padding_requests_and_short_rows_give_zeros():
    _need_cuda()
    preset = "turboquant_4bit_nc"
    k1 = 4
    out, ref, _ = run_both(preset, [50, 0, 2], 24, 4, k1)  # request 1 padded; request 2 rows 0,1 see nothing
    assert torch.isfinite(out).all()
    assert out[k1 : 2 * k1].abs().max().item() == 0.0
    assert out[2 * k1 : 2 * k1 + 2].abs().max().item() == 0.0
    assert rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("preset,k1", [("turboquant_k8v4", 4), ("turboquant_k3v4_nc", 4), ("turboquant_k8v4", 6)])
def test_cuda_graph_captured_with_dummy_lengths_replays_real(preset, k1):
    """(k8v4 K+1 = 6: on Hopper the warpgroup-MMA kernel.)"""
    _need_cuda()
    lay, cent, H = _tables(preset)
    hq, hk, max_seqs = 24, 4, 3
    real = [3000, 17, 1200]
    view, bt_real = make_cache(preset, real, hk, seed=5)
    ws = TV.VerifyWorkspace.allocate(max_seqs, k1, hq, D, device="cuda")
    q = torch.zeros(max_seqs * k1, hq, D, device="cuda", dtype=torch.bfloat16)
    sl = torch.ones(max_seqs, dtype=torch.int32, device="cuda")  # build_for_cudagraph_capture: seq_lens = 1
    bt = torch.zeros_like(bt_real)
    out = torch.empty(max_seqs * k1, hq, D, device="cuda", dtype=torch.bfloat16)
    args = dict(preset=preset, scale=D**-0.5, centroids=cent, PiT=H)
    fn = lambda: TV.turboquant_verify_attention(q, view, bt, sl, k1, **args, workspace=ws, out=out)  # noqa: E731
    fn()  # warm up (compile) outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    for lens in (real, [5, 3000, 4]):
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        bt.copy_(bt_real)
        graph.replay()
        torch.cuda.synchronize()
        ref = R.turboquant_verify_attention_reference(q.float(), view, bt, sl, k1, **args)
        assert rel_err(out, ref) < 1e-2, lens


def test_workspace_rows_bound_and_clear_error():
    _need_cuda()
    preset = "turboquant_k8v4"
    lay, cent, H = _tables(preset)
    view, bt = make_cache(preset, [40] * 5, 4)
    ws = TV.VerifyWorkspace.allocate(4, 4, 24, D, device="cuda")  # max_num_seqs 4, K+1 = 4
    assert ws.rows == 16
    args = dict(preset=preset, scale=D**-0.5, centroids=cent, PiT=H, workspace=ws)
    sl = torch.full((4,), 40, dtype=torch.int32, device="cuda")
    q = torch.randn(16, 24, D, device="cuda", dtype=torch.bfloat16)
    TV.turboquant_verify_attention(q, view, bt[:4], sl, 4, **args)
    with pytest.raises(ValueError, match="workspace"):
        TV.turboquant_verify_attention(torch.randn(20, 24, D, device="cuda"), view, bt,
                                       torch.full((5,), 40, dtype=torch.int32, device="cuda"), 4, **args)


def test_forced_e4b15_branch_reads_vllm_e4b15_bytes(upstream):
    """The Ampere/Ada fp8 format (SM < 8.9), forced on this GPU: vLLM's store writes e4b15
    keys, our kernel reads them with FP8_E4B15 and matches the reference decoding them."""
    preset = "turboquant_k8v4"
    lay, cent, H = _tables(preset)
    mids = L.midpoints(cent)
    dev = torch.cuda.current_device()
    saved = dict(upstream.decode._FP8_E4B15)
    upstream.decode._FP8_E4B15[dev] = 1
    try:
        def vllm_store(k, v, view, slots):
            upstream.store.triton_turboquant_store(
                k, v, view, slots, H, mids, mse_bits=0, key_packed_size=lay.key_packed_size,
                value_quant_bits=lay.value_bits, key_fp8=True,
            )

        view, bt = make_cache(preset, [900, 33], 4, e4b15=True, store=vllm_store, layout="line")
    finally:
        upstream.decode._FP8_E4B15.clear()
        upstream.decode._FP8_E4B15.update(saved)
    ref_view, _ = make_cache(preset, [900, 33], 4, e4b15=True, seed=0, layout="line")
    # vLLM's e4b15 key bytes decode to within one e4b15 step of the reference encoding
    kb = view[..., : lay.head_dim].reshape(-1, lay.head_dim)
    rb = ref_view[..., : lay.head_dim].reshape(-1, lay.head_dim)
    dk = (L.fp8_to_float(kb, e4b15=True) - L.fp8_to_float(rb, e4b15=True)).abs()
    assert dk.max().item() <= 0.125 + 1e-6  # at most one e4b15 step (top binade) apart
    sl = torch.tensor([900, 33], dtype=torch.int32, device="cuda")
    q = torch.randn(8, 24, D, device="cuda")
    args = dict(preset=preset, scale=D**-0.5, centroids=cent, PiT=H, fp8_e4b15=True)
    out = TV.turboquant_verify_attention(q, view, bt, sl, 4, **args)
    ref = R.turboquant_verify_attention_reference(q, view, bt, sl, 4, **args)
    assert rel_err(out, ref) < 3e-3
    wrong = R.turboquant_verify_attention_reference(q, view, bt, sl, 4, **{**args, "fp8_e4b15": False})
    assert not rel_err(out, wrong) <= 3e-2  # the branch matters: e4b15 bytes read as e4nv are wrong


def _sanitize_sweep() -> None:
    torch.manual_seed(0)
    worst = 0.0
    for preset in PRESETS:
        for hq, hk in ((24, 4), (16, 2)):
            for k1 in (1, 4, 6):
                for cfg in ({}, {"BLOCK_N": 32, "GATHER": False}):
                    out, ref, _ = run_both(preset, [k1 + 40, 0, 300], hq, hk, k1, num_kv_splits=4, **cfg)
                    worst = max(worst, rel_err(out, ref))
    # vLLM's page layout, k8v4 through the Gluon kernel (what ships: maxnreg 168 at >= 128 programs)
    # and through the v2 kernel's shape-rule launches: plain decode over 128 programs (BLOCK_N 64,
    # ASM_SPLIT, maxnreg 168) and a small verify batch (BLOCK_N 64, 3 stages)
    for use_gluon in (True, False):
        LP.USE_GLUON = use_gluon
        # (64, 6): 36 rows on the transposed kernel; (64, 1): plain decode over 256 programs at 80 registers (rules)
        # (8, 4) / (32, 4) / (8, 6) / (64, 6): on Hopper the warpgroup-MMA transposed kernel (rules)
        for n, k1 in ((32, 1), (8, 4), (32, 4), (64, 6), (8, 6), (64, 1)):
            out, ref, _ = run_both("turboquant_k8v4", [k1 + (37 + 397 * i) % 3000 for i in range(n)], 24, 4, k1,
                                   layout="vllm")
            worst = max(worst, rel_err(out, ref))
    LP.USE_GLUON = True
    # one request, 16/2 heads: 64 splits of >= min(4, a 32-split's) tiles (transposed, warpgroup-MMA,
    # row-major MSE kernels)
    for preset in ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_3bit_nc"):
        for k1 in (1, 2, 4):
            for ctx in (4101, 20000):
                out, ref, _ = run_both(preset, [ctx + k1], 16, 2, k1, layout="vllm")
                assert last_launch().plan == (LP.SMALL_BATCH_MAX_SPLITS, LP.SMALL_BATCH_MIN_TILES)
                worst = max(worst, rel_err(out, ref))
    # 16/2 heads under the rules: K+1 = 4 is one 32-row group on the warpgroup-MMA form (Hopper)
    for n in (8, 32):
        out, ref, _ = run_both("turboquant_k8v4", [4 + (37 + 397 * i) % 3000 for i in range(n)], 16, 2, 4,
                               layout="vllm")
        worst = max(worst, rel_err(out, ref))
    # the MSE presets through the Gluon kernel in vLLM's page layout (odd rows start mid-word),
    # shipped settings and the variants the tests cover (prefetch, 64-row programs, BLOCK_N 32/128)
    for preset in ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"):
        saved = dict(LP.GLUON_LAUNCH_DEFAULTS[preset])
        for k1, cfg in ((1, {}), (4, {"PREFETCH": True}), (6, {"MAX_BLOCK_M": 64}), (4, {"BLOCK_N": 32}),
                        (6, {"TRANSPOSED_ROWS": 40}),
                        (2, {"BLOCK_N": 128, "maxnreg": None})):
            LP.GLUON_LAUNCH_DEFAULTS[preset] = {**saved, **cfg}
            n = 32 if k1 == 1 else 9  # plain decode over 128 programs: 128 registers (rules)
            out, ref, _ = run_both(preset, [k1 + (37 + 397 * i) % 3000 for i in range(n)], 24, 4, k1, layout="vllm")
            assert last_launch().kernel == ("gluon_t_mse" if k1 == 1 or "TRANSPOSED_ROWS" in cfg else "gluon_mse")
            worst = max(worst, rel_err(out, ref))
        LP.GLUON_LAUNCH_DEFAULTS[preset] = saved
    torch.cuda.synchronize()
    print(f"sanitize sweep done, worst rel err {worst:.2e}")
    assert worst < 3e-3


if __name__ == "__main__":
    if "--sanitize" in sys.argv:
        with TV.trace_launches() as rec:
            _TRACE[:] = [rec]
            _sanitize_sweep()


@pytest.mark.parametrize("preset", PRESETS)
def test_inference_tensors_under_graph_capture(preset):
    """As vLLM hands them: every tensor made under ``torch.inference_mode()`` (cache, block table,
    lengths, query, codebook, rotation, output), the call captured into a CUDA graph in inference
    mode. Replays match the float64 reference, and a codebook rewritten in place is read live."""
    _need_cuda()
    k1, hq, hk, lens = 4, 24, 4, [700, 33]
    with torch.inference_mode():
        lay, cent, H = _tables(preset)
        cent = cent.clone()
        view, bt = make_cache(preset, lens, hk, seed=11, layout="line")
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        q = torch.randn(len(lens) * k1, hq, D, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q)
        ws = TV.VerifyWorkspace.allocate(len(lens), k1, hq, D, device="cuda")
        args = dict(preset=preset, scale=D**-0.5, centroids=cent, PiT=H)
        assert all(t.is_inference() for t in (view, bt, sl, q, cent, H, out))
        fn = lambda: TV.turboquant_verify_attention(q, view, bt, sl, k1, **args, workspace=ws, out=out)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for step in range(2):
            if step:
                cent.mul_(1.25)  # in place, still symmetric: the replay must read the new values
            q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
            graph.replay()
            torch.cuda.synchronize()
            ref = R.turboquant_verify_attention_reference(q.float(), view, bt, sl, k1, **args)
            assert rel_err(out, ref) < 1e-2, (preset, step)


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_3bit_nc"])
@pytest.mark.parametrize("k1", [1, 4])
def test_padded_rows_with_garbage_block_tables(preset, k1):
    """Padded requests (seq_len 0) and the unused tail of a short request's block-table row holding -1 and
    10**6, as a padded batch or a bad draft's row may leave them (issue 51): the op's rows of the real
    requests equal the reference on the same table with that garbage set to 0, padded rows are 0, and no
    block outside the cache is read (compute-sanitizer's memcheck sees one that is)."""
    _need_cuda()
    torch.manual_seed(0)
    d, hk, nb, page = 128, 2, 8, PAGE
    lay = L.layout_for(preset, d)
    c, H = L.lloyd_max_centroids(d, lay.centroid_bits), L.hadamard(d)
    view = torch.zeros(nb, hk, page, lay.slot_size_aligned, dtype=torch.uint8).transpose(1, 2)
    R.tq_store_reference(torch.randn(nb * page, hk, d), torch.randn(nb * page, hk, d), view, torch.arange(nb * page),
                         preset, PiT=H, centroids=c)
    sl = torch.tensor([k1 + 20, 0, 0, k1 + 3], dtype=torch.int32)  # real, two padded, real (one block)
    bt = torch.tensor([[1, 2, -1, 10**6] + [-1] * 4, [-1] * 8, [10**6] * 8, [5, -1, 10**6] + [-1] * 5],
                      dtype=torch.int32)
    clean = torch.where((bt < 0) | (bt >= nb), torch.zeros_like(bt), bt)
    q = torch.randn(4 * k1, hk * 3, d)
    args = dict(preset=preset, scale=d**-0.5, centroids=c, PiT=H)
    ref = R.turboquant_verify_attention_reference(q, view, clean, sl, k1, **args)
    cuda = dict(preset=preset, scale=d**-0.5, centroids=c.cuda(), PiT=H.cuda())
    out = TV.turboquant_verify_attention(q.cuda(), view.cuda(), bt.cuda(), sl.cuda(), k1, **cuda).cpu()
    torch.cuda.synchronize()
    real = torch.cat([torch.arange(k1), torch.arange(3 * k1, 4 * k1)])
    assert torch.isfinite(out).all()
    assert rel_err(out[real], ref[real]) < 3e-3
    assert out[k1: 3 * k1].abs().max().item() == 0.0
