"""docs/results.md's issue 53 table is generated from the result files (ci/tools/e2e_section.py): the
committed doc matches the generator's output; from result files the benchmarks' own writers produce,
each goal's row carries the figure, the target, met or not and a link to its file, and every figure in
the rows is one the cited file states (the check tests/ci/test_readme_figures.py applies to the docs);
the newest file wins, an async-off e2e run does not count, a goal without a file names its command."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from conftest import REPO, load_tool

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import bench_tq_vs_flash as T  # noqa: E402
import e2e_spec_decode as E  # noqa: E402
import serve_budget as S  # noqa: E402
from bench_common import write_result  # noqa: E402

gen = load_tool("ci/tools/e2e_section.py")
rt = load_tool("ci/tools/readme_tables.py")


def test_docs_results_table_is_the_generators_output():
    doc = (Path(REPO) / "docs" / "results.md").read_text(encoding="utf-8")
    assert gen.render(doc, gen.table()) == doc, "run `python ci/tools/e2e_section.py write`"


def test_nothing_measured_names_each_goals_command(tmp_path):
    (tmp_path / "results").mkdir()
    rows = gen.table(tmp_path, tmp_path / "docs").splitlines()[2:]
    assert len(rows) == 3 and all("not measured yet" in r for r in rows)
    assert "bench_tq_vs_flash.py" in rows[0] and "e2e_spec_decode.py" in rows[1] and "serve_budget.py" in rows[2]


def _head(date, **kw):
    return {"date": date, "device": "NVIDIA H200", "commit": "abc1234", "command": "python x", **kw}


def test_rows_from_result_files(tmp_path):
    res = tmp_path / "results"
    bw = 4.0e12
    krows = [T.row("turboquant_k8v4", 24, 4, 32768, 32, 3, tq_ms=0.61, fa_ms=1.3, bw=bw),
             T.row("turboquant_k8v4", 16, 2, 65536, 64, 0, tq_ms=0.9, fa_ms=1.6, bw=bw)]
    write_result(res / "bench/old-kernel/k.md", "t", _head("2026-12-01 10:00 UTC", benchmark="tq-vs-flash"),
                 T.tables(krows[:1]), {"rows": krows[:1], "goals": T.summary(krows[:1])})
    write_result(res / "bench/new-kernel/k.md", "t", _head("2026-12-08 10:00 UTC", benchmark="tq-vs-flash"),
                 T.tables(krows), {"rows": krows, "goals": T.summary(krows)})
    e2e = [{"config": c, "batch": b, "context": x, "verify_ms": v, "plain_ms": p, "async": True}
           for c, b, x, v, p in (("C", 8, 32768, 8.123, None), ("B", 8, 32768, 10.0, None),
                                 ("C0", 1, 56320, None, 9.5), ("A", 1, 56320, None, 10.0))]
    g53 = E.goals53(e2e)
    for mode, date in (("default", "2026-12-08 11:00 UTC"), ("sync", "2026-12-09 11:00 UTC")):
        write_result(res / f"gpu/e2e-{mode}/e2e.md", "t",
                     _head(date, benchmark="e2e", scheduling=mode, async_scheduling="on", model="qwen36_27b", layers=40),
                     E.goals_markdown(g53), {"rows": e2e, "goals53": g53})
    serve_rows = [{"config": "bf16", "kv": "auto", "output_throughput": 1000.0, "failed": 0},
                  {"config": "k8v4", "kv": "turboquant_k8v4", "output_throughput": 2345.6, "failed": 0}]
    out = res / "gpu/serve"
    out.mkdir(parents=True)
    S.report(serve_rows, out, _head("2026-12-08 12:00 UTC", benchmark="serve-budget", model="qwen36_a3b",
                                     concurrency=64, input_len=16384, output_len=512))
    docs = tmp_path / "docs"
    block = gen.table(tmp_path, docs)
    lines = block.splitlines()
    assert not any("not measured yet" in line for line in lines)
    assert "old-kernel" not in block and "e2e-sync" not in block  # the newest kernel run; default scheduling only
    kernel = [line for line in lines if line.startswith("| 1: k8v4 verify TQ / FA, heads 24/4")]
    assert kernel == ["| 1: k8v4 verify TQ / FA, heads 24/4 | worst row k8v4 24/4 32K B=32 K=3; rows met 1, rows 1 | "
                      "0.469 | <= 0.5 | met | [new-kernel](../results/bench/new-kernel/k.md) |"]  # 0.61 / 1.3
    assert "| 2: C / B verify step (issue 53) | qwen36_27b, 40 layers, async on; batch 8, context 32768 | 0.81 | <= 0.85 | met |" in block
    assert "| 2: C0 / A plain decode step (issue 53) | qwen36_27b, 40 layers, async on; batch 1, context 56320 | 0.95 |" in block
    assert "| 3: k8v4 / bf16 output tok/s | qwen36_a3b, 64 streams, 16384 in / 512 out | 2.35 | >= 2.0 | met |" in block
    assert "| 2: C / B verify step (issue 53) | qwen36_27b, 40 layers, async on; batch 32" not in block  # not measured
    # every figure of the generated rows is one its cited result file states
    texts = rt.result_texts(tmp_path)
    assert texts and rt.unbacked(block, texts, base="docs") == []
