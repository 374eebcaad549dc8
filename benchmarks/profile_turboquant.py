"""Profile / sweep helper for the TurboQuant verify kernel (GPU machine; torch + Triton only).

    python benchmarks/profile_turboquant.py sweep [--out DIR]     launch-config sweep, both cache layouts
    python benchmarks/profile_turboquant.py grid SPEC.json        configs x cases (see grid_mode;
                                                                  the shape rules' grid: results/bench/2026-11-22-turboquant-tuning/turboquant_grid_rules.json,
                                                                  the Gluon kernel's: results/bench/2026-11-22-turboquant-tuning/turboquant_grid_gluon.json)
    python benchmarks/profile_turboquant.py case PRESET B K [CFG_JSON] [--layout vllm|head]
                                                                  one case, a few launches (for ncu)

Cache layouts: ``vllm`` is vLLM 0.32's LBNHC page ``[block, position, kv head, slot]``
(what the TurboQuant backend hands its kernels after ``kv_cache.transpose(1, 2)``); ``head`` is a
head-major page (``[block, kv head, position, slot]`` viewed as ``[block, position, kv head, slot]``).
"""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_turboquant as BT  # noqa: E402
from bench_common import copy_bandwidth, graph_ms  # noqa: E402

from vllm_platform_ext.ops.turboquant import layout as L  # noqa: E402
from vllm_platform_ext.ops.turboquant import triton_verify as TV  # noqa: E402
from vllm_platform_ext.ops.turboquant import word_kernels as KV2  # noqa: E402
from vllm_platform_ext.ops.turboquant import launch_policy as LP  # noqa: E402

D = 256


def run_case(preset, b, k, cfg, layout="vllm", hq=24, hk=4, ctx=32768, bw=None, cache=None, reps=20):
    gen = torch.Generator().manual_seed(0)
    lay, _, view, bt = cache or BT.build_cache(preset, hk, ctx, b, gen, layout=layout)
    saved = dict(LP.V2_LAUNCH_DEFAULTS[preset])
    saved_rules = LP.V2_SHAPE_RULES
    saved_g = (dict(LP.GLUON_LAUNCH_DEFAULTS), LP.GLUON_SHAPE_RULES, LP.USE_GLUON)
    cfg = dict(cfg)
    call = {k: cfg.pop(k) for k in ("BLOCK_M", "num_kv_splits") if k in cfg}
    gluon = cfg.pop("GLUON", None)
    keep_rules = cfg.pop("RULES", False)
    if gluon:  # {"GLUON": true, ...}: the Gluon kernel with these settings ("RULES": true: shape rules still apply)
        LP.GLUON_LAUNCH_DEFAULTS[preset] = {**LP.GLUON_LAUNCH_DEFAULTS.get(preset, {}), **cfg}
        if not keep_rules:
            LP.GLUON_SHAPE_RULES = {}
    else:
        LP.V2_LAUNCH_DEFAULTS[preset] = {**saved, **cfg}
    if cfg or call or gluon is not None:  # an explicit config is timed as given; {} times what ships
        LP.V2_SHAPE_RULES = {}
        LP.USE_GLUON = bool(gluon)
    try:
        k1 = k + 1
        cent = L.lloyd_max_centroids(D, lay.centroid_bits).cuda()
        H = L.hadamard(D, "cuda")
        sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(b * k1, hq, D, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(1))
        o = torch.empty_like(q)
        ws = TV.VerifyWorkspace.allocate(b, k1, hq, D, device="cuda")
        f = lambda: TV.turboquant_verify_attention(  # noqa: E731
            q, view, bt[:b], sl, k1, preset=preset, scale=D**-0.5, centroids=cent, PiT=H, out=o, workspace=ws, **call)
        f()
        t = graph_ms(f, rep=reps) if reps else None
        nbytes = b * ctx * hk * lay.slot_size
        pct = 100 * (nbytes / bw * 1e3) / t if (bw and t) else None
        return t, pct, o.clone()
    finally:
        LP.V2_LAUNCH_DEFAULTS[preset] = saved
        LP.V2_SHAPE_RULES = saved_rules
        LP.GLUON_LAUNCH_DEFAULTS, LP.GLUON_SHAPE_RULES, LP.USE_GLUON = saved_g


