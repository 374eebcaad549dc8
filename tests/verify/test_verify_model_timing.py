"""``verify --model``'s timed batch (verify/model_check.py ``_run_engine``) without an engine: the warm-up before it
runs the timed batch whole on a GPU and 4 tokens on the CPU (2026-12-07, vLLM 0.26.0 on an H100: after a 4-token
warm-up the speculative engine's timed batch ran 157 ms a step against plain decoding's 14)."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("gpu,want", [(True, 32), (False, 4)])
def test_warm_up_before_the_timed_batch(monkeypatch, gpu, want):
    torch = pytest.importorskip("torch")
    vllm = pytest.importorskip("vllm")
    from vllm_platform_ext.testing import engine, wna16_fallback
    from vllm_platform_ext.verify import model_check

    calls = []

    class FakeLLM:  # the generate calls' max_tokens, in order
        def __init__(self, **kw):
            pass

        def generate(self, prompts, sp, use_tqdm=False):
            calls.append(("warm-up", sp.max_tokens))
            return []

    def timed(llm, prompts, sp):
        calls.append(("timed", sp.max_tokens))
        return [], 1.0, {}

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(engine, "timed_generate", timed)
    for name in ("_shutdown", "_guard_vllm_kernel_rescan"):
        monkeypatch.setattr(engine, name, lambda *a: None)
    monkeypatch.setattr(engine, "engine_path", lambda llm: {})
    monkeypatch.setattr(wna16_fallback, "maybe_install", lambda: None)
    monkeypatch.setattr(model_check, "_compositions", lambda *a: ({}, {}))
    out = model_check._run_engine({}, [[1, 2, 3]], 32)
    assert out["error"] == "", out["error"]
    assert calls == [("warm-up", want), ("timed", 32)]
