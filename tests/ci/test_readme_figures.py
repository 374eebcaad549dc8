"""Every figure the README and docs/results.md state comes from a committed result file, and the GPU results
tables in docs/results.md are generated from ``results/gpu/`` (``ci/tools/readme_tables.py``)."""
from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

import pytest

from conftest import REPO, load_tool
from vllm_platform_ext.testing import cells

rt = load_tool("ci/tools/readme_tables.py")
REPO_PATH = Path(REPO)


def _readme() -> str:
    with open(f"{REPO}/README.md", encoding="utf-8") as f:
        return f.read()


def _results_doc() -> str:
    """docs/results.md: the matrices, e2e tables and GPU results table that used to be the README's."""
    with open(f"{REPO}/docs/results.md", encoding="utf-8") as f:
        return f.read()


DOCS = rt.doc_texts()


@pytest.mark.parametrize("name", sorted(DOCS))
def test_every_figure_is_in_a_result_file_its_sentence_cites(name):
    """README.md, docs/*.md and the diary's sections moved from docs/: each figure is in the result files its
    sentence (else paragraph, else section) cites, as a whole number (``NO_RESULT_FILE``: the listed exceptions)."""
    text, base = DOCS[name]
    missing = rt.unbacked(text, rt.result_texts(), frozenset(rt.NO_RESULT_FILE.get(name, {})), why=True, base=base)
    assert not missing, f"{name}: figures the result files they cite do not contain (cite the file): {missing}"


def test_the_exceptions_are_figures_no_cited_file_backs():
    """Each NO_RESULT_FILE entry is still a figure of its text and still unbacked there: the list only
    holds what the check would otherwise reject, and an entry goes when its text is cited or changed."""
    texts = rt.result_texts()
    for name, entries in rt.NO_RESULT_FILE.items():
        text, base = DOCS[name]
        assert set(entries) <= set(rt.figures(text)), (name, set(entries) - set(rt.figures(text)))
        missing = set(rt.unbacked(text, texts, base=base))
        assert set(entries) <= missing, (name, "now backed, drop from NO_RESULT_FILE:", set(entries) - missing)


def test_results_live_only_under_results():
    """One home for results: the corpus is results/ (and it is not empty), the old homes are gone."""
    names = list(rt.result_texts())
    assert names and all(n.startswith("results/") for n in names), names[:5]
    for top in ("results/gpu/", "results/cpu/", "results/bench/"):
        assert any(n.startswith(top) for n in names), top
    for old in ("ci/gpu/results", "ci/cpu/results", "benchmarks/runs"):
        assert not (REPO_PATH / old).exists(), old
    assert not list((REPO_PATH / "benchmarks").glob("RESULTS_*.md"))


def test_committed_result_files_carry_a_run_header():
    checked = 0
    for name, text in rt.result_texts().items():
        if name.startswith(("results/gpu/", "results/cpu/")) and name.endswith(".md"):
            assert not rt.missing_header_keys(text), (name, rt.missing_header_keys(text))
            checked += 1
    assert checked >= 80, checked  # the GPU and CPU .md records (82 when results/ got its layout)


def test_gpu_results_tables_are_in_sync():
    assert rt.render_all(_results_doc()) == _results_doc(), "run `python ci/tools/readme_tables.py write`"