def compiled_kernels(fn):
    """CompiledKernel objects Triton holds for ``fn`` (any Triton 3.x cache shape)."""
    found = []

    def walk(x, depth=0):
        if depth > 4:
            return
        if hasattr(x, "asm") and hasattr(x, "n_regs"):
            found.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v, depth + 1)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v, depth + 1)

    walk(getattr(fn, "device_caches", {}))
    walk(getattr(fn, "cache", {}))
    return found


def sass_stats(k):
    try:
        sass = k.asm["sass"]
    except Exception:  # noqa: BLE001
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
            fh.write(k.asm["cubin"])
        sass = subprocess.run(["cuobjdump", "--dump-sass", fh.name], capture_output=True, text=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?", line)
        if m:
            ops[m.group(2)] += 1
    return ops, sass


def grid_mode(spec, bw, gen, outdir):
    """spec: {"cases": [[preset, B, K, ctx], ...], "configs": {preset: [cfg, ...]}, "waves": [..]}.
    Times every config of a preset on every case of it (the shipped table first) and checks each
    output against the shipped config's (max relative difference)."""
    lines = []
    for case in spec["cases"]:
        preset, b, k, ctx = case[:4]
        hq, hk = case[4:6] if len(case) > 4 else (24, 4)
        cache = BT.build_cache(preset, hk, ctx, b, gen, layout="vllm")
        heads = dict(hq=hq, hk=hk, ctx=ctx, bw=bw, cache=cache)
        t0, pct0, o0 = run_case(preset, b, k, {}, "vllm", **heads)
        line = f"{preset} {hq}/{hk} B={b} K={k} ctx={ctx} shipped {t0:.4f} ms {pct0:.1f}%"
        print(line, flush=True)
        lines.append(line)
        for cfg in spec["configs"].get(preset, []):
            try:
                t, pct, o = run_case(preset, b, k, cfg, "vllm", **heads)
            except Exception as exc:  # noqa: BLE001
                line = f"   fail {json.dumps(cfg)} {type(exc).__name__}: {str(exc)[:200]}"
            else:
                err = ((o.float() - o0.float()).abs().max() / o0.float().abs().max()).item()
                line = f"   {json.dumps(cfg)} {t:.4f} ms {pct:.1f}% x{t0 / t:.2f} err {err:.1e}"
            print(line, flush=True)
            lines.append(line)
        for waves in spec.get("waves", []):
            LP.V2_SPLIT_WAVES, saved = waves, LP.V2_SPLIT_WAVES
            t, pct, _ = run_case(preset, b, k, {}, "vllm", **heads)
            LP.V2_SPLIT_WAVES = saved
            line = f"   waves {waves} {t:.4f} ms x{t0 / t:.2f}"
            print(line, flush=True)
            lines.append(line)
        del cache
        torch.cuda.empty_cache()
    with open(os.path.join(outdir, "grid.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


def main() -> None:
    mode = sys.argv[1]
    outdir = os.environ.get("OUT", "/tmp")
    if mode == "case":
        preset, b, k = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        cfg = json.loads(sys.argv[5]) if len(sys.argv) > 5 and not sys.argv[5].startswith("--") else {}
        layout = sys.argv[sys.argv.index("--layout") + 1] if "--layout" in sys.argv else "vllm"
        run_case(preset, b, k, cfg, layout, reps=0)
        torch.cuda.synchronize()
        return
    bw = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()} bw {bw / 1e12:.2f} TB/s", flush=True)
    gen = torch.Generator().manual_seed(0)
    lines = []
    if mode == "grid":
        grid_mode(json.load(open(sys.argv[2])), bw, gen, outdir)
        return

    def log(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        lines.append(s)

    # correctness of the asm dequant variants against the portable path, both layouts
    for preset in ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc"):
        for layout in ("vllm", "head"):
            cache = BT.build_cache(preset, 4, 4096, 8, gen, layout=layout)
            _, _, o0 = run_case(preset, 8, 3, {}, layout, ctx=4096, cache=cache, reps=0)
            _, _, o1 = run_case(preset, 8, 3, {"FP8_ASM": True, "NIB_ASM": True}, layout, ctx=4096, cache=cache, reps=0)
            err = ((o0.float() - o1.float()).abs().max() / o0.float().abs().max()).item()
            log("asm-check", preset, layout, f"{err:.2e}")
            del cache
    A = dict(FP8_ASM=True, NIB_ASM=True)
    sweeps = {
        "turboquant_k8v4": [dict(BLOCK_N=64, num_warps=4, num_stages=2, FP8_ASM=False, NIB_ASM=False)]
        + [dict(BLOCK_N=bn, num_warps=nw, num_stages=ns, **A)
           for bn, nw, ns in ((64, 4, 2), (64, 4, 1), (64, 8, 2), (128, 4, 2), (128, 8, 2), (32, 4, 2), (32, 4, 3))],
        "turboquant_4bit_nc": [dict(BLOCK_N=64, num_warps=4, PREFETCH=pf, NIB_ASM=a) for a in (False, True) for pf in (False, True)],
        "turboquant_3bit_nc": [dict(BLOCK_N=bn, num_warps=nw, PREFETCH=True) for bn in (32, 64) for nw in (4, 8)],
        "turboquant_k3v4_nc": [dict(BLOCK_N=64, num_warps=4, PREFETCH=pf, NIB_ASM=True) for pf in (False, True)],
    }
    best = {}
    for preset, cfgs in sweeps.items():
        for layout in ("vllm",):
            cache = BT.build_cache(preset, 4, 32768, 64, gen, layout=layout)
            res = []
            for cfg in cfgs:
                try:
                    t, pct, _ = run_case(preset, 64, 3, cfg, layout, bw=bw, cache=cache)
                except Exception as exc:  # noqa: BLE001
                    log("fail", preset, layout, json.dumps(cfg), type(exc).__name__, str(exc)[:300])
                    continue
                log("sweep", preset, layout, json.dumps(cfg), f"{t:.3f} ms {pct:.1f}%")
                res.append((t, cfg))
            t, cfg = min(res, key=lambda x: x[0])
            best[(preset, layout)] = cfg
            log("best", preset, layout, json.dumps(cfg), f"{t:.3f} ms")
            for k in (0, 1, 5):
                t, pct, _ = run_case(preset, 64, k, cfg, layout, bw=bw, cache=cache)
                log("shape", preset, layout, "B=64 K=", k, json.dumps(cfg), f"{t:.3f} ms {pct:.1f}%")
            for extra in (dict(num_warps=8), dict(BLOCK_M=32), dict(BLOCK_M=32, num_warps=8), dict(BLOCK_N=32, num_warps=8)):
                c2 = {**cfg, **extra}
                t, pct, _ = run_case(preset, 64, 5, c2, layout, bw=bw, cache=cache)
                log("k5", preset, layout, json.dumps(c2), f"{t:.3f} ms {pct:.1f}%")
            t, pct, _ = run_case(preset, 64, 3, cfg, "head", bw=bw)
            log("head-layout", preset, json.dumps(cfg), f"{t:.3f} ms {pct:.1f}%")
            for waves in (4, 16):
                LP.V2_SPLIT_WAVES, saved = waves, LP.V2_SPLIT_WAVES
                t, pct, _ = run_case(preset, 64, 3, cfg, layout, bw=bw, cache=cache)
                LP.V2_SPLIT_WAVES = saved
                log("waves", preset, layout, waves, f"{t:.3f} ms {pct:.1f}%")
            del cache
            torch.cuda.empty_cache()
    for kern in compiled_kernels(KV2._tq_verify_v2):
        try:
            ops, sass = sass_stats(kern)
        except Exception as exc:  # noqa: BLE001
            log("sass failed", exc)
            continue
        name = getattr(kern, "name", "?")
        log("kernel", name, "regs", kern.n_regs, "spills", kern.n_spills, "shared", getattr(kern.metadata, "shared", "?"),
            "total", sum(ops.values()), json.dumps(dict(ops.most_common(25))))
    with open(os.path.join(outdir, "sweep.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
