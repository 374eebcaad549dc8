"""Benchmark: TurboQuant K+1 verify attention, ours vs vLLM 0.32's kernels, on one GPU.

* ours: ``triton_verify.turboquant_verify_attention`` (CUDA-graph timed);
* (a) vLLM's per-request path: the continuation branch of ``_prefill_attention``, one decode
  kernel call per request with ``synth_seq_lens`` (eager, as vLLM runs it; no buffers passed);
* (b) the B*(K+1)-row routing through vLLM's decode kernel (upstream PR #40914 / Genesis P67b),
  buffers preallocated, CUDA-graph timed; for K = 0 this is vLLM's plain decode.

vLLM's Triton files come from ``VLLM_TQ_SRC`` (copies from the wheel) or an installed vLLM.
``%bound`` = time to read the compressed cache once at the measured copy bandwidth / time.

    python benchmarks/bench_turboquant.py [--quick] [--out results.md]

The cache uses vLLM 0.32's page layout (LBNHC: ``[block, position, kv head, slot]``). Launch
configs are the shipped per-preset tables (``launch_policy``); sweeps that
chose it: ``benchmarks/profile_turboquant.py sweep``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from bench_common import copy_bandwidth, eager_ms, graph_ms, run_header, write_result

from vllm_platform_ext.ops.turboquant import layout as L
from vllm_platform_ext.ops.turboquant import triton_verify as TV
from vllm_platform_ext.ops.turboquant import launch_policy as LP
from vllm_platform_ext.testing import turboquant_upstream

D = 256
PAGE = 16
FULL = ["turboquant_k8v4", "turboquant_3bit_nc"]
PARTIAL = ["turboquant_4bit_nc", "turboquant_k3v4_nc"]


def build_cache(preset: str, hk: int, ctx: int, bmax: int, gen: torch.Generator, layout: str = "vllm"):
    """Random valid cache bytes. ``layout="vllm"``: vLLM 0.32's LBNHC page, ``[block, position,
    kv head, slot]`` contiguous (the view its TurboQuant backend hands the kernels); ``"head"``:
    head-major pages ``[block, kv head, position, slot]`` seen through the same logical view."""
    lay = L.layout_for(preset, D)
    nblk = ctx // PAGE
    total = bmax * nblk + 1
    if layout == "vllm":
        cache = torch.randint(0, 256, (total, PAGE, hk, lay.slot_size_aligned), dtype=torch.uint8, device="cuda")
        view = cache
    elif layout == "head":
        cache = torch.randint(0, 256, (total, hk, PAGE, lay.slot_size_aligned), dtype=torch.uint8, device="cuda")
        view = cache.transpose(1, 2)
    else:
        raise ValueError(f"layout {layout!r}: vllm or head")
    if lay.key_fp8:
        view[..., : lay.head_dim] &= 0xBF  # finite fp8 keys (|k| < 2)
    else:
        view[..., lay.norm_offset : lay.norm_offset + 2] = L.fp16_to_bytes(torch.tensor(1.0)).cuda()
    view[..., lay.scale_offset : lay.scale_offset + 2] = L.fp16_to_bytes(torch.tensor(0.05)).cuda()
    view[..., lay.scale_offset + 2 : lay.scale_offset + 4] = L.fp16_to_bytes(torch.tensor(-0.4)).cuda()
    perm = (torch.randperm(total - 1, generator=gen) + 1).int().cuda()
    bt = perm[: bmax * nblk].view(bmax, nblk).contiguous()
    return lay, cache, view, bt


def bench_case(up, lay, view, bt_all, ctx, b, k, hq, hk, bw, ws, arange_cache):
    k1 = k + 1
    preset = lay.preset
    cent = L.lloyd_max_centroids(D, lay.centroid_bits).cuda()
    H = L.hadamard(D, "cuda")
    bt = bt_all[:b]
    sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(b * k1, hq, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    scale = D**-0.5

    ours = lambda: TV.turboquant_verify_attention(  # noqa: E731
        q, view, bt, sl, k1, preset=preset, scale=scale, centroids=cent, PiT=H, workspace=ws, out=out)
    t_ours = graph_ms(ours)
    nbytes = b * ctx * hk * lay.slot_size

    offs = torch.arange(k1, device="cuda", dtype=torch.int32)
    synth_sl = (sl[:, None] - k1 + 1 + offs[None, :]).reshape(-1).contiguous()
    synth_bt = bt.repeat_interleave(k1, dim=0).contiguous()
    S = 32
    mid = torch.empty(b * k1, hq, S, D + 1, dtype=torch.float32, device="cuda")
    obuf = torch.empty(b * k1, hq, D, dtype=torch.bfloat16, device="cuda")
    lbuf = torch.empty(b * k1, hq, dtype=torch.float32, device="cuda")
    common = dict(Pi=H, centroids=cent, scale=scale, mse_bits=lay.key_bits, key_packed_size=lay.key_packed_size,
                  value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8, norm_correction=lay.norm_correction, PiT=H)
    route_b = lambda: up.decode.triton_turboquant_decode_attention(  # noqa: E731
        q, view, synth_bt, synth_sl, mid_o_buf=mid, output_buf=obuf, lse_buf=lbuf, max_num_kv_splits=S, **common)
    t_b = graph_ms(route_b)
    err = ((out.float() - obuf.float()).abs().max() / obuf.float().abs().max().clamp_min(1e-6)).item()

    t_a = None
    if k >= 1:
        def route_a():
            for i in range(b):  # vLLM _prefill_attention, continuation chunk q_len <= 128
                up.decode.triton_turboquant_decode_attention(
                    q[i * k1 : (i + 1) * k1], view, bt[i : i + 1].expand(k1, -1),
                    arange_cache[ctx - k1 + 1 : ctx + 1], **common)
        route_a()
        t_a = eager_ms(route_a, warmup=1, rep=25)
    return {
        "preset": preset.replace("turboquant_", ""), "heads": f"{hq}/{hk}", "ctx": ctx, "B": b, "K": k,
        "ours_ms": t_ours, "a_ms": t_a, "b_ms": t_b,
        "x_vs_b": t_b / t_ours, "x_vs_a": (t_a / t_ours) if t_a else None,
        "pct_bound": 100 * (nbytes / bw * 1e3) / t_ours, "b_pct_bound": 100 * (nbytes / bw * 1e3) / t_b,
        "rel_diff_vs_b": err,
    }


def fmt(rows):
    hdr = "| preset | heads | ctx | B | K | ours ms | (a) per-req ms | (b) B(K+1)-row ms | ours vs (b) | ours vs (a) | ours % HBM bound | (b) % bound | rel diff vs (b) |"
    lines = [hdr, "|" + "---|" * 13]
    for r in rows:
        a = f"{r['a_ms']:.3f}" if r["a_ms"] is not None else "n/a"
        xa = f"{r['x_vs_a']:.1f}x" if r["x_vs_a"] is not None else "n/a"
        lines.append(
            f"| {r['preset']} | {r['heads']} | {r['ctx'] // 1024}K | {r['B']} | {r['K']} | {r['ours_ms']:.3f} | {a} | "
            f"{r['b_ms']:.3f} | {r['x_vs_b']:.1f}x | {xa} | {r['pct_bound']:.0f}% | {r['b_pct_bound']:.1f}% | {r['rel_diff_vs_b']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few cases only")
    ap.add_argument("--out", default=None)
    ap.add_argument("--presets", default=None, help="comma list; default k8v4+3bit_nc full, 4bit_nc+k3v4_nc partial")
    args = ap.parse_args()
    up = turboquant_upstream.load(os.environ.get("VLLM_TQ_SRC"))
    bw = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()} copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    gen = torch.Generator().manual_seed(0)
    arange_cache = torch.arange(0, 32768 + 2, device="cuda", dtype=torch.int32)
    rows = []
    plan = []
    presets = args.presets.split(",") if args.presets else FULL + PARTIAL
    for preset in presets:
        full = preset in FULL
        for hq, hk in ((24, 4), (16, 2)):
            if not full and hk == 2:
                continue
            for ctx in (4096, 32768):
                bs = (1, 8, 32, 64) if full else (8, 64)
                ks = (0, 1, 3, 5) if full else (0, 3)
                if args.quick:
                    bs, ks = (8, 64), (0, 3)
                plan.append((preset, hq, hk, ctx, bs, ks))
    t0 = time.time()
    for preset, hq, hk, ctx, bs, ks in plan:
        lay, cache, view, bt = build_cache(preset, hk, ctx, max(bs), gen)
        ws = TV.VerifyWorkspace.allocate(max(bs), max(ks) + 1, hq, D, device="cuda")
        for b in bs:
            for k in ks:
                r = bench_case(up, lay, view, bt, ctx, b, k, hq, hk, bw, ws, arange_cache)
                rows.append(r)
                print(json.dumps(r), flush=True)
        del cache, view, bt, ws
        torch.cuda.empty_cache()
    print(f"bench time {time.time() - t0:.0f}s")
    table = fmt(rows)
    print(table)
    if args.out:
        head = run_header(copy_bandwidth=f"{bw / 1e12:.2f} TB/s",
                          vllm_kernels=os.environ.get("VLLM_TQ_SRC") or "the installed vLLM")
        settings = (f"v2 launch table {json.dumps(LP.V2_LAUNCH_DEFAULTS)}, shape rules {json.dumps(LP.V2_SHAPE_RULES)}, "
                    f"Gluon {json.dumps(LP.GLUON_LAUNCH_DEFAULTS) if LP.USE_GLUON else 'off'}, "
                    f"rules {json.dumps(LP.GLUON_SHAPE_RULES)}")
        write_result(args.out, "TurboQuant K+1 verify attention: ours vs vLLM's kernels", head,
                     f"{table}\n\n## Launch settings of this run\n\n{settings}\n", {"bw": bw, "rows": rows})


if __name__ == "__main__":
    sys.exit(main())
