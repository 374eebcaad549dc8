"""The Triton verify kernel under the Triton interpreter (CPU) against the float64 reference.

The kernel runs in a subprocess with TRITON_INTERPRET=1 (small shapes, fp32/fp16 only);
argument checking runs in-process (no launch).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from vllm_platform_ext.ops.turboquant import layout as L
from vllm_platform_ext.ops.turboquant import reference as R

HERE = os.path.abspath(__file__)


def _cache(preset, d, hk, nb=8, page=16, seed=0, layout="head"):
    """layout "vllm": vLLM 0.32's LBNHC page [block, position, kv head, slot] (contiguous);
    "head": head-major pages seen through the same [block, position, kv head, slot] view."""
    torch.manual_seed(seed)
    lay = L.layout_for(preset, d)
    c, H = L.lloyd_max_centroids(d, lay.centroid_bits), L.hadamard(d)
    if layout == "vllm":
        view = torch.zeros(nb, page, hk, lay.slot_size_aligned, dtype=torch.uint8)
    else:
        view = torch.zeros(nb, hk, page, lay.slot_size_aligned, dtype=torch.uint8).transpose(1, 2)
    ntok = nb * page
    R.tq_store_reference(torch.randn(ntok, hk, d), torch.randn(ntok, hk, d), view, torch.arange(ntok), preset,
                         PiT=H, centroids=c)
    return view, c, H


def _cases():
    # (preset, K+1, GQA, query dtype, launch overrides)
    out = []
    for preset in L.PRESETS:
        out.append((preset, 4, 6, "float32", {}))
        out.append((preset, 1, 2, "float16", {"BLOCK_N": 32, "GATHER": True}))
    out += [
        ("turboquant_k8v4", 6, 6, "float16", {"BLOCK_M": 16}),  # 36 rows in 3 row chunks
        ("turboquant_3bit_nc", 6, 1, "float32", {"GATHER": True, "BLOCK_N": 16}),
        ("turboquant_k3v4_nc", 2, 8, "float16", {"num_kv_splits": 1}),
        # 20 splits (the merge's running max over many splits, most of them empty)
        ("turboquant_4bit_nc", 4, 6, "float32", {"num_kv_splits": 20, "BLOCK_N": 16}),
        # a workspace sized for 3 splits of 8 requests, used with 6 splits by these 4 requests
        ("turboquant_k8v4", 4, 6, "float32", {"num_kv_splits": 6, "BLOCK_N": 16, "ws_splits": 3}),
    ]
    return out


def _cases_v2():
    # head dim 64: the word-load kernel (head dim >= 64), with and without the register prefetch
    out = []
    for preset in L.PRESETS:
        out.append((preset, 4, 3, "float32", {}))
    out += [
        ("turboquant_k8v4", 1, 2, "float16", {"BLOCK_N": 16, "PREFETCH": False}),
        ("turboquant_3bit_nc", 2, 6, "float16", {"BLOCK_N": 32, "PREFETCH": False}),
        ("turboquant_4bit_nc", 6, 6, "float32", {"BLOCK_M": 16, "BLOCK_N": 16}),  # 36 rows in 3 row chunks
        ("turboquant_k8v4", 4, 6, "float32", {"BLOCK_N": 32, "gluon": False}),  # MetaX's config key
        # vLLM's own page layout (positions of one head Hk slots apart), unmasked + masked tiles
        ("turboquant_k8v4", 4, 3, "float32", {"BLOCK_N": 16, "layout": "vllm"}),
        ("turboquant_4bit_nc", 2, 3, "float16", {"BLOCK_N": 32, "layout": "vllm"}),
        ("turboquant_3bit_nc", 4, 3, "float32", {"BLOCK_N": 16, "layout": "vllm"}),
    ]
    return out


def _interp_check() -> dict:
    from vllm_platform_ext.ops.turboquant import triton_verify as TV
    from vllm_platform_ext.ops.turboquant import launch_policy as LP

    hk = 2
    res = []
    saved = {k: dict(v) for k, v in LP.V2_LAUNCH_DEFAULTS.items()}
    for d, preset, k1, g, qd, launch in [(32, *c) for c in _cases()] + [(64, *c) for c in _cases_v2()]:
        launch = dict(launch)
        if "PREFETCH" in launch:  # not a wrapper argument: the v2 launch table
            pf = launch.pop("PREFETCH")
            for v in LP.V2_LAUNCH_DEFAULTS.values():
                v["PREFETCH"] = pf
        else:
            for k, v in saved.items():
                LP.V2_LAUNCH_DEFAULTS[k] = dict(v)
        view, c, H = _cache(preset, d, hk, layout=launch.pop("layout", "head"))
        sl = torch.tensor([k1 + 37, 0, 2, 128], dtype=torch.int32)  # long, padding, short (rows see nothing), full
        bt = torch.tensor([[1, 2, 3, 0, 4, 5, 6, 7], [0] * 8, [5, 0, 0, 0, 0, 0, 0, 0], [7, 6, 5, 4, 3, 2, 1, 0]],
                          dtype=torch.int32)
        q = torch.randn(4 * k1, hk * g, d).to(getattr(torch, qd))
        args = dict(preset=preset, scale=d**-0.5, centroids=c, PiT=H)
        launch = dict(launch)
        launch.setdefault("num_kv_splits", 3)
        if "ws_splits" in launch:
            ws = TV.VerifyWorkspace.allocate(8, k1, hk * g, d, max_kv_splits=launch.pop("ws_splits"), device="cpu")
            assert ws.max_kv_splits < launch["num_kv_splits"]
            launch["workspace"] = ws
        with TV.trace_launches() as rec:
            out = TV.turboquant_verify_attention(q, view, bt, sl, k1, **args, **launch)
        ref = R.turboquant_verify_attention_reference(q.float(), view, bt, sl, k1, **args)
        # a wrong causal offset (every row sees one position fewer) must be told apart
        wrong = R.turboquant_verify_attention_reference(q.float(), view, bt, (sl - 1).clamp_min(0), k1, **args)
        den = ref.abs().max().item()
        res.append({
            "case": [d, preset, k1, g, qd, {k: v for k, v in launch.items() if k != "workspace"}],
            "rel_err": float((out.float() - ref).abs().max()) / den,
            "rel_wrong": float((out.float() - wrong).abs().max()) / den,
            "finite": bool(torch.isfinite(out).all()),
            "zero_rows": float(out[k1 : 2 * k1].abs().max())
            + (float(out[2 * k1 : 3 * k1 - 2].abs().max()) if k1 > 2 else 0.0),
            "dtype_ok": out.dtype == q.dtype,
            "launch": [[x.kernel, x.splits, x.min_tiles] for x in rec],
        })
    return {"results": res}


def _interpreted(flag: str, timeout: int) -> list[dict]:
    """Runs this file with ``flag`` in a subprocess under TRITON_INTERPRET=1; its JSON results."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, HERE, flag], capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["results"]


