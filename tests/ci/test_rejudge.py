"""``ci/tools/rejudge.py``: the committed GPU cell results judged again under the 2026-12-02 rule.
``results/gpu/2026-12-02-rejudge/RESULTS.md`` is what the committed results give (like docs/results.md's
generated tables); on runs written here the tool rebuilds counts, floors and plain decoding from the
records, changes the verdicts the new rule changes, leaves open what the records cannot settle, and
refuses records it cannot read as the old judge wrote them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, load_tool

rj = load_tool("ci/tools/rejudge.py")
N = 224


def test_results_md_is_current():
    files = rj.cell_result_files()
    assert len(files) >= 30 and all(isinstance(v, list) for v in files.values())
    want = rj.render(rj.rejudge(files), files)
    assert rj.OUT.read_text() == want, "run `python ci/tools/rejudge.py write`"
    assert rj.main(["check"]) == 0


def test_committed_results_rejudged():
    """What RESULTS.md states, from the rows themselves: no settled change; the open verdicts are the
    MoE kit's k8v4 plugin cells (the records hold no bf16 floor for the MoE family), each failing at the
    low end on its spread run's worst composition, which is plain decoding's own batch."""
    rows = rj.rejudge(rj.cell_result_files())
    assert len(rows) > 300
    assert [x for x in rows if x.new not in (x.old, "undetermined")] == []
    open_ = [x for x in rows if x.new == "undetermined"]
    assert open_ and all(x.plugin and x.id.startswith("qwen3_5_moe-") and "-k8v4-" in x.id for x in open_)
    assert all("spread" in x.fails and "'batch'" in x.why and x.bf16[0] == 0 < x.bf16[1] for x in open_)
    mild = next(x for x in rows if x.id == "qwen3_5-mtp3-k8v4-eager-off" and "0.23.0" in x.file)
    assert (mild.bad, mild.bf16, mild.limits, mild.new) == (9, (0, 0), (4, 4), "upstream-wrong")


def _rec(model, mode, k, kv, plugin, status, bad, floor, source="bf16 transformers", spread=(), identity=(), error=""):
    cell = {"model": model, "mode": mode, "k": k, "kv": kv, "graphs": "full_and_piecewise", "plugin": plugin,
            "platform": "", "disable": "", "tp": 1, "prefix_caching": False}
    spec = "base" if mode == "base" else f"{mode}{k}"
    return {"cell": cell, "id": f"{model}-{spec}-{kv.removeprefix('turboquant_')}-full_and_piecewise-"
                                 f"{'on' if plugin else 'off'}",
            "status": status, "bad": None if bad is None else bad / N, "floor": floor / N, "positions": 0 if bad is None else N,
            "floor_source": source, "plain_spread": [x / N for x in spread], "identity": list(identity), "error": error,
            "versions": {"vllm": "0.23.0"}}


def _write(tmp_path, records, name="run.json"):
    d = tmp_path / "results" / "gpu" / "2026-01-01-run"
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(json.dumps(records))
    (d / "other.json").write_text(json.dumps({"header": {}, "data": []}))  # not cell results: skipped
    return rj.cell_result_files(tmp_path / "results" / "gpu")


def test_rejudge_changes_what_the_new_rule_changes(tmp_path):
    wrong_split = {"pos": 3, "gap": 1.5, "spec_regret": 1.5, "plain_regret": 0.0}
    files = _write(tmp_path, [
        # a plain cell itself wrong (10 bad: old floor 0 + 4.48 -> wrong, new limit 4 -> wrong)
        _rec("qwen3_next", "base", 0, "auto", False, "upstream-wrong", 10, 0),
        # its speculative cell at 12, the old floor its plain's 10 (12 <= 14.48): works; new: plain capped at 4 -> limit 11
        _rec("qwen3_next", "mtp", 3, "auto", False, "upstream-works", 12, 10, "plain decoding on auto"),
        # a plugin cell with one wrong split from plain decoding on bf16 KV: the count passes, the split rule fails it
        _rec("qwen3_next", "base", 0, "turboquant_k8v4", True, "pass", 0, 0),
        _rec("qwen3_next", "ngram", 3, "turboquant_k8v4", True, "pass", 1, 0, identity=[wrong_split]),
        _rec("qwen3_5", "base", 0, "auto", True, "pass", 0, 0),
        _rec("qwen3_5", "ngram", 3, "auto", True, "pass", 1, 0, identity=[wrong_split, None]),
        # a plugin fail that was not the audit's: stays
        _rec("qwen3_5", "mtp", 3, "auto", True, "fail", 0, 0, error="no draft accepted: the spec path was not exercised"),
        # the MoE family: no bf16 floor on record (0..3); spread worst 6 -> fails at 0, passes at 3
        _rec("qwen3_5_moe", "mtp", 3, "auto", True, "pass", 2, 4 + 2, "plain decoding over 5 batch compositions",
             spread=(6, 2, 3, 3, 2)),
        _rec("qwen3_5_moe", "base", 0, "turboquant_k8v4", True, "pass", 4, 4, "plain decoding over 5 batch compositions",
             spread=(4, 2, 3, 3, 2)),
        _rec("qwen3_next", "mtp", 3, "turboquant_k8v4", False, "upstream-crash", None, 0),  # no tokens: not judged
    ])
    rows = {x.id: x for x in rj.rejudge(files)}
    assert "qwen3_next-mtp3-k8v4-full_and_piecewise-off" not in rows
    mtp = rows["qwen3_next-mtp3-auto-full_and_piecewise-off"]
    assert (mtp.old, mtp.new, mtp.plain, mtp.limits, mtp.fails) == ("upstream-works", "upstream-wrong", 10, (11, 11), ("count",))
    assert rows["qwen3_next-ngram3-k8v4-full_and_piecewise-on"].new == "pass"  # TurboQuant: no split rule
    split = rows["qwen3_5-ngram3-auto-full_and_piecewise-on"]
    assert split.new == "fail" and split.fails == ("split",) and "prompt 1 at 3 (1.50 vs 0.00)" in split.why
    assert rows["qwen3_5-mtp3-auto-full_and_piecewise-on"].new == "fail"
    moe = rows["qwen3_5_moe-mtp3-auto-full_and_piecewise-on"]
    assert (moe.new, moe.bf16, moe.fails) == ("undetermined", (0, 3), ("spread",)) and "'batch': 6/224 > limit 4" in moe.why
    assert rows["qwen3_5_moe-base-k8v4-full_and_piecewise-on"].new == "pass"  # 4 <= limit(0) = 4, spread too
    text = rj.render(list(rows.values()), files)
    assert "## Verdicts that change (2)" in text and "## Verdicts the records cannot settle (1)" in text
    assert "1 plugin cell(s) turn to fail: qwen3_5-ngram3-auto-full_and_piecewise-on" in text
    assert "qwen3_next-mtp3-auto-full_and_piecewise-off upstream-works -> upstream-wrong" in text
    assert "| model | spec |" not in text  # not an engine matrix for readme_tables' GPU table


@pytest.mark.parametrize("change,message", [
    (lambda r: r.update(bad=3.5 / N), "is not a whole number of positions"),
    (lambda r: r.update(status="upstream-wrong"), "the old rule on its own bad / floor does not give its status"),
    (lambda r: r["cell"].update(colour="red"), "cell fields ['colour'] unknown to cell_suites.Cell"),
])
def test_records_it_cannot_read_are_refused_by_name(tmp_path, change, message):
    rec = _rec("qwen3_next", "base", 0, "auto", False, "upstream-works", 3, 0)
    change(rec)
    files = _write(tmp_path, [rec])
    with pytest.raises(ValueError, match="run.json") as err:
        rj.rejudge(files)
    assert message in str(err.value)


def test_two_bf16_floors_for_one_model_in_one_run_are_refused(tmp_path):
    files = _write(tmp_path, [_rec("qwen3_next", "base", 0, "auto", True, "pass", 0, 0),
                              _rec("qwen3_next", "base", 0, "turboquant_k8v4", True, "pass", 1, 1)])
    with pytest.raises(ValueError, match=r"name different bf16 floors \[0, 1\]"):
        rj.rejudge(files)


def test_check_fails_when_results_md_is_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(rj, "OUT", tmp_path / "RESULTS.md")
    assert rj.main(["check"]) == 1
    (tmp_path / "RESULTS.md").write_text("old\n")
    assert rj.main(["check"]) == 1
    assert rj.main(["write"]) == 0 and rj.main(["check"]) == 0
    assert Path(REPO, "results/gpu/2026-12-02-rejudge/RESULTS.md").read_text() == (tmp_path / "RESULTS.md").read_text()
