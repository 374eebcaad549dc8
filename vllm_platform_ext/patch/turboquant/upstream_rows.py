"""The synthetic-row route for uniform K+1 TurboQuant verify batches (benchmark configuration R).

vLLM PR #40914 (open, unmerged through 0.33) serves a uniform K+1 verify batch with vLLM's own
single-token decode kernel, ``triton_turboquant_decode_attention``, over ``B x (K+1)`` synthetic
rows: each query token a decode row with its request's block-table row and a length that ends at
its own position. ``VLLM_PLATFORM_EXT_TQ_VERIFY_ROUTE=upstream_rows`` makes the plugin's verify
route take that path instead of the K+1 kernel, with everything else of the plugin unchanged, so
the end-to-end benchmark can measure the K+1 kernel against the routing upstream proposes in the
same engine (issue 32: C >= 1.1x R at 32K). Not a user setting: the default is ``kernel``.

The kernel is called from the module of the backend vLLM selected (upstream's, or another
plugin's copy) with scratch it allocates itself: vLLM's workspace holds ``max_num_seqs`` rows, not
``B x (K+1)`` (``routing.workspace_rows``).
"""
from __future__ import annotations

import sys
from typing import Any

import torch

from vllm_platform_ext.ops.turboquant.routing import synthetic_rows

KERNEL = "triton_turboquant_decode_attention"


def decode_kernel(impl: Any):
    """vLLM's single-token TurboQuant decode kernel as the impl's own module imported it, or None."""
    return getattr(sys.modules.get(type(impl).__module__), KERNEL, None)


def rows_forward(impl: Any, layer: Any, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, k1: int, out: torch.Tensor) -> bool:
    """A uniform verify batch's ``q`` ``[B x K1, Hq, D]`` through vLLM's decode kernel on synthetic
    rows, written into ``out`` (same shape); False when the impl's module has no such kernel (the
    caller then keeps its own route). ``block_table`` / ``seq_lens`` are the B requests' rows, checked
    by the caller (``turboquant.tensor_contract``, after ``_ensure_on_device``); ``kv_cache`` is the
    cache as the kernel reads it, ``[blocks, block_size, kv_heads, slot]`` (the probed op view: 0.26
    stores it head-major and its forward transposes before the kernel)."""
    kernel = decode_kernel(impl)
    if kernel is None:
        return False
    bt, sl = synthetic_rows(block_table, seq_lens, q.shape[0] // k1, k1)
    cfg = impl.tq_config
    res = kernel(query=q, kv_cache=kv_cache, block_table=bt, seq_lens=sl,
                 Pi=layer._tq_Pi, centroids=layer._tq_centroids, scale=impl.scale,
                 mse_bits=cfg.key_mse_bits, key_packed_size=cfg.key_packed_size,
                 value_quant_bits=cfg.effective_value_quant_bits, key_fp8=cfg.key_fp8,
                 norm_correction=cfg.norm_correction, PiT=getattr(layer, "_tq_PiT", None),
                 max_num_kv_splits=impl.max_num_kv_splits)
    out.copy_(res.view(out.shape))
    return True
