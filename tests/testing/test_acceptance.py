"""testing/acceptance.py: the accept paths a run exercised, from vLLM's per-position counters."""
from __future__ import annotations

import random

import pytest

from vllm_platform_ext.testing import acceptance
from vllm_platform_ext.testing.engine import EngineRun


def _simulate(steps: list[int], k: int) -> EngineRun:
    """An EngineRun whose counters are what vLLM counts for verify steps accepting ``steps[i]`` drafts."""
    per_pos = [sum(1 for a in steps if a >= j) for j in range(1, k + 1)]
    return EngineRun("mtp", k, num_drafts=len(steps), num_draft_tokens=k * len(steps),
                     num_accepted_tokens=sum(steps), accepted_per_pos=per_pos)


@pytest.mark.parametrize("seed", range(5))
def test_exact_counts_recover_the_steps(seed):
    r = random.Random(seed)
    k = r.randint(1, 5)
    steps = [r.randint(0, k) for _ in range(r.randint(1, 200))]
    run = _simulate(steps, k)
    assert acceptance.exact_counts(run.accepted_per_pos, run.num_drafts, k) == [steps.count(j) for j in range(k + 1)]
    assert acceptance.mean_length(run.num_accepted_tokens, run.num_drafts) == pytest.approx(1 + sum(steps) / len(steps))


def test_counts_that_cannot_come_from_vllm_are_refused():
    with pytest.raises(ValueError, match="not non-increasing"):
        acceptance.exact_counts([3, 5, 1], 10, 3)
    with pytest.raises(ValueError, match="not non-increasing"):
        acceptance.exact_counts([11], 10, 1)


def test_problem_names_the_path_that_did_not_run():
    # the random kit's MTP k=3 (results/bench/2026-12-01-mtp-distill): almost every step rejects draft 1
    rare = _simulate([0] * 90 + [1] * 8 + [2] * 2, 3)
    assert "position 2, 3 accepted fewer than 10" in acceptance.problem(rare)
    # every position often, but never exactly 2 of 3 accepted (a kit whose drafts are all-or-nothing)
    all_or_none = _simulate([0] * 20 + [1] * 20 + [3] * 60, 3)
    assert acceptance.problem(all_or_none) is None
    assert "j = 2 ran fewer than 5" in acceptance.problem(all_or_none, min_path_steps=5)
    good = _simulate([0] * 10 + [1] * 10 + [2] * 10 + [3] * 70, 3)
    assert acceptance.problem(good, min_path_steps=5, min_length=2.5) is None
    assert "mean acceptance length 3.40 < 3.5" in acceptance.problem(good, min_length=3.5)
    assert "draft tokens accepted" in acceptance.problem(good, min_rate=0.9)


def test_problem_refuses_runs_without_the_counters():
    assert "no drafts" in acceptance.problem(EngineRun("mtp", 3))
    no_pos = EngineRun("mtp", 3, num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12)
    assert "no per-position" in acceptance.problem(no_pos)
    wrong_sum = EngineRun("mtp", 3, num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12,
                          accepted_per_pos=[5, 3, 1])
    assert "sum to 9, not the 12 accepted" in acceptance.problem(wrong_sum)