def test_triton_kernel_equals_reference_under_interpreter():
    res = _interpreted("--interp", 900)
    assert len(res) == len(_cases()) + len(_cases_v2())
    for r in res:
        assert r["finite"] and r["dtype_ok"], r
        d, launch = r["case"][0], r["case"][-1]
        # the debug hook saw exactly this call: byte-load kernel below head dim 64, word loads above
        assert r["launch"] == [["v1" if d < 64 else "v2", launch["num_kv_splits"], 1]], r
        assert r["rel_err"] < 3e-3, r
        assert r["rel_wrong"] > 10 * r["rel_err"], r  # the comparison can fail
        assert r["zero_rows"] == 0.0, r  # padded request and rows that see no position


def _padded_check() -> dict:
    """Padded requests (seq_len 0) and the unused tail of a short request's block-table row holding -1 and
    10**6, as a padded batch or a bad draft's row may leave them (issue 51): the Triton kernel (v1, v2) and
    the CPU op (the reference) against the reference on the same table with that garbage set to 0."""
    from vllm_platform_ext.ops.turboquant import triton_verify as TV

    hk, res = 2, []
    for d, preset, k1 in ((32, "turboquant_k8v4", 4), (64, "turboquant_k8v4", 4), (64, "turboquant_3bit_nc", 2)):
        view, c, H = _cache(preset, d, hk)
        sl = torch.tensor([k1 + 20, 0, 0, k1 + 3], dtype=torch.int32)  # real, two padded, real (one block)
        bt = torch.tensor([[1, 2, -1, 10**6] + [-1] * 4, [-1] * 8, [10**6] * 8, [5, -1, 10**6] + [-1] * 5],
                          dtype=torch.int32)
        clean = torch.where((bt < 0) | (bt >= view.shape[0]), torch.zeros_like(bt), bt)
        q = torch.randn(4 * k1, hk * 3, d)
        args = dict(preset=preset, scale=d**-0.5, centroids=c, PiT=H)
        ref = R.turboquant_verify_attention_reference(q, view, clean, sl, k1, **args)
        cpu = R.turboquant_verify_attention_reference(q, view, bt, sl, k1, **args)
        out = TV.turboquant_verify_attention(q, view, bt, sl, k1, num_kv_splits=2, **args)
        real = torch.cat([torch.arange(k1), torch.arange(3 * k1, 4 * k1)])
        den = ref.abs().max().item()
        res.append({"case": [d, preset, k1], "rel_err": float((out - ref)[real].abs().max()) / den,
                    "cpu_err": float((cpu - ref).abs().max()) / den,
                    "padded_rows": float(out[k1: 3 * k1].abs().max()), "finite": bool(torch.isfinite(out).all())})
    return {"results": res}


