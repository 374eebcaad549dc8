"""vLLM's own GDN kernels (copied by ``vllm_gdn_carry.py``) behind our op contract.

Used by ``bench_gdn.py`` for timings and for the semantic cross-check "does vLLM's kernel
agree with our float64 reference (and so with the contract) on rows without padding?".
Differences that are contract choices, not bugs: vLLM leaves outputs of padding/null rows
unwritten (ours: zeros), and vLLM updates ``x`` in place for the conv update.
"""
from __future__ import annotations

import os
import sys
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
CARRY = os.path.join(os.path.dirname(HERE), ".carry", "vllm_gdn")
if CARRY not in sys.path:
    sys.path.insert(0, CARRY)

from vllm_ref import VLLM_VERSION  # noqa: E402
from vllm_ref import causal_conv1d as _cc  # noqa: E402
from vllm_ref import fused_recurrent as _fr  # noqa: E402
from vllm_ref import fused_sigmoid_gating as _fsg  # noqa: E402


def causal_conv1d_update(x, conv_states, weight, bias, activation, conv_state_indices, query_start_loc,
                         num_accepted_tokens=None, null_block_id=0, max_query_len=None, out=None):
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    return _cc.causal_conv1d_update(x, conv_states, weight, bias, activation, conv_state_indices=conv_state_indices,
                                    num_accepted_tokens=num_accepted_tokens, query_start_loc=query_start_loc,
                                    max_query_len=max_query_len, null_block_id=null_block_id,
                                    out=torch.empty_like(x) if out is None else out)


def causal_conv1d_prefill(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                          activation="silu", null_block_id=0):
    out = _cc.causal_conv1d_fn(x.t(), weight, bias, conv_states, query_start_loc, cache_indices=cache_indices,
                               has_initial_state=has_initial_state, activation=activation,
                               null_block_id=null_block_id)
    return out.t()


def recurrent_gated_delta_rule(q, k, v, g, beta, scale, ssm_states, query_start_loc, state_indices,
                               num_accepted_tokens=None, has_initial_state=None, use_qk_l2norm=True,
                               null_block_id=0):
    o, _ = _fr.fused_recurrent_gated_delta_rule_fwd(
        q[None], k[None], v[None], g[None], beta[None], scale, ssm_states, inplace_final_state=True,
        cu_seqlens=query_start_loc, ssm_state_indices=state_indices, num_accepted_tokens=num_accepted_tokens,
        use_qk_l2norm_in_kernel=use_qk_l2norm)
    return o[0]


def fused_gating_recurrent_gated_delta_rule(q, k, v, A_log, a, b, dt_bias, scale, ssm_states, query_start_loc,
                                            state_indices, num_accepted_tokens=None, has_initial_state=None,
                                            use_qk_l2norm=True, null_block_id=0, softplus_threshold=20.0):
    o, _ = _fsg.fused_sigmoid_gating_delta_rule_update(
        A_log, a[None], b[None], dt_bias, q[None], k[None], v[None], beta=1.0, threshold=softplus_threshold,
        scale=scale, initial_state=ssm_states, inplace_final_state=True, cu_seqlens=query_start_loc,
        ssm_state_indices=state_indices, num_accepted_tokens=num_accepted_tokens,
        use_qk_l2norm_in_kernel=use_qk_l2norm)
    return o[0]


OPS = types.SimpleNamespace(causal_conv1d_update=causal_conv1d_update, causal_conv1d_prefill=causal_conv1d_prefill,
                            recurrent_gated_delta_rule=recurrent_gated_delta_rule)
