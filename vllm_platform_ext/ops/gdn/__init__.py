"""Gated DeltaNet spec-decode ops (torch for the CPU, Triton for CUDA/MACA).

Op contract (``torch_ops``, ``triton_ops`` and the float64 ``reference`` follow it):

* ``causal_conv1d_prefill(x, weight, bias, conv_states, query_start_loc, cache_indices,
  has_initial_state, activation="silu", null_block_id=0)``
* ``causal_conv1d_update(x, conv_states, weight, bias, activation, conv_state_indices,
  query_start_loc, num_accepted_tokens=None, null_block_id=0)``: window at column offset
  ``num_accepted-1``; leaves ``[window[1:], x_row]`` in columns ``[0, width-2+q)``.
* ``recurrent_gated_delta_rule(q, k, v, g, beta, scale, ssm_states, query_start_loc,
  state_indices, num_accepted_tokens=None, has_initial_state=None, use_qk_l2norm=True,
  null_block_id=0)``: 2-D ``state_indices`` read column ``num_accepted-1`` and write the state
  after token ``t`` into column ``t``.
* ``gdn_gating(A_log, a, b, dt_bias, softplus_threshold=20.0) -> (g, beta)``.

The Triton functions also take a keyword-only ``config`` overriding the launch config below.
"""
from __future__ import annotations

from vllm_platform_ext.ops.dispatch import OpImpl
from vllm_platform_ext.ops.launch import launch_config

_TORCH = "vllm_platform_ext.ops.gdn.torch_ops:"
_TRITON = "vllm_platform_ext.ops.gdn.triton_ops:"

# op -> (function name, {platform: launch request}). MACA: num_warps <= 16 and smaller
# blocks (64-wide warps, a smaller register file per thread than Hopper).
_TABLE = {
    "gdn.causal_conv1d_prefill": ("causal_conv1d_prefill", {
        "cuda": dict(num_warps=4, BLOCK_T=16, BLOCK_D=128),
        "maca": dict(num_warps=4, BLOCK_T=16, BLOCK_D=64),
    }),
    "gdn.causal_conv1d_update": ("causal_conv1d_update", {
        "cuda": dict(num_warps=4, BLOCK_D=256),
        "maca": dict(num_warps=4, BLOCK_D=128),
    }),
    "gdn.recurrent_gated_delta_rule": ("recurrent_gated_delta_rule", {
        # H200 sweep (results/bench/gdn-kernels.md): BLOCK_V=4 with one warp is the fastest or within
        # 3% of it from batch 1 to 64; MACA: unmeasured, a middle shape.
        "cuda": dict(num_warps=1, num_stages=2, BLOCK_V=4),
        "maca": dict(num_warps=2, num_stages=1, BLOCK_V=8),
    }),
    "gdn.gating": ("gdn_gating", {
        "cuda": dict(num_warps=4, BLOCK=1024),
        "maca": dict(num_warps=4, BLOCK=512),
    }),
}


def _ops() -> list[OpImpl]:
    ops: list[OpImpl] = []
    for op, (fn, per_platform) in _TABLE.items():
        ops.append(OpImpl(op, "cpu", _TORCH + fn, "torch"))
        for platform, request in per_platform.items():
            ops.append(OpImpl(op, platform, _TRITON + fn, "triton", launch_config(platform, **request)))
    return ops


OPS: list[OpImpl] = _ops()