def test_padded_rows_with_garbage_block_tables_under_interpreter():
    for r in _interpreted("--padded", 600):
        assert r["finite"] and r["rel_err"] < 3e-3 and r["cpu_err"] == 0.0, r
        assert r["padded_rows"] == 0.0, r


# ---------------------------------------------------------------------------------------
# argument checks (no launch)
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tv():
    from vllm_platform_ext.ops.turboquant import triton_verify

    return triton_verify


@pytest.fixture(scope="module")
def lp():
    from vllm_platform_ext.ops.turboquant import launch_policy

    return launch_policy


@pytest.fixture(scope="module")
def wsm():
    from vllm_platform_ext.ops.turboquant import workspace

    return workspace


def test_trace_launches_records_only_inside_and_nests(tv):
    """The op's debug hook: nothing is kept outside a trace; an inner trace sees its own calls and
    hands them on to the outer one."""
    tv._record("v2", 3, 1)
    with tv.trace_launches() as outer:
        tv._record("v1", 2, 1)
        with tv.trace_launches() as inner:
            tv._record("gluon_t_k8v4", 64, 4)
        assert inner == [tv.Launch("gluon_t_k8v4", 64, 4)] and inner[0].plan == (64, 4)
    assert outer == [tv.Launch("v1", 2, 1), tv.Launch("gluon_t_k8v4", 64, 4)]
    assert tv._TRACE is None


def _args(preset="turboquant_4bit_nc", d=32, hk=2):
    view, c, H = _cache(preset, d, hk, nb=2)
    return view, c, H


def test_rejects_non_uniform_and_bad_shapes(tv):
    view, c, H = _args()
    sl = torch.tensor([5, 6], dtype=torch.int32)
    bt = torch.zeros(2, 2, dtype=torch.int32)
    kw = dict(preset="turboquant_4bit_nc", scale=0.1, centroids=c, PiT=H)
    with pytest.raises(ValueError, match="not uniform"):
        tv.turboquant_verify_attention(torch.zeros(7, 4, 32), view, bt, sl, 4, **kw)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        tv.turboquant_verify_attention(torch.zeros(8, 3, 32), view, bt, sl, 4, **kw)
    with pytest.raises(ValueError, match="head dim 48"):
        tv.turboquant_verify_attention(torch.zeros(8, 4, 48), view, bt, sl, 4, **kw)
    with pytest.raises(ValueError, match="seq_lens must be int32"):
        tv.turboquant_verify_attention(torch.zeros(8, 4, 32), view, bt, sl.long(), 4, **kw)
    with pytest.raises(ValueError, match="query dtype"):
        tv.turboquant_verify_attention(torch.zeros(8, 4, 32, dtype=torch.float64), view, bt, sl, 4, **kw)
    with pytest.raises(ValueError, match="centroids"):
        tv.turboquant_verify_attention(torch.zeros(8, 4, 32), view, bt, sl, 4, **{**kw, "centroids": c[:8]})
    with pytest.raises(ValueError, match="slot"):
        tv.turboquant_verify_attention(torch.zeros(8, 4, 32), view[..., :10], bt, sl, 4, **kw)


