"""GPU check for FINDINGS.md: the TurboQuant attention pieces of one C verify step at the engine's page
(1488 tokens, vLLM 0.26 head-major pages) vs page 16, GPU time (CUDA graph) and host time per eager call.

    python benchmarks/runs/2026-11-28-e2e-gap/check_page.py   # GPU machine, repo root, the run.sh venv

Rows: ours K+1 verify (the target's 2 layers in the FULL graph + the drafter's first pass, eager), upstream
single-token decode (the drafter's 2 later passes, eager) and upstream store (every pass, eager in 0.26's
piecewise drafter). Host us = Python + launch per call with no sync (what an eager drafter pass pays).
"""
from __future__ import annotations

import os
import sys
import time

import torch
import triton

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [REPO, os.path.join(REPO, "benchmarks")]
import bench_turboquant as BT  # noqa: E402
from bench_common import graph_ms  # noqa: E402
from vllm_platform_ext.ops.turboquant import layout as L  # noqa: E402
from vllm_platform_ext.ops.turboquant import triton_verify as TV  # noqa: E402
from vllm_platform_ext.ops.turboquant import upstream_kernels  # noqa: E402

PRESET, HQ, HK, D, CTX, K = "turboquant_k8v4", 16, 2, 256, 4096, 3


def host_us(fn, n=200):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return 1e6 * dt / n


def main():
    up = upstream_kernels.load(os.environ.get("VLLM_TQ_SRC"))
    print(f"device {torch.cuda.get_device_name()} triton {triton.__version__}", flush=True)
    gen = torch.Generator().manual_seed(0)
    H = L.hadamard(D, "cuda")
    cent = L.lloyd_max_centroids(D, L.layout_for(PRESET, D).centroid_bits).cuda()
    mids = torch.zeros(max(1, cent.numel() - 1), device="cuda")
    for page in (16, 1488):
        BT.PAGE = page
        ctx_alloc = triton.cdiv(CTX, page) * page
        lay, cache, view, bt_all = BT.build_cache(PRESET, HK, ctx_alloc, 8, gen, layout="head")
        for max_seqs in (1, 8):
            ws = TV.VerifyWorkspace.allocate(max_seqs, K + 1, HQ, D, device="cuda")
            for b in (1, 8):
                if b > max_seqs:
                    continue
                k1 = K + 1
                bt = bt_all[:b]
                sl = torch.full((b,), CTX, dtype=torch.int32, device="cuda")
                q = torch.randn(b * k1, HQ, D, device="cuda", dtype=torch.bfloat16)
                out = torch.empty_like(q)
                ours = lambda: TV.turboquant_verify_attention(  # noqa: E731
                    q, view, bt, sl, k1, preset=PRESET, scale=D ** -0.5, centroids=cent, PiT=H, workspace=ws, out=out)
                with TV.trace_launches() as tr:
                    ours()
                g_ours, h_ours = graph_ms(ours) * 1e3, host_us(ours)
                # drafter passes 2-3: upstream decode, one row per request, its fixed 32 splits
                q1 = torch.randn(b, HQ, D, device="cuda", dtype=torch.bfloat16)
                mid = torch.empty(b, HQ, 32, D + 1, dtype=torch.float32, device="cuda")
                ob = torch.empty(b, HQ, D, dtype=torch.bfloat16, device="cuda")
                lb = torch.empty(b, HQ, dtype=torch.float32, device="cuda")
                dec = lambda: up.decode.triton_turboquant_decode_attention(  # noqa: E731
                    q1, view, bt, sl, Pi=H, centroids=cent, scale=D ** -0.5, mse_bits=lay.key_bits,
                    key_packed_size=lay.key_packed_size, value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8,
                    norm_correction=lay.norm_correction, PiT=H, mid_o_buf=mid, output_buf=ob, lse_buf=lb,
                    max_num_kv_splits=32)
                g_dec, h_dec = graph_ms(dec) * 1e3, host_us(dec)
                # the KV store of a K+1 pass (b*k1 tokens) into slots of the last page
                kk = torch.randn(b * k1, HK, D, device="cuda", dtype=torch.bfloat16)
                slots = (bt[:, -1:].long() * page + torch.arange(k1, device="cuda")).reshape(-1).int()
                st = lambda: up.store.triton_turboquant_store(  # noqa: E731
                    kk, kk, view, slots, H, mids, mse_bits=lay.key_bits, key_packed_size=lay.key_packed_size,
                    value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8)
                g_st, h_st = graph_ms(st) * 1e3, host_us(st)
                print(f"page={page:5d} max_num_seqs={max_seqs} b={b}: ours {tr[-1].kernel} splits={tr[-1].splits} "
                      f"gpu {g_ours:6.1f} us host {h_ours:5.1f} us | upstream decode gpu {g_dec:6.1f} us host "
                      f"{h_dec:5.1f} us | store gpu {g_st:5.1f} us host {h_st:5.1f} us", flush=True)
            del ws
        del cache, view, bt_all
        torch.cuda.empty_cache()
    try:  # what B's eager drafter pays for the same pieces (vLLM's FlashAttention + cache write), if importable
        from vllm.vllm_flash_attn import flash_attn_varlen_func
        for b in (1, 8):
            nb = triton.cdiv(CTX, 560)
            kc = torch.randn(b * nb + 1, 560, HK, D, device="cuda", dtype=torch.bfloat16)
            btf = torch.arange(1, b * nb + 1, device="cuda", dtype=torch.int32).view(b, nb)
            qf = torch.randn(b * 4, HQ, D, device="cuda", dtype=torch.bfloat16)
            cu = torch.arange(0, b * 4 + 1, 4, device="cuda", dtype=torch.int32)
            sk = torch.full((b,), CTX, device="cuda", dtype=torch.int32)
            fa = lambda: flash_attn_varlen_func(qf, kc, kc, max_seqlen_q=4, cu_seqlens_q=cu, max_seqlen_k=CTX,  # noqa: E731
                                                seqused_k=sk, softmax_scale=D ** -0.5, causal=True, block_table=btf,
                                                fa_version=3)
            print(f"FA3 page 560 b={b} K+1=4: gpu {graph_ms(fa) * 1e3:6.1f} us host {host_us(fa):5.1f} us", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"FA comparison skipped: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
