"""``spec.draft_ids_in_vocab`` on each vLLM line's REAL V1 runner code (every kept line with one: 0.22-0.33;
0.34 has model runner v2 only, where the group has no target: its skip is in test_compat_lines_import).

Per line one child process (``draft_ids_line_child.py``, the line's Python first on ``PYTHONPATH``): the
line's ``GPUModelRunner._calc_spec_decode_metadata`` on input ids holding -1 and vocab-sized drafts (and
padded slots holding them), with the group off, then on. Off: the sampler gets the bad ids and the
embedding's buffer keeps them (the bug, on every line). On: the buffer holds only ids of the vocabulary
(the bad ones 0), the sampler of an all-greedy batch gets -1 for them (never accepted), of a batch with
random sampling the id the forward runs on; the input batch's draft lists (the sampler's penalty history,
on which the line's own ``apply_all_penalties`` raises off) in the vocabulary. The group's contract check and its probe (skips where the
line's own function already returns in-vocabulary drafts) run on each line. The CPU engine test is
tests/testing/test_bad_draft_ids.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import line_id, run_line_child
from vllm_platform_ext.compat import lines

LINES = [k for k in lines.LINES if k <= (0, 33)]  # the lines with a V1 GPUModelRunner
CHILD = Path(__file__).with_name("draft_ids_line_child.py")
V = 16  # the stand-in's vocabulary; input ids [11, -1, V, 5, 12, V + 7] and two padded slots [-1, V]
OFF_DRAFTS, OFF_IDS = [-1, V, 5, V + 7], [11, -1, V, 5, 12, V + 7, -1, V]
ON_IDS = [11, 0, 0, 5, 12, 0, 0, 0]


@pytest.fixture(scope="module", params=LINES, ids=line_id)
def line(request):
    return request.param, run_line_child(request.param, [str(CHILD)], deps=True)


def test_line_contract_and_probe(line):
    key, got = line
    assert got["contract"] is None, (key, got["contract"])
    assert got["list_contract"] is None, (key, got["list_contract"])
    assert got["probe"] is None, (key, got["probe"])  # needed on every line
    assert got["probe_when_fixed"] and "in the vocabulary already" in got["probe_when_fixed"], got["probe_when_fixed"]


def test_without_the_group_bad_drafts_reach_the_sampler_and_the_embedding(line):
    """The bug, on the line's own code (fails once upstream keeps the ids in the vocabulary: the probe must
    skip then). Only -1 is handled upstream, from 0.25 on: clamped to 0 before the embedding and rejected
    by the Triton random-sampling kernel; ids >= vocab_size by neither, on any line."""
    key, got = line
    assert got["off"] == [OFF_DRAFTS, OFF_IDS], (key, got["off"])
    assert got["lists_off"]["req"] == [OFF_DRAFTS, OFF_DRAFTS] and got["lists_off"]["async"] == OFF_DRAFTS, got
    assert "out of bounds" in got["lists_off"]["penalties"], (key, got["lists_off"]["penalties"])  # V + 7
    assert got["preprocess_clamps_negative"] == (key >= (0, 25)), key
    assert got["random_kernel_rejects_negative"] == (key >= (0, 25)), key


def test_with_the_group_ids_in_vocab_and_bad_drafts_unacceptable(line):
    key, got = line
    assert [s for s, _ in got["group"]] == ["applied"], (key, got["group"])
    assert got["on_greedy"] == [[-1, -1, 5, -1], ON_IDS], (key, got["on_greedy"])
    assert got["on_random"] == [[0, 0, 5, 0], ON_IDS], (key, got["on_random"])
    # the penalty history in the vocabulary; token_ids_cpu keeps the raw ids (the runner's buffer is put in the
    # vocabulary with the bad-draft mask the sampler needs)
    assert got["lists_on"]["req"] == [[0, 0, 5, 0], OFF_DRAFTS] and got["lists_on"]["async"] == [0, 0, 5, 0], got
    assert got["lists_on"]["penalties"] == "ok", (key, got["lists_on"]["penalties"])


def test_in_vocab_is_one_elementwise_pass():
    """No host sync and no data-dependent shape: the mask and the buffer keep their shapes, the buffer is
    changed in place (the same storage), whatever the ids."""
    import torch

    from vllm_platform_ext.patch.spec_draft_ids import in_vocab_

    ids = torch.tensor([3, -1, 7, 8, 2**30, -(2**30), 0], dtype=torch.int32)
    ptr = ids.data_ptr()
    bad = in_vocab_(ids, 8)
    assert ids.data_ptr() == ptr and ids.shape == bad.shape == (7,)
    assert ids.tolist() == [3, 0, 7, 0, 0, 0, 0] and bad.tolist() == [False, True, False, True, True, True, False]