def test_workspace_is_sized_max_num_seqs_times_k_plus_1(tv, lp, wsm):
    ws = tv.VerifyWorkspace.allocate(max_num_seqs=8, max_query_len=4, num_q_heads=4, head_dim=32, max_kv_splits=3,
                                     device="cpu")
    assert tuple(ws.mid.shape) == (32, 4, 3, 33)
    view, c, H = _args()
    kw = dict(preset="turboquant_4bit_nc", scale=0.1, centroids=c, PiT=H, workspace=ws)
    with pytest.raises(ValueError, match="workspace .* too small"):
        # 9 requests x 4 rows = 36 > 32 rows (the max_num_seqs-rows overflow of the upstream routing)
        tv.turboquant_verify_attention(torch.zeros(36, 4, 32), view, torch.zeros(9, 2, dtype=torch.int32),
                                       torch.ones(9, dtype=torch.int32), 4, **kw)
    # fewer rows may use more splits (the front of the contiguous workspace): 8 rows hold 12, not 13
    assert wsm.workspace_splits(ws.mid, 8, 4, 32) == 12 and wsm.workspace_splits(ws.mid, 32, 4, 32) == 3
    assert tuple(wsm._workspace_view(ws.mid, 8, 4, 12, 32).shape) == (8, 4, 12, 33)
    assert wsm._workspace_view(ws.mid, 8, 4, 12, 32).data_ptr() == ws.mid.data_ptr()
    with pytest.raises(ValueError, match="workspace .* too small"):
        tv.turboquant_verify_attention(torch.zeros(8, 4, 32), view, torch.zeros(2, 2, dtype=torch.int32),
                                       torch.ones(2, dtype=torch.int32), 4, **kw, num_kv_splits=13)
    # a strided (non-contiguous) workspace is only used within its own dimensions
    with pytest.raises(ValueError, match="workspace .* too small"):
        wsm._workspace_view(ws.mid[:, :, :2], 8, 4, 3, 32)
    # the default split dimension holds one request's SMALL_BATCH_MAX_SPLITS partials
    assert tv.VerifyWorkspace.allocate(1, 4, 4, 32, device="cpu").max_kv_splits == lp.SMALL_BATCH_MAX_SPLITS
    assert tv.VerifyWorkspace.allocate(8, 4, 4, 32, device="cpu").max_kv_splits == lp.DEFAULT_MAX_KV_SPLITS


def test_small_batch_split_plan_depends_only_on_shapes(tv, lp):
    """Where programs x DEFAULT_MAX_KV_SPLITS fill at most half the SMs and a program holds <= 32
    rows (one request, 16/2 heads, K+1 <= 4), SMALL_BATCH_MAX_SPLITS splits of at least
    min(SMALL_BATCH_MIN_TILES, a 32-split's tiles), bounded by the workspace; otherwise the
    whole-wave split count with one tile minimum (132 SMs assumed off CUDA)."""
    dev = torch.device("cpu")
    big = lp.SMALL_BATCH_MAX_SPLITS * 8
    small = (lp.SMALL_BATCH_MAX_SPLITS, lp.SMALL_BATCH_MIN_TILES)
    assert lp.gluon_split_plan(2, dev, 32, 3, big, 32) == small  # 16/2 heads, B = 1, K+1 = 4
    assert lp.gluon_split_plan(2, dev, 32, 3, big, 8) == small  # plain decode
    assert lp.gluon_split_plan(2, dev, 32, 3, 40, 8) == (40, lp.SMALL_BATCH_MIN_TILES)  # the workspace holds 40
    assert lp.gluon_split_plan(2, dev, 32, 3, 32, 8) == (32, 1)  # ... or only the usual 32
    assert lp.gluon_split_plan(2, dev, 32, 1, big, 48)[1] == 1  # 48-row programs (K+1 = 6): as before
    for programs in (4, 8, 32, 256, 1024):  # 24/4 heads at B = 1 and every larger batch: as before
        assert lp.gluon_split_plan(programs, dev, 32, 3, big, 8) == (lp.gluon_num_kv_splits(programs, dev, 32, 3), 1)


