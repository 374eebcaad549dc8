"""The benchmarks' shared reporting helper (benchmarks/bench_common.py): every result states
date, device, versions and command, the Markdown and the JSON beside it carry the same run, and
tables print what they are given (None as n/a, formats per column). The timing half needs a GPU
(do_bench_cudagraph) and runs in the benchmarks on the GPU machine."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import bench_common as BC  # noqa: E402


def test_run_header_states_when_where_what_and_how():
    head = BC.run_header(["benchmarks/bench_gdn.py", "--bench", "--out", "x y"], copy_bandwidth="4.24 TB/s")
    for key in ("date", "host", "device", "python", "torch", "command"):
        assert head[key], key
    assert head["command"] == "python benchmarks/bench_gdn.py --bench --out 'x y'"  # shell-quoted, re-runnable
    assert head["copy_bandwidth"] == "4.24 TB/s"
    import torch

    assert head["torch"] == torch.__version__
    assert head["device"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")


def test_markdown_table_formats_columns_and_missing_values():
    rows = [{"B": 1, "ms": 0.01234, "x": None}, {"B": 8, "ms": 1.5, "x": 2.0}]
    md = BC.markdown_table(rows, [("B", "batch"), ("ms", "ours ms"), ("x", "vs (b)")], {"ms": ".3f", "x": ".1f"})
    assert md.splitlines() == ["| batch | ours ms | vs (b) |", "|---|---|---|", "| 1 | 0.012 | n/a |",
                               "| 8 | 1.500 | 2.0 |"]
    assert BC.markdown_table([]) == "(no rows)"


def test_write_result_writes_markdown_and_json_of_the_same_run(tmp_path):
    head = BC.run_header(["benchmarks/x.py"], device="NVIDIA H200")
    md = BC.write_result(tmp_path / "sub" / "res.md", "Title", head, "| a |\n|---|\n| 1 |\n", {"rows": [{"a": 1}]})
    text = md.read_text()
    assert text.startswith("# Title\n\n- date: ")
    assert "- device: NVIDIA H200" in text and "    python benchmarks/x.py" in text and "- command: `python benchmarks/x.py" in text and text.endswith("| 1 |\n")
    data = json.loads(md.with_suffix(".json").read_text())
    assert data["header"] == json.loads(json.dumps(head)) and data["data"] == {"rows": [{"a": 1}]}



def test_every_benchmark_script_imports_here():
    """The GPU benchmarks cannot run here, but each imports (names it uses from the package and
    from bench_common exist) in a fresh interpreter, as on the GPU machine."""
    import subprocess

    bench_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
    scripts = sorted(f[:-3] for f in os.listdir(bench_dir) if f.endswith(".py") and f not in ("vllm_adapter.py",))
    assert {"bench_gdn", "bench_turboquant", "floor_turboquant", "e2e_spec_decode", "profile_turboquant"} <= set(scripts)
    for name in scripts:
        out = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=bench_dir, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, (name, out.stderr[-2000:])