def test_full_matrix_summary_counts_each_row_per_line(tmp_path):
    """The `full` matrices' summary, from shard files written here: rows by graphs, speculation and bf16 or
    TurboQuant KV (the presets together), plugin-on statuses and upstream's, per vLLM line; other files ignored."""
    import json

    def res(model, mode, k, kv, graphs, plugin, status):
        return {"cell": {"model": model, "mode": mode, "k": k, "kv": kv, "graphs": graphs, "plugin": plugin},
                "status": status}

    d = tmp_path / "results"
    for sub in ("a-0.23.0-full-matrix", "b-0.26.0-full-matrix", "c"):
        (d / sub).mkdir(parents=True)
    (d / "a-0.23.0-full-matrix" / "2026-01-01-w1-0.23.0-full-shard01.json").write_text(json.dumps([
        res("a", "mtp", 3, "turboquant_k8v4", "full_and_piecewise", True, "pass"),
        res("b", "mtp", 3, "turboquant_3bit_nc", "full_and_piecewise", True, "fail"),
        res("a", "mtp", 3, "turboquant_k8v4", "full_and_piecewise", False, "upstream-crash"),
        res("a", "mtp", 3, "turboquant_3bit_nc", "full_and_piecewise", False, "upstream-wrong"),
        res("a", "ngram", 3, "auto", "eager", False, "upstream-works")]))
    (d / "b-0.26.0-full-matrix" / "2026-01-01-w1-0.26.0-full-shard02.json").write_text(json.dumps([
        res("a", "base", 0, "auto", "full_and_piecewise", True, "pass")]))
    (d / "c" / "2026-01-01-w1-0.26.0-tq.json").write_text(json.dumps([res("a", "base", 0, "auto", "eager", True, "fail")]))
    rows = rt.full_matrix_table(d).splitlines()
    assert rows[0] == ("| graphs | speculation | KV | 0.23.0 with the plugin | 0.23.0 upstream alone | "
                       "0.26.0 with the plugin | 0.26.0 upstream alone |")
    assert rows[2:] == [
        "| FULL_AND_PIECEWISE | none | bf16 | — | — | 1 pass | — |",
        "| FULL_AND_PIECEWISE | MTP k=3 | TurboQuant | 1 pass, 1 not | 1 crash, 1 wrong | — | — |",
        "| eager | ngram k=3 | bf16 | — | 1 right | — | — |"]
    readme = f"x\n{rt.MATRIX_BEGIN}\nold\n{rt.MATRIX_END}\n{rt.BEGIN}\nold\n{rt.END}\n"
    assert rt.full_matrix_table(d) in rt.render(readme, rt.full_matrix_table(d), rt.MATRIX_BEGIN, rt.MATRIX_END)


# ---- the checks themselves ----------------------------------------------------------------------

def test_figures_are_found_and_requirements_are_not():
    text = "Python ≥ 3.10; k=1/2/4; 4.2x faster, 19/347 accepted, 2906 tok/s, bad 0.004, 12 of 13 fail, 3 min"
    got = rt.figures(text)
    assert {"4.2x", "19/347", "2906 tok/s", "0.004", "12 of 13", "3 min"} <= set(got), got
    assert "3.10" not in got and "2/4" not in got


def test_an_unbacked_figure_is_reported():
    texts = {"results/cpu/x/x.md": "- date: d\nbase 2906 tok/s\n```\nqwen3_next  mtp  2  0.000  PASS\n```"}
    readme = ("It runs 2906 tok/s ([run](results/cpu/x/x.md)).\n\n```\nqwen3_next  mtp  2  0.000  PASS\n```\n")
    assert rt.unbacked(readme, texts) == []
    assert rt.unbacked(readme.replace("2906", "3100"), texts) == ["3100 tok/s"]
    # a sample output line must stand in a result file as it is, not only its numbers
    assert rt.unbacked(readme.replace("0.000  PASS", "0.000  FAIL"), texts) == ["qwen3_next  mtp  2  0.000  FAIL"]


def test_ranges_need_both_ends_and_commands_are_not_samples():
    texts = {"results/gpu/x/x.md": "- date: d\ninit 208 s ... init 260 s\n"}
    cite = " ([run](results/gpu/x/x.md))."
    assert rt.unbacked("Engines start in 208-260 s" + cite, texts) == []
    assert rt.unbacked("Engines start in 160–260 s" + cite, texts) == ["160–260 s"]
    assert rt.unbacked("```\npython ci/tools/x.py --vllm 0.23.0 --python 3.12\n```\n", texts) == []
    assert rt.unbacked("```\nrow 0.123  PASS\n```\n", texts) == ["row 0.123  PASS"]