def test_split_tiles_keep_short_contexts_and_spread_long_ones(tv, lp):
    """64 splits with the 4-tile minimum: 4K and 8K keep the 32-split lengths (2 and 4 tiles of 64),
    16K and 32K get 4 and 8 tiles (64 splits used); one tile minimum is the plain whole-tile cut."""
    for ctx, want in ((4096, 2), (4101, 3), (8192, 4), (16384, 4), (20000, 5), (32768, 8), (0, 0), (1, 1)):
        assert lp.split_tiles(ctx, 64, 64, 4) == want, ctx
        if ctx <= 8192:
            assert lp.split_tiles(ctx, 64, 64, 4) == lp.split_tiles(ctx, 32, 64), ctx
    assert lp.split_tiles(4096, 64, 64) == 1 and lp.split_tiles(32768, 64, 64) == 8


def _stage2_check() -> dict:
    """Stage 2 alone (interpreter): random partials, some splits empty for a row (log-sum-exp -inf,
    NaN outputs that must be dropped), a row with every split empty (zeros), split counts that are
    not powers of two or multiples of the unroll; against the float64 merge."""
    from vllm_platform_ext.ops.turboquant import byte_kernels as KV1

    torch.manual_seed(0)
    res = []
    for splits in (1, 3, 20, 64):
        n, hq, d = 3, 2, 32
        mid = torch.randn(n, hq, splits, d + 1)
        mid[..., d] *= 3
        empty = torch.rand(n, hq, splits) < 0.3
        empty[2] = True  # a row that sees nothing
        mid[..., d][empty] = float("-inf")
        mid[..., :d][empty] = float("nan")
        lse = mid[..., d].double()
        w = torch.exp2(lse - lse.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0))
        o = torch.where(empty[..., None], 0.0, mid[..., :d].double())
        want = (w[..., None] * o).sum(2) / w.sum(2, keepdim=True).clamp_min(1e-300)
        out = torch.empty(n, hq, d)
        KV1._tq_verify_stage2[(n, hq)](mid, out, mid.stride(0), mid.stride(1), mid.stride(2), out.stride(0),
                                      out.stride(1), splits, D=d, S_POW2=max(1, 1 << (splits - 1).bit_length()))
        res.append({"splits": splits, "err": float((out.double() - want).abs().max()),
                    "finite": bool(torch.isfinite(out).all()), "zero_row": float(out[2].abs().max())})
    return {"results": res}


def test_stage2_merges_every_split_and_drops_empty_ones():
    res = _interpreted("--stage2", 600)
    assert len(res) == 4
    for r in res:
        assert r["finite"] and r["err"] < 1e-5 and r["zero_row"] == 0.0, r


def test_default_split_count_depends_only_on_shapes(tv, lp):
    dev = torch.device("cpu")
    assert lp.default_num_kv_splits(1, 4, 1, dev, 32) == 32
    assert lp.default_num_kv_splits(64, 4, 1, dev, 32) == 2
    assert lp.default_num_kv_splits(1000, 4, 1, dev, 32) == 1


