"""Host time of one call into the TurboQuant route, beside its GPU time (CUDA graph replay).

Window 7's profile of C at batch 1 (``results/gpu/2026-11-28-40-layer-c-vs-d-token-split/2026-11-28-w7-0.26.0-e2e-profile.md``) had the
drafter's eager attention calls take more host time with the decode route than vLLM's decode path.
At batch 1 a step is host work, so the route's Python (the wiring's checks, the op's launch plan,
two Triton/Gluon launches) is what C pays there. This measures it apart from vLLM: the op
(``turboquant_verify_attention``) and the wiring's routed forward (``wiring.turboquant.verify_forward``,
with a stand-in impl, layer and metadata of the Qwen3.6-35B-A3B attention shape: 16 query heads,
2 KV heads, head dim 256) at batch 1 and 8, one row (the drafter's single-token passes) and K+1 = 4
rows (the verify). ``host us``: wall time to issue N calls without a sync, over N, the median of 9
such runs (the GPU queue does not fill at these N); ``GPU us``: one call replayed in a CUDA graph; ``eager us``: N calls with
the sync, over N. A cProfile of the routed forward names the Python functions that cost most.

    python benchmarks/host_turboquant_route.py --out DIR   (a CUDA device; vLLM not needed)
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from bench_common import graph_ms, run_header, write_result
from bench_turboquant import D, build_cache  # the kernel benchmark's head dim and cache

from vllm_platform_ext.ops.turboquant import layout as L
from vllm_platform_ext.ops.turboquant.routing import workspace_rows
from vllm_platform_ext.ops.turboquant.triton_verify import turboquant_verify_attention
from vllm_platform_ext.ops.turboquant.workspace import VerifyWorkspace
from vllm_platform_ext.patch.turboquant import spec_verify as W
from vllm_platform_ext.patch.turboquant import cache_view as TL

HQ, HK, NUM_SPEC, MAX_SEQS = 16, 2, 3, 8


class RouteImpl:
    """The attributes of vLLM's TurboQuantAttentionImpl the routed forward reads (after the
    wiring's ``__init__``)."""

    def __init__(self, preset: str):
        self.num_heads, self.head_size, self.num_kv_heads = HQ, D, HK
        self.kv_cache_dtype, self.scale = preset, D ** -0.5
        self._pe_route, self._pe_num_spec, self._pe_max_num_seqs = "kernel", NUM_SPEC, MAX_SEQS
        self._pe_ws_rows = workspace_rows(MAX_SEQS, NUM_SPEC)

    def _ensure_on_device(self, layer, device):
        pass


class RouteBackend:
    @staticmethod
    def get_impl_cls():
        return RouteImpl


def setup() -> None:
    """The op registry (what the bootstrap's ops group does) and the stand-in backend's layout."""
    from vllm_platform_ext.ops import register_all

    register_all()
    TL.remember(RouteBackend, TL.CacheLayout(("blocks", "tokens", "heads", "slot"), "benchmark stand-in"))


def inputs(preset: str, b: int, k1: int, ctx: int) -> dict:
    """The kernel benchmark's random valid cache (``bench_turboquant.build_cache``) for ``b`` requests
    of ``ctx`` positions, and the query, output and MSE tables of one call."""
    lay, cache, _, bt = build_cache(preset, HK, ctx, b, torch.Generator().manual_seed(0))
    n = b * k1
    return dict(cache=cache, bt=bt, sl=torch.full((b,), ctx, dtype=torch.int32, device="cuda"),
                q=torch.randn(n, HQ, D, dtype=torch.bfloat16, device="cuda"),
                out=torch.empty(n, HQ * D, dtype=torch.bfloat16, device="cuda"),
                cent=L.lloyd_max_centroids(D, lay.centroid_bits).cuda().float(),
                pit=torch.eye(D, device="cuda"), n=n)


def calls(preset: str, b: int, k1: int, ctx: int):
    """(the op called directly, the wiring's routed forward) for one shape."""
    x = inputs(preset, b, k1, ctx)
    ws = VerifyWorkspace.allocate(MAX_SEQS, NUM_SPEC + 1, HQ, D, device="cuda")
    out3 = x["out"].view(x["n"], HQ, D)

    def op():
        turboquant_verify_attention(x["q"], x["cache"], x["bt"], x["sl"], k1, preset=preset, scale=D ** -0.5,
                                    centroids=x["cent"], PiT=x["pit"], workspace=ws, out=out3)

    impl = RouteImpl(preset)
    layer = SimpleNamespace(_tq_centroids=x["cent"], _tq_PiT=x["pit"])
    md = SimpleNamespace(num_actual_tokens=x["n"], block_table=x["bt"], seq_lens=x["sl"], verify_rows=None)

    def routed():
        if W.verify_forward(impl, layer, x["q"], x["cache"], md, x["out"], k1) is None:
            raise RuntimeError("the routed forward kept vLLM's path (see the bootstrap report)")

    op()
    direct = out3.clone()
    routed()
    if not torch.equal(direct, out3):  # the same launch both ways: the same bits
        raise RuntimeError(f"batch {b}, {k1} rows: the routed forward's output differs from the op's")
    return op, routed


def host_us(fn, n: int = 100, batches: int = 9) -> tuple[float, float]:
    """(issue time, issue + finish time) per call in microseconds: medians over ``batches`` runs of
    ``n`` calls (the host's own spread between runs is tens of microseconds)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    issue, total = [], []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        issue.append((t1 - t0) / n * 1e6)
        total.append((t2 - t0) / n * 1e6)
    return statistics.median(issue), statistics.median(total)


def profile_text(fn, n: int = 200, top: int = 22) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="turboquant_k8v4")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--out", default="results/gpu/new-host-route")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_turboquant_route: needs a CUDA device", file=sys.stderr)
        return 2
    setup()
    rows, prof = [], ""
    for b, k1 in ((1, 1), (1, 4), (8, 1), (8, 4)):
        op, routed = calls(a.preset, b, k1, a.context)
        for name, fn in (("op", op), ("routed forward", routed)):
            issue, eager = host_us(fn)
            rows.append(dict(batch=b, k1=k1, call=name, host_us=round(issue, 1), eager_us=round(eager, 1),
                             gpu_us=round(graph_ms(fn) * 1e3, 1)))
            print(rows[-1], flush=True)
        if (b, k1) == (1, 1):
            prof = profile_text(routed)
    dev = torch.device("cuda")
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        torch.cuda.get_device_properties(dev)
    props_us = (time.perf_counter() - t0) / n * 1e6
    body = [f"`torch.cuda.get_device_properties` (what the op read three times a call before 2026-11-28, "
            f"now once per device): {props_us:.1f} us a call.", "",
            "| batch | rows a request | call | host us | GPU us (graph) | eager us |", "|---|---|---|---|---|---|"]
    body += [f"| {r['batch']} | {r['k1']} | {r['call']} | {r['host_us']} | {r['gpu_us']} | {r['eager_us']} |" for r in rows]
    body += ["", "cProfile of the routed forward, batch 1, one row, 200 calls (sorted by own time):", "", "```",
             prof.strip(), "```"]
    head = run_header(None, preset=a.preset, context=a.context)
    path = write_result(Path(a.out) / "host-route.md", "Host time of a call into the TurboQuant route",
                        head, "\n".join(body), {"rows": rows, "get_device_properties_us": round(props_us, 2)})
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