def test_a_figure_matches_only_as_a_whole_number_of_the_file_it_cites():
    texts = {"results/cpu/a/a.md": "took 11.25 ms, then 1.25 ms; vllm 1.2.3; step | 13.6 |; C / B | 1.02 |",
             "results/cpu/b/b.md": "took 1.2 ms, 1,468 s in all"}
    a, b = "([a](results/cpu/a/a.md))", "([b](results/cpu/b/b.md))"
    assert rt.unbacked(f"It took 1.2 ms {a}.", texts) == ["1.2 ms"]  # not inside 11.25, 1.25 or 1.2.3
    assert rt.unbacked(f"It took 1.2 ms {b}.", texts) == []
    assert rt.unbacked("It took 1.2 ms.", texts) == ["1.2 ms"]  # cites nothing: backed by nothing
    assert rt.unbacked(f"It took 1.2 ms {a}. It took 468 s {b}.", texts) == ["1.2 ms", "468 s"]  # not 1,468
    assert rt.unbacked(f"It took 13.6 min {a}; C / B 1.02 x.", texts) == ["13.6 min"]  # a unit must be there
    # a sentence citing nothing takes its paragraph's, then its section's citations, never another section's
    assert rt.unbacked(f"It took 1.2 ms. More {b}.", texts) == []
    assert rt.unbacked(f"## One\n\nIt took 1.2 ms.\n\nSee {b}.\n", texts) == []
    assert rt.unbacked(f"## One\n\nSee {b}.\n\n## Two\n\nIt took 1.2 ms.\n", texts) == ["1.2 ms"]
    # the sentence's own citation wins over the paragraph's
    assert rt.unbacked(f"It took 1.2 ms {a}. More {b}.", texts) == ["1.2 ms"]
    # a run folder stands for its files; links are relative to the text's folder; a missing file backs nothing
    assert rt.unbacked("It took 1.2 ms (`results/cpu/b/`).", texts) == []
    assert rt.unbacked("It took 1.2 ms ([b](../results/cpu/b/b.md)).", texts, base="docs") == []
    assert rt.unbacked("It took 1.2 ms ([b](results/cpu/b/gone.md)).", texts) == ["1.2 ms"]
    # a table row's "same" is the row above's file
    table = f"| x | file |\n|---|---|\n| 1.2 ms | {b} |\n| 1.2 ms, 11.25 ms | same |\n| 1.25 ms | {b} |\n"
    assert rt.unbacked(table, texts) == ["11.25 ms", "1.25 ms"]


def _cited_result_files() -> list[str]:
    return sorted({c for text, base in DOCS.values() for c in rt.citations(text, base)})


def test_random_numbers_are_not_backed():
    """200 random x.yy numbers, each in a sentence citing one of the result files the docs cite (in turn), as
    a bare decimal, a ratio, milliseconds and a percentage: at most a handful are backed. The old rule (a
    substring of all result files together) backed nearly every one."""
    import random

    rng = random.Random(49)
    nums = sorted({f"{rng.randint(1, 9)}.{rng.randint(0, 99):02d}" for _ in range(200)})
    texts, files = rt.result_texts(), _cited_result_files()
    assert len(nums) > 150 and len(files) > 40, (len(nums), len(files))
    every = rt._norm("\n".join(texts.values()))
    assert sum(n in every for n in nums) > 0.9 * len(nums)  # the old check's corpus and match
    for form in ("{}", "{} x", "{} ms", "{}%"):
        claims = [form.format(n) for n in nums]
        doc = "\n\n".join(f"It was {c} (`{files[i % len(files)]}`)." for i, c in enumerate(claims))
        backed = set(claims) - set(rt.unbacked(doc, texts))
        assert len(backed) <= 5, (form, sorted(backed))


