"""A cell run's tokens audited again elsewhere (``testing/cell_replay.py``): the same verdict as
the run's own audit, a wrong token still fails, and a kit checkpoint that differs from the one
the engines ran is refused by name (never an audit of other weights)."""
from __future__ import annotations

import json

import pytest

from vllm_platform_ext.testing import cell_replay, cell_tokens
from vllm_platform_ext.testing.audit import Reference
from vllm_platform_ext.testing.cell_suites import Cell
from vllm_platform_ext.testing.engine import EngineRun
from vllm_platform_ext.testing.tiny_models import make_tiny_model

PROMPTS = [[3, 17, 42, 9, 5], [11, 12, 13, 14, 15, 16, 17]]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    model = make_tiny_model("qwen3_next", root / "qwen3_next", dims="cpu")
    ref = Reference(str(model))
    greedy = [ref.greedy(p, MAX_TOKENS, "fp32") for p in PROMPTS]
    return root, model, greedy


def _save(path, model, tokens):
    cell = Cell("qwen3_next", "base", 0, "auto", "eager")
    run = EngineRun(mode="base", k=0, tokens=tokens, init_s=1.0, engine_path={"device": "test"})
    return cell_replay.save_runs(path, {"qwen3_next": model}, PROMPTS, MAX_TOKENS, "cpu", {cell: run}, {})


def test_replayed_audit_passes_float32_greedy_and_fails_a_wrong_token(kit, tmp_path):
    root, model, greedy = kit
    [ok] = cell_replay.replay(_save(tmp_path / "ok.json", model, greedy), tmp_path / "work-ok")
    assert ok.status == "pass" and ok.bad == 0.0 and ok.positions == len(PROMPTS) * MAX_TOKENS, ok
    ref = Reference(str(model))
    wrong = [list(t) for t in greedy]
    lp = ref.logprobs(PROMPTS[0] + wrong[0][:-1])[len(PROMPTS[0]) - 1:]
    wrong[0] = lp.argmin(dim=-1).tolist()  # the least likely token at every position: regrets far above 0.5
    [bad] = cell_replay.replay(_save(tmp_path / "bad.json", model, wrong), tmp_path / "work-bad")
    assert bad.status == "fail" and bad.bad >= 0.25, bad  # one prompt of two made of unlikely tokens


def test_a_checkpoint_other_than_the_runs_is_refused(kit, tmp_path):
    root, model, greedy = kit
    other = make_tiny_model("qwen3_next", tmp_path / "other", dims="cpu", seed=1)
    path = _save(tmp_path / "runs.json", other, greedy)
    with pytest.raises(ValueError, match="kit model qwen3_next .* differs from the run's checkpoint"):
        cell_replay.replay(path, tmp_path / "work")


def test_runs_json_round_trip_and_cli_errors(kit, tmp_path, capsys):
    root, model, greedy = kit
    path = _save(tmp_path / "runs.json", model, greedy)
    data, runs, spread = cell_replay.load_runs(path)
    [(cell, run)] = runs.items()
    assert cell == Cell("qwen3_next", "base", 0, "auto", "eager") and run.tokens == greedy and not spread
    assert data["checkpoints"]["qwen3_next"] == cell_replay.checkpoint_digest(model)
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({**data, "format": 0}))
    with pytest.raises(ValueError, match="format 0"):
        cell_replay.load_runs(bad)
    with pytest.raises(SystemExit):
        cell_replay.main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")])
    assert "no such file" in capsys.readouterr().err


def test_cli_writes_the_results_and_exits_by_the_verdict(kit, tmp_path, capsys):
    root, model, greedy = kit
    rc = cell_replay.main([str(_save(tmp_path / "runs.json", model, greedy)), "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert rc == 0 and "replayed: 1 cells, 0 failing" in printed, printed
    [row] = json.loads((tmp_path / "out" / "results.json").read_text())  # a list of cell results
    assert row["status"] == "pass" and (tmp_path / "out" / "results.md").is_file()
    side = cell_tokens.load(tmp_path / "out" / "results.tokens.json")  # the replayed results' tokens, beside them
    assert cell_tokens.consistency(side, [row]) == [] and side["models"]["qwen3_next"]["floor_bf16"]


def test_runs_file_is_written_as_each_engine_finishes_and_a_partial_run_replays(kit, tmp_path):
    """A device window cut short (window 9: the engines done, the reference not) still leaves every
    finished engine's tokens in runs.json, with the count of engines still pending, and replaying
    that partial file judges the finished cells and says the run was partial."""
    root, model, greedy = kit
    base, mtp = Cell("qwen3_next", "base", 0, "auto", "eager"), Cell("qwen3_next", "mtp", 1, "auto", "eager")
    path = tmp_path / "engine-logs" / "runs.json"
    kept = cell_replay.RunsFile(path, {"qwen3_next": model}, PROMPTS, MAX_TOKENS, "cpu", engines=3)
    kept.add(base, False, EngineRun(mode="base", k=0, tokens=greedy, engine_path={"device": "test"}))
    data, runs, spread = cell_replay.load_runs(path)
    assert data["pending"] == 2 and list(runs) == [base] and not spread
    logged = []
    [res] = cell_replay.replay(path, tmp_path / "work", log=logged.append)
    assert res.status == "pass" and any("partial run: 2 engine(s)" in line for line in logged), logged
    later = EngineRun(mode="mtp", k=1, tokens=greedy, num_draft_tokens=4, num_accepted_tokens=2)
    kept.add(mtp, False, later)
    kept.add(base, True, EngineRun(mode="base", k=0, tokens=greedy))
    assert cell_replay.load_runs(path)[0]["pending"] == 0
    kept.finish({mtp: later, base: runs[base]}, {})  # the whole run, in the cells' order
    data, runs, spread = cell_replay.load_runs(path)
    assert list(runs) == [mtp, base] and not spread and data["pending"] == 0
    assert not list(path.parent.glob("*.tmp"))
