"""The CUDA-path GDN wiring (``patch/gdn_cuda.py``) on the lines 0.27-0.31, each line's own code.

Those lines keep the old runner and builder (a decode row without drafts is a plain decode that reads state
column 0; an all-zero-draft batch is sent down the plain path by the builder's sum gate, spelled
``num_decode_draft_tokens_cpu[spec_sequence_masks_cpu].sum() == 0`` from 0.29) while 0.28+ already select the
spec tokens' gates in the layer (PR #51812). Until 2026-12-07 the group's probe took them for "neither old nor
fixed" and left them unpatched, so ngram drafting (which runs the V1 runner on every line) read stale state
there. Now the group patches the runner and the builder on 0.27-0.31, and the layer too only where it is old
(0.27).

Each line's child (``gdn_cuda_line_child.py``, the same scenarios the 0.23 venv runs) runs the line's real
``GDNAttentionMetadataBuilder``, ``GPUModelRunner._build_attention_metadata`` and model runner v2's
``MambaHybridModelState.prepare_attn`` (v2 is the CUDA default for MTP from 0.29 and marks decode rows without
drafts -1 up to 0.31) on CPU tensors. The reference
is upstream's own fix: vLLM 0.33's builder fed what 0.33's fixed runner hands it for the same steps (its
``zero_draft_decode_mask``); every patched line must give exactly that metadata.
"""
from __future__ import annotations

import os

import pytest

from conftest import line_id, run_line_child
from gdn_cuda_line_child import BT

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gdn_cuda_line_child.py")
LINES = [(0, 27), (0, 28), (0, 29), (0, 30), (0, 31)]
LAYER_OLD = {(0, 27)}  # the lines whose layer still passes the whole batch's gates to the spec call


@pytest.fixture(scope="module")
def upstream():
    """vLLM 0.33's own answer (the group skips there: upstream runs zero-draft rows on the spec path)."""
    got = run_line_child((0, 33), [CHILD])
    assert got["skip"].startswith("upstream already runs zero-draft decode rows on the speculative path"), got["skip"]
    assert got["applied"] is False and got["patched_targets"] == []
    return got["unpatched"]


@pytest.fixture(scope="module")
def upstream_v2(upstream):
    assert upstream["v2"]["no_drafts"]["num_spec_decodes"] == 2, upstream["v2"]
    return upstream["v2"]


@pytest.fixture(scope="module", params=LINES, ids=line_id)
def line(request):
    return request.param, run_line_child(request.param, [CHILD])


def test_the_group_applies_with_the_layer_only_where_it_is_old(line):
    key, got = line
    assert got["vllm"].startswith(f"{key[0]}.{key[1]}."), got["vllm"]
    p = got["probe"]
    for k in ("builder_sum_gate", "builder_spec_mask", "runner_gate", "runner_passes_accepted",
              "runner_syncs_accepted", "runner_is_prefilling", "runner_real_step"):
        assert p[k], (k, p)
    assert p["runner_fix"] is None
    assert got["skip"] is None and got["applied"] is True
    old_layer = key in LAYER_OLD
    assert got["layer_needs_patch"] is old_layer
    assert p["v2_runner_old"] and not p["v2_runner_fix"], p
    v2 = "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState.prepare_attn"
    assert sorted(got["patched_targets"]) == sorted([*(got["targets"] if old_layer else got["targets"][:2]), v2])
    assert got["restored"]


def test_unpatched_line_reads_stale_state(line):
    """Without the group, a step where no request drafted classes r0/r1 as plain decodes reading column 0
    (blocks 1 and 11) although their state is in column accepted - 1 (block 3 for r0)."""
    _, got = line
    u = got["unpatched"]
    r = u["runner_no_drafts"]
    assert r["num_spec_decodes"] == 0 and r["num_accepted_tokens"] is None
    assert r["non_spec_state_indices"][:2] == [BT[0][0], BT[1][0]]
    assert u["builder"]["explicit_zero_drafts"]["num_spec_decodes"] == 0  # the sum gate
    assert u["builder"]["spec_step"]["num_spec_decodes"] == 1  # the undrafted decode r1 left out


def test_patched_line_gives_upstreams_metadata(line, upstream):
    _, got = line
    upstream = upstream["builder"]
    p = got["patched"]
    md = p["runner_no_drafts"]
    assert md["num_spec_decodes"] == 2 and md["spec_state_indices"] == [BT[0], BT[1]]
    assert md["num_accepted_tokens"] == [3, 1]  # r0 reads block 3, r1 block 11
    assert md == upstream["upstream_form_no_drafts_mixed"]
    assert p["builder"]["no_drafts_mixed"] == upstream["upstream_form_no_drafts_mixed"]
    assert p["builder"]["spec_step"] == upstream["upstream_form_spec_step"]
    assert p["builder"]["explicit_zero_drafts"] == upstream["explicit_zero_drafts"]
    assert p["builder"]["capture"] == upstream["capture"]


def test_model_runner_v2_zero_draft_rows(line, upstream_v2):
    """Model runner v2 (the CUDA default for MTP from 0.29) marks a decode row without drafts -1 on these lines,
    so its state is read from column 0; patched, its real ``prepare_attn`` gives what 0.33's fixed one gives."""
    _, got = line
    u, p = got["unpatched"]["v2"], got["patched"]["v2"]
    assert u["no_drafts"]["num_spec_decodes"] == 0 and u["no_drafts"]["non_spec_state_indices"][:2] == [1, 11]
    assert u["spec_step"]["num_spec_decodes"] == 1 and u["capture"]["num_spec_decodes"] == 0
    assert p["no_drafts"]["num_spec_decodes"] == 2 and p["no_drafts"]["num_accepted_tokens"] == [3, 1]
    assert p == upstream_v2


def test_warmup_and_dummy_runs_are_left_to_the_line(line):
    """Issue 22's regression on these lines: the warm-up before a FULL capture (buffers still zero) and a
    builder call outside a scheduled step keep the line's own classification."""
    _, got = line
    assert got["patched"]["runner_warmup"] == got["unpatched"]["runner_warmup"]
    assert got["patched"]["runner_warmup"]["num_spec_decodes"] == 0
    nostep = got["patched"]["builder"]["explicit_zero_drafts_no_step"]
    assert nostep == got["unpatched"]["builder"]["explicit_zero_drafts_no_step"] and nostep["num_spec_decodes"] == 0


def test_old_layer_gets_the_spec_tokens_gates(line):
    key, got = line
    if key not in LAYER_OLD:
        assert "layer" not in got["patched"]  # 0.28+: the layer selects them itself; patching it would select twice
        return
    a = [10.0 * t for t in range(7)]
    m = got["patched"]["layer"]["tail_first"]
    assert m["spec_token_indx"] == [1, 2] and m["spec_call"] == [[a[1], a[2]], [a[1] + 1, a[2] + 1]]