def _results_md(vllm="0.23.0") -> str:
    on = cells.CellResult(cell=asdict(cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", plugin=True)), id="a",
                          status="pass", bad=0.0, floor=0.004, accepted=40, draft_tokens=90,
                          engine_path={"device": "NVIDIA H100 80GB HBM3"},
                          versions={"vllm": vllm, "torch": "2.11.0+cu130"}, date="2026-11-25 21:00 UTC")
    off = cells.CellResult(cell=asdict(cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", plugin=False)), id="b",
                           status="upstream-crash", error="RuntimeError: Workspace is locked",
                           versions=on.versions, date=on.date)
    return cells.markdown([on, off])


def test_gpu_table_with_zero_and_more_result_files(tmp_path, monkeypatch):
    assert "No GPU engine matrix result" in rt.gpu_table(tmp_path)
    src = tmp_path / "results.md"
    src.write_text(_results_md())
    monkeypatch.setattr(rt, "GPU_RESULTS", tmp_path / "results" / "gpu")
    monkeypatch.setattr(rt, "ROOT", tmp_path)
    assert rt.main(["gpu-add", str(src), "--command", "bash ci/gpu/run.sh --do engine", "--commit", "abc1234"]) == 0
    (filed,) = (tmp_path / "results" / "gpu").rglob("*.md")
    assert filed.relative_to(tmp_path).as_posix() == "results/gpu/2026-11-25-vllm-0.23-engine-matrix/2026-11-25-vllm-0.23.md"
    text = filed.read_text()
    assert not rt.missing_header_keys(text), text[:400]
    assert rt.parse_header(text)["device"] == "NVIDIA H100 80GB HBM3"
    table = rt.gpu_table(tmp_path / "results" / "gpu")
    assert "| 0.23.0 | NVIDIA H100 80GB HBM3 | 2026-11-25 | 1 pass | 1 upstream-crash |" in table
    # the table lives in docs/results.md: its links are relative to docs/
    assert "(../results/gpu/2026-11-25-vllm-0.23-engine-matrix/2026-11-25-vllm-0.23.md)" in table
    readme = f"x\n{rt.BEGIN}\nold\n{rt.END}\ny\n"
    assert rt.render(readme, table) == f"x\n{rt.BEGIN}\n{table}\n{rt.END}\ny\n"
    with pytest.raises(ValueError, match="generated block"):
        rt.render("no markers", table)


def test_gpu_table_names_the_gpu_not_the_machine():
    """The result file's header keeps which lent machine a GPU sat in; docs/results.md's table names the GPU."""
    assert rt.gpu_device("NVIDIA H200, card 1 of an `nvidia-h200-x4` machine (64 CPUs), CPUs 16-31") == "NVIDIA H200"
    assert rt.gpu_device("NVIDIA H200 of an `nvidia-h200` machine (16 CPUs), CPUs 0-15") == "NVIDIA H200"
    assert rt.gpu_device("2 x NVIDIA H200 (cards 2 and 3 of an nvidia-h200-x4 machine, CPUs 48-63)") == "2 x NVIDIA H200"
    assert rt.gpu_device('NVIDIA H200, card 0 of an `nvidia-h200-x4` machine (64 CPUs), CPUs all 64 (the stand-in\'s '
                         'fake libmxsml names it "MetaX C500")') == 'NVIDIA H200 (the stand-in\'s fake libmxsml names it "MetaX C500")'
    assert rt.gpu_device("NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"


def test_readme_is_short_and_for_users():
    """README: at most 120 lines, what the plugin fixes and how to install it on the first screen, no lent-machine
    names or device-session jargon (those stay in the result files and results/gpu/DIARY.md)."""
    lines = _readme().splitlines()
    assert len(lines) <= 120, len(lines)
    first = "\n".join(lines[:25])
    assert "fixes" in first and "bash ci/setup.sh verify" in first
    for text, name in ((_readme(), "README.md"), (_results_doc(), "docs/results.md")):
        text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets name result files as they were written
        assert "nvidia-h200" not in text and "window" not in text.lower(), name


def test_diary_sections_moved_from_the_docs_are_checked():
    """docs/gpu_harness.md's dated measurements and session plans moved to results/gpu/DIARY.md: they state
    figures as they did in docs/, so the docs' rule holds for them there (the diary itself backs nothing;
    its links are relative to results/gpu/)."""
    text, base = DOCS["results/gpu/DIARY.md"]
    assert "## Measured on the GPU machine (2026-11-25" in text and base == "results/gpu"
    assert "results/gpu/DIARY.md" in rt.NOT_RESULTS
