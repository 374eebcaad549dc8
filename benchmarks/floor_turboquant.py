"""Launch and latency floor of the small HBM-bound cases (GPU machine, torch + Triton only).

    python benchmarks/floor_turboquant.py

Times, in CUDA graphs (``triton.testing.do_bench_cudagraph``, median), an empty kernel and one
Triton kernel that only reads (and sums) as many bytes as a TurboQuant verify step's compressed
cache at 4K context (B requests x KV heads x 4096 positions x slot bytes: 388 k8v4, 262 4bit_nc,
198 3bit_nc), and prints that read's share of the HBM bound (bytes / 4.27 TB/s). No attention
kernel can beat a bare read of its bytes, so where the read stays below the issue's 50% / 30%
targets, those targets cannot be met at that shape on this machine."""
import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

HBM_BYTES_PER_S = 4.27e12  # the H200 copy bandwidth
SLOT_BYTES = {"k8v4": 388, "4bit_nc": 262, "3bit_nc": 198}


@triton.jit
def _empty(X):
    pass


@triton.jit
def _read(X, OUT, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(pid * BLOCK, N, tl.num_programs(0) * BLOCK):
        o = i + tl.arange(0, BLOCK)
        acc += tl.load(X + o, mask=o < N, other=0)
    tl.store(OUT + pid * BLOCK + tl.arange(0, BLOCK), acc)


def main() -> None:
    x = torch.zeros(1, device="cuda")
    t0 = do_bench_cudagraph(lambda: _empty[(1,)](x), rep=50, return_mode="median")
    print(f"{torch.cuda.get_device_name()}: empty kernel {t0 * 1e3:.2f} us")
    progs = torch.cuda.get_device_properties(0).multi_processor_count * 4
    out = torch.empty(progs * 1024, dtype=torch.int32, device="cuda")
    for label, slot in SLOT_BYTES.items():
        for b, hk in ((1, 4), (8, 4), (1, 2), (8, 2), (32, 4)):
            nbytes = b * hk * 4096 * slot
            buf = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
            t = do_bench_cudagraph(lambda: _read[(progs,)](buf, out, buf.numel(), BLOCK=1024), rep=50,
                                   return_mode="median")
            bound = nbytes / HBM_BYTES_PER_S * 1e6
            print(f"{label} B={b} Hk={hk} 4K: {nbytes / 1e6:.2f} MB, bound {bound:.2f} us, "
                  f"read alone {t * 1e3:.2f} us = {100 * bound / (t * 1e3):.0f}% of the bound")


if __name__ == "__main__":
    main()