def test_shape_rules_depend_on_shapes_only():
    """V2_SHAPE_RULES: plain decode over >= 128 (request, KV head, chunk) programs and small verify
    batches (<= 32 programs with K+1 <= 4, or <= 8 programs) get their measured settings;
    everything else keeps the table."""
    from vllm_platform_ext.ops.turboquant import launch_policy as LP

    base = LP.V2_LAUNCH_DEFAULTS["turboquant_k8v4"]
    c = LP.v2_launch_config("turboquant_k8v4", 32, 4, 1, 1)
    assert (c["BLOCK_N"], c["ASM_SPLIT"], c["maxnreg"]) == (64, True, 168)
    assert LP.v2_launch_config("turboquant_k8v4", 31, 4, 1, 1) == base  # 124 programs
    assert LP.v2_launch_config("turboquant_k8v4", 64, 4, 2, 1) == base  # verify, many programs
    c = LP.v2_launch_config("turboquant_k8v4", 8, 4, 4, 1)  # 32 programs, K+1 = 4
    assert (c["BLOCK_N"], c["num_stages"]) == (64, 3)
    assert LP.v2_launch_config("turboquant_k8v4", 9, 4, 4, 1) == base  # 36 programs
    assert LP.v2_launch_config("turboquant_k8v4", 8, 4, 6, 2) == base  # K = 5, 64 programs
    assert LP.v2_launch_config("turboquant_k8v4", 1, 4, 6, 2)["num_stages"] == 3  # K = 5, 8 programs
    assert LP.v2_launch_config("turboquant_k8v4", 1, 4, 1, 1) == base  # tiny plain decode
    for preset in ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"):
        assert LP.v2_launch_config(preset, 64, 4, 1, 1) == LP.V2_LAUNCH_DEFAULTS[preset]
    assert LP.v2_launch_config("turboquant_k8v4", 32, 4, 1, 1) is not base  # the table is not mutated


def test_gluon_rules_and_fallback(monkeypatch):
    """GLUON_SHAPE_RULES: one stage with at most 168 registers by default; <= 8 programs (one
    request) two stages uncapped; K+1 = 3-4 on Hopper's warpgroup MMAs up to 32 rows; K+1 = 1-4
    over > 8 programs read the block-table entries a tile ahead (PREFETCH); K+1 >= 5 one
    64-row program, over >= 256 programs up to 40 rows on the transposed kernel; plain decode always on it (8 rows); the MSE presets have their own
    one-buffer entries; USE_GLUON = False turns it off; under the interpreter (and where Triton has no Gluon) the v2
    kernel runs, so the CPU interpreter tests above exercise v2 for every preset."""
    from vllm_platform_ext.ops.turboquant import triton_verify as TV
    from vllm_platform_ext.ops.turboquant import launch_policy as LP

    base = LP.GLUON_LAUNCH_DEFAULTS["turboquant_k8v4"]
    assert (base["num_stages"], base["maxnreg"], base["MAX_BLOCK_M"]) == (1, 168, 32)
    # 256 programs, K = 3: the defaults; on Hopper up to 32 rows on warpgroup MMAs, one stage, 168 registers,
    # block-table entries a tile ahead
    assert LP.gluon_launch_config("turboquant_k8v4", 64, 4, 4, 1) == {**base, "WGMMA": True, "WG_ROWS": 32,
                                                                      "WG_DEPTH": 0, "PREFETCH": True}
    assert LP.gluon_launch_config("turboquant_k8v4", 64, 4, 3, 1)["WGMMA"]  # K = 2
    assert LP.gluon_launch_config("turboquant_k8v4", 64, 4, 2, 1) == {**base, "PREFETCH": True}  # K = 1
    assert LP.gluon_launch_config("turboquant_k8v4", 2, 4, 2, 1) == {**base, "num_stages": 2, "maxnreg": None}
    c = LP.gluon_launch_config("turboquant_k8v4", 64, 4, 6, 2)  # K = 5: no block-table prefetch
    assert not c.get("PREFETCH") and c["WGMMA"]
    c = LP.gluon_launch_config("turboquant_k8v4", 8, 4, 1, 1)  # 32 programs, K = 0: block table ahead
    assert c == {**base, "PREFETCH": True}
    c = LP.gluon_launch_config("turboquant_k8v4", 1, 4, 4, 1)  # 4 programs
    assert (c["num_stages"], c["maxnreg"], c["MAX_BLOCK_M"]) == (2, None, 32)
    c = LP.gluon_launch_config("turboquant_k8v4", 8, 4, 6, 2)  # K = 5, 64 programs
    assert (c["num_stages"], c["maxnreg"], c["MAX_BLOCK_M"], c["TRANSPOSED_ROWS"]) == (2, None, 64, 8)
    c = LP.gluon_launch_config("turboquant_k8v4", 64, 4, 6, 2)  # K = 5, 512 programs: 36 rows transposed
    assert (c["num_stages"], c["maxnreg"], c["MAX_BLOCK_M"], c["TRANSPOSED_ROWS"]) == (2, None, 64, 40)
    assert base["TRANSPOSED_ROWS"] == 8  # plain decode (GQA <= 8) always
    assert LP.gluon_launch_config("turboquant_k8v4", 64, 4, 1, 1) is not base  # the table is not mutated
    for preset in ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"):
        c = LP.gluon_launch_config(preset, 64, 4, 4, 1)
        assert c["num_stages"] == 1 and c["BLOCK_N"] == 64 and c["maxnreg"] == 168  # one shared buffer
        c = LP.gluon_launch_config(preset, 1, 4, 4, 1)  # one request: no register cap
        assert (c["num_stages"], c["maxnreg"], c["MAX_BLOCK_M"]) == (1, None, 32)
        c = LP.gluon_launch_config(preset, 8, 4, 6, 2)  # K = 5: one 64-row program, no cap, no stages
        assert (c["num_stages"], c["maxnreg"], c["MAX_BLOCK_M"], c["TRANSPOSED_ROWS"]) == (1, None, 64, 8)
        c = LP.gluon_launch_config(preset, 32, 4, 6, 2)  # K = 5, 256 programs: transposed up to 40 rows
        assert (c["num_stages"], c["maxnreg"], c["TRANSPOSED_ROWS"]) == (1, None, 40)
    LP.USE_GLUON = False
    try:
        assert LP.gluon_launch_config("turboquant_k8v4", 64, 4, 4, 1) is None
    finally:
        LP.USE_GLUON = True
    from vllm_platform_ext.ops import turboquant as tq_ops

    maca = [o for o in tq_ops.OPS if o.platform == "maca"][0]
    assert maca.config["gluon"] is False  # NVIDIA PTX inside: MetaX keeps the Triton kernel
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # put back as it was, set or not
    assert not TV._gluon_ok()


