"""The attention block size vLLM 0.26 gives the e2e model (Qwen3.6-35B-A3B shape) per configuration:
0.26's own ``Platform._align_hybrid_block_size`` and Qwen3.5's mamba-state functions on a stand-in
config (FINDINGS.md, Q1). CPU only: ``.venv/bin/python benchmarks/runs/2026-11-28-e2e-gap/align_block_size.py``
(0.26's Python from ``.cache/vllm-lines/0.26.0``, which tools/vllm_lines.py extracts)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".cache", "vllm-lines", "0.26.0"))
import torch
from types import SimpleNamespace as NS
from vllm.platforms.interface import Platform
from vllm.model_executor.models import ModelRegistry
from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
hf = NS(linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4)
def run(cache_dtype, k, backend):
    mc = NS(dtype=torch.bfloat16, use_mla=False, architecture="Qwen3_5MoeForCausalLM", hf_text_config=hf,
            get_num_kv_heads=lambda pc: 2, get_head_size=lambda: 256, get_mamba_chunk_size=lambda: 64, model_impl="auto", convert_type="none", runner_type="generate")
    cc = NS(cache_dtype=cache_dtype, mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto", block_size=16,
            mamba_block_size=None, user_specified_mamba_block_size=False, mamba_cache_mode="none",
            mamba_page_size_padded=None, kv_cache_dtype_skip_layers=None)
    pc = NS(tensor_parallel_size=1)
    vc = NS(cache_config=cc, model_config=mc, parallel_config=pc,
            speculative_config=NS(num_speculative_tokens=k) if k else None)
    Platform._align_hybrid_block_size.__func__(Platform, vc, backend)
    return cc.block_size, cc.mamba_page_size_padded
import vllm.config.vllm as V
try:
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration as QCls
    print("using real Qwen3_5ForConditionalGeneration classmethods")
except Exception as e:
    print("import failed", type(e).__name__, e); raise
ModelRegistry.resolve_model_cls = lambda *a, **k: (QCls, "x")
V.set_current_vllm_config = lambda c: __import__("contextlib").nullcontext()
for name, dt, k, be in [("C tq k8v4 MTP3","turboquant_k8v4",3,TurboQuantAttentionBackend),
                        ("B bf16 MTP3","auto",3,FlashAttentionBackend),("A bf16 k0","auto",0,FlashAttentionBackend),
                        ("tq k0","turboquant_k8v4",0,TurboQuantAttentionBackend)]:
    print(name, run(dt, k, be))
