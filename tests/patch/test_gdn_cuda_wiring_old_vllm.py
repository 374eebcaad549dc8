"""The CUDA-path GDN wiring (``patch/gdn_cuda.py``) against a real OLD vLLM line (0.23.0).

The old line lives in its own venv (``ci/old_vllm_venv.sh``, default ``.venv-old``; path
override ``OLD_VLLM_PYTHON``). pytest runs ``gdn_cuda_line_child.py`` there (the batch and the
scenarios are described in it); the tests below check what it prints. The lines 0.27-0.31 run the
same child on their own wheels' code: tests/patch/test_gdn_cuda_lines.py.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import REPO, old_vllm_python
from gdn_cuda_line_child import BT

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gdn_cuda_line_child.py")


@pytest.fixture(scope="module")
def old():
    py = old_vllm_python()
    if not os.path.exists(py):
        pytest.fail(f"old-vLLM venv missing ({py}): run `bash ci/old_vllm_venv.sh` (setup step)")
    env = dict(os.environ, PYTHONPATH=REPO, VLLM_PLUGINS="", CUDA_VISIBLE_DEVICES="")
    env.pop("VLLM_PLATFORM_EXT_DISABLE", None)
    proc = subprocess.run([py, CHILD], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON ")]
    assert proc.returncode == 0 and lines, f"old side failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("JSON "):])


def test_old_line_is_probed_and_the_whole_group_applies(old):
    assert old["vllm"].startswith("0.23."), old["vllm"]
    p = old["probe"]
    assert p["runner_fix"] is None and p["layer_spec_gates_fixed"] is None, p
    for key in ("builder_sum_gate", "builder_spec_mask", "runner_gate", "runner_passes_accepted",
                "runner_syncs_accepted", "runner_is_prefilling", "layer_spec_gates"):
        assert p[key], (key, p)
    assert old["skip"] is None
    assert old["applied"] is True and sorted(old["patched_targets"]) == sorted(old["targets"])
    assert len(old["targets"]) == 4 and "qwen_gdn_linear_attn:QwenGatedDeltaNetAttention._forward_core" in old["targets"][2]
    assert old["restored"]


def _row_reads(md, accepted_before):
    """SSM block each spec row reads: column accepted-1 of its block-table row."""
    return [row[a - 1] for row, a in zip(md["spec_state_indices"], md["num_accepted_tokens"])]


def test_unpatched_old_line_has_the_bug(old):
    u = old["unpatched"]
    # no-draft step: the runner passes nothing, the zero-draft decodes r0/r1 read column 0 (blocks 1, 11)
    r = u["runner_no_drafts"]
    assert r["num_spec_decodes"] == 0 and r["num_accepted_tokens"] is None
    assert r["non_spec_state_indices"][:2] == [1, 11]
    # explicit zero drafts everywhere: the sum gate discards the spec rows
    assert u["builder"]["explicit_zero_drafts"]["num_spec_decodes"] == 0
    # spec step: the undrafted decode r1 is not a spec row
    assert u["builder"]["spec_step"]["num_spec_decodes"] == 1
    # builder patch alone: a no-draft step still has no accepted counts, so nothing changes
    assert old["builder_only_runner_no_drafts"]["num_spec_decodes"] == 0


def test_no_draft_step_through_the_real_runner(old):
    """The real old runner method, no request drafted: r0/r1 become spec rows that read the
    accepted block; the one-token prompt tail r2 and the first chunk r3 stay prefills."""
    md = old["patched"]["runner_no_drafts"]
    assert md["num_spec_decodes"] == 2 and md["num_decodes"] == 0 and md["num_prefills"] == 2
    assert md["num_accepted_tokens"] == [3, 1]
    assert md["spec_state_indices"] == [BT[0], BT[1]]
    assert _row_reads(md, [3, 1]) == [3, 11]  # r0: block 3 (accepted 3), r1: block 11
    assert md["non_spec_state_indices"] == [BT[2][0], BT[3][0]]
    assert md["has_initial_state"] == [True, False]  # r2 continues its prompt, r3 starts
    assert md["spec_token_indx"] == [0, 1] and md["non_spec_token_indx"] == [2, 3, 4, 5, 6]
    # the same inputs through the builder alone, with the counts the runner offers
    assert old["patched"]["builder"]["no_drafts_mixed"] == md


def test_spec_step_undrafted_decode_joins_the_spec_rows(old):
    md = old["patched"]["builder"]["spec_step"]
    assert md["num_spec_decodes"] == 2 and md["num_prefills"] == 2 and md["num_decodes"] == 0
    assert md["num_accepted_tokens"] == [3, 2] and md["spec_state_indices"] == [BT[0], BT[1]]
    assert md["spec_query_start_loc"] == [0, 3, 4] and md["num_spec_decode_tokens"] == 4
    assert md["has_initial_state"] == [True, False]


def test_all_zero_draft_batches_keep_the_spec_path(old):
    b = old["patched"]["builder"]
    for key in ("no_drafts_decodes", "explicit_zero_drafts"):
        md = b[key]
        assert md["num_spec_decodes"] == 2 and md["num_decodes"] == 0 and md["num_prefills"] == 0, (key, md)
        assert md["spec_state_indices"] == [BT[0], BT[1]]
    assert b["no_drafts_decodes"]["num_accepted_tokens"] == [3, 1]
    assert b["explicit_zero_drafts"]["num_accepted_tokens"] == [3, 2]
    # without the runner's counts the builder leaves a no-draft step alone
    assert b["no_drafts_no_runner"]["num_spec_decodes"] == 0
    # full-cudagraph capture of one-token rows takes the spec path too (reads column 0: accepted 1)
    cap = b["capture"]
    assert cap["num_spec_decodes"] == 2 and cap["num_decodes"] == 0
    assert cap["num_accepted_tokens"][:2] == [1, 1]


def test_warmup_run_before_full_capture_is_left_to_upstream(old):
    """Regression (issue 22, vLLM 0.23 on an H100, KV auto + MTP k=3 + FULL_AND_PIECEWISE: CUDA
    illegal memory access with the group on). The warm-up runs before a FULL graph capture
    build attention metadata from buffers that no step has filled yet: accepted 0, drafts 0.
    Upstream's all-zero gate keeps that batch off the spec path; the group used to open it,
    and the spec kernels then read state column accepted - 1 = -1. Now it leaves such runs
    alone, and a scheduled step with explicit zero drafts still takes the spec path."""
    patched, unpatched = old["patched"]["runner_warmup"], old["unpatched"]["runner_warmup"]
    assert patched == unpatched
    assert patched["num_spec_decodes"] == 0
    b = old["patched"]["builder"]
    assert b["explicit_zero_drafts_no_step"] == old["unpatched"]["builder"]["explicit_zero_drafts_no_step"]
    assert b["explicit_zero_drafts_no_step"]["num_spec_decodes"] == 0
    assert b["explicit_zero_drafts"]["num_spec_decodes"] == 2


def test_layer_spec_call_gets_the_spec_tokens_gates(old):
    lay = old["patched"]["layer"]
    a = [10.0 * t for t in range(7)]
    m = lay["tail_first"]
    assert m["spec_token_indx"] == [1, 2]  # unpatched, the kernel would read a[0:2]: r2's gate for r0
    assert m["spec_call"] == [[a[1], a[2]], [a[1] + 1, a[2] + 1]]
    assert m["other_call"] == [a, [x + 1 for x in a]]
    d = lay["decodes"]  # spec-only batch: the layer's own tensors are already the spec tokens'
    assert d["spec_call"] == [[0.0, 10.0], [1.0, 11.0]]
