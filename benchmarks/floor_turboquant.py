"""Read floor of the HBM-bound target (GPU machine, torch + Triton only).

    python benchmarks/floor_turboquant.py [--out floor.json] [--bench results.json]

For every cache size of ``bench_turboquant.py``'s table (B requests x KV heads x context x slot
bytes: 388 k8v4, 262 4bit_nc, 230 k3v4_nc, 198 3bit_nc; B in 1, 8, 32, 64, 4 or 2 KV heads, 4K or
32K) times, in CUDA graphs (``triton.testing.do_bench_cudagraph``, median, the bench's timing),
kernels that do nothing but read that many contiguous bytes, and keeps the fastest:

* ``once``: one program per BLOCK words, every load in flight at once (4 or 8 warps);
* ``stride``: 2 or 4 programs per SM looping over the buffer, loads pipelined 2 or 4 deep;
* ``torch.sum`` of the buffer (a tuned library reduction), as an independent check.

An attention kernel reads the same bytes (scattered over pages, which only costs more) and does
its work on top, so it cannot be faster than the fastest bare read. Where that read stays below
the issue's target (50% of the bound for k8v4 / 4bit_nc, 30% for the 3-bit presets; the bound is
the bytes at 4.27 TB/s), the target cannot be met at that shape on this machine by any kernel.
An empty kernel's time in a graph is printed too (the launch floor).

With ``--bench`` (the ``.json`` that ``bench_turboquant.py --out`` writes, ideally from the same
run), each bench row gets the floor of its bytes and ours as a share of it."""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from bench_common import graph_ms, run_header

HBM_BYTES_PER_S = 4.27e12  # the H200 copy bandwidth
SLOT_BYTES = {"k8v4": 388, "4bit_nc": 262, "k3v4_nc": 230, "3bit_nc": 198}
TARGET = {"k8v4": 50, "4bit_nc": 50, "k3v4_nc": 30, "3bit_nc": 30}


@triton.jit
def _empty(X):
    pass


@triton.jit
def _read_once(X, OUT, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    o = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(X + o, mask=o < N, other=0)
    tl.store(OUT + pid, tl.sum(v, axis=0))


@triton.jit
def _read_stride(X, OUT, N, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in tl.range(pid * BLOCK, N, tl.num_programs(0) * BLOCK, num_stages=STAGES):
        o = i + tl.arange(0, BLOCK)
        acc += tl.load(X + o, mask=o < N, other=0)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


def _variants(buf: torch.Tensor, out: torch.Tensor, sms: int):
    n = buf.numel()
    for block in (4096, 16384):
        for warps in (4, 8):
            grid = (triton.cdiv(n, block),)
            yield f"once B{block} w{warps}", lambda g=grid, b=block, w=warps: _read_once[g](buf, out, n, BLOCK=b,
                                                                                          num_warps=w)
    for per_sm in (2, 4):
        for stages in (2, 4):
            grid = (sms * per_sm,)
            yield f"stride {per_sm}/SM s{stages}", lambda g=grid, s=stages: _read_stride[g](
                buf, out, n, BLOCK=2048, STAGES=s, num_warps=4)
    yield "torch.sum", lambda: buf.sum()


def floor_of(nbytes: int, sms: int) -> tuple[float, str]:
    """(fastest bare-read time in ms, which kernel) for ``nbytes`` contiguous bytes."""
    buf = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
    out = torch.empty(max(triton.cdiv(buf.numel(), 4096), sms * 4), dtype=torch.int32, device="cuda")
    best = (float("inf"), "")
    for name, fn in _variants(buf, out, sms):
        fn()
        t = graph_ms(fn, rep=20)
        best = min(best, (t, name))
    del buf, out
    return best


def shapes():
    for preset, slot in SLOT_BYTES.items():
        for hk in (4, 2):
            for ctx in (4096, 32768):
                for b in (1, 8, 32, 64):
                    yield preset, hk, ctx, b, b * hk * ctx * slot


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the floors as JSON")
    ap.add_argument("--bench", default=None, help="bench_turboquant.py's JSON: add ours vs the floor per row")
    args = ap.parse_args()
    x = torch.zeros(1, device="cuda")
    t0 = graph_ms(lambda: _empty[(1,)](x), rep=50)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}: empty kernel {t0 * 1e3:.2f} us", flush=True)
    floors = {}
    for preset, hk, ctx, b, nbytes in shapes():
        if nbytes not in floors:
            floors[nbytes] = floor_of(nbytes, sms)
        t, name = floors[nbytes]
        bound = nbytes / HBM_BYTES_PER_S * 1e3
        pct = 100 * bound / t
        flag = "" if pct >= TARGET[preset] else f"  < {TARGET[preset]}%: target unreachable"
        print(f"{preset} Hk={hk} {ctx // 1024}K B={b}: {nbytes / 1e6:.1f} MB, bound {bound * 1e3:.2f} us, "
              f"fastest read {t * 1e3:.2f} us ({name}) = {pct:.0f}% of the bound{flag}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"header": run_header(), "empty_us": t0 * 1e3,
                       "floors": {str(k): v for k, v in floors.items()}}, f)
    if args.bench:
        bench = json.load(open(args.bench))
        rows = bench.get("data", bench)["rows"]  # bench_common.write_result's JSON, or an older bare one
        print("\n| preset | heads | ctx | B | K | ours ms | ours % bound | read floor ms | floor % bound | ours / floor |")
        print("|" + "---|" * 10)
        for r in rows:
            hq, hk = map(int, r["heads"].split("/"))
            nbytes = r["B"] * hk * r["ctx"] * SLOT_BYTES[r["preset"]]
            if nbytes not in floors:
                floors[nbytes] = floor_of(nbytes, sms)
            t = floors[nbytes][0]
            bound = nbytes / HBM_BYTES_PER_S * 1e3
            print(f"| {r['preset']} | {r['heads']} | {r['ctx'] // 1024}K | {r['B']} | {r['K']} | {r['ours_ms']:.4f} | "
                  f"{100 * bound / r['ours_ms']:.0f}% | {t:.4f} | {100 * bound / t:.0f}% | {100 * t / r['ours_ms']:.0f}% |")


if __name__ == "__main__":
    main()