if __name__ == "__main__" and "--interp" in sys.argv:
    print(json.dumps(_interp_check()))
if __name__ == "__main__" and "--stage2" in sys.argv:
    print(json.dumps(_stage2_check()))
if __name__ == "__main__" and "--padded" in sys.argv:
    print(json.dumps(_padded_check()))



def test_transposed_row_groups():
    """Row groups of the transposed Gluon kernel: powers of two covering the rows rounded up to 8."""
    from vllm_platform_ext.ops.turboquant import launch_policy as LP

    assert [LP.transposed_row_groups(r) for r in (1, 6, 8, 12, 16, 24, 32, 36, 40, 48, 56, 64)] == [
        (8, 0), (8, 0), (8, 0), (16, 0), (16, 0), (16, 8), (32, 0), (32, 8), (32, 8), (32, 16), (32, 32), (64, 0)]
    with pytest.raises(ValueError, match="1..64 rows"):
        LP.transposed_row_groups(65)


def test_gluon_query_order_pairs_with_the_key_decodes():
    """The query's head-dim order for the Gluon kernels, against its definition element by element:
    column m * 64 + 16 c + r (r = 2t + i + 8h) holds element 4 (16c + 2t + 8h + m // 2) + 2 (m % 2) + i
    (the pairs the wide key decodes give MMA sub-tile m; see ptx.FP8W / LUT8W)."""
    from vllm_platform_ext.ops.turboquant import triton_verify as TV

    q = torch.randn(3, 5, 256)
    got = TV.gluon_query_order(q)
    for m in range(4):
        for c in range(4):
            for r in range(16):
                t, i, h = (r // 2) % 4, r % 2, r // 8
                elem = 4 * (16 * c + 2 * t + 8 * h + m // 2) + 2 * (m % 2) + i
                assert torch.equal(got[:, :, m * 64 + 16 * c + r], q[:, :, elem]), (m, c, r)
    # the kernels' in-load form of the same order (gluon_verify._load_query)
    for e in range(4):
        for j in range(64):
            assert torch.equal(got[:, :, e * 64 + j], q[:, :, 8 * (j // 2) + 2 * e + j % 2]), (e, j)
    with pytest.raises(ValueError, match="head dim 256"):
        TV.gluon_query_order(torch.randn(1, 1, 128))
