"""ci/setup.sh checks free disk before installing: a full disk otherwise surfaces deep inside pip
as ``[Errno 28] No space left on device`` (CI failed so on 2026-11-28). ``df`` and ``python3`` are
stand-ins on PATH, so nothing is installed whichever way the check goes."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, free_mb: int | None, mode: str) -> subprocess.CompletedProcess:
    """``free_mb`` None: a ``df`` that fails and prints no figure."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "df").write_text(
        "#!/bin/sh\necho 'df: cannot read table of mounted file systems' >&2\nexit 1\n" if free_mb is None else
        "#!/bin/sh\necho 'Filesystem 1048576-blocks Used Available Capacity Mounted'\n"
        f"echo '/dev/x 250000 1 {free_mb} 1% /'\n")
    # Reached only when the check lets the install go on: it stops there, installing nothing.
    (bin_ / "python3").write_text("#!/bin/sh\necho 'stand-in python3: install reached' >&2\nexit 3\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_}{os.pathsep}{os.environ['PATH']}", VENV=str(tmp_path / "venv"))
    return subprocess.run(["bash", str(ROOT / "ci" / "setup.sh"), mode], capture_output=True,
                          text=True, env=env, timeout=60)


@pytest.mark.parametrize("mode", ["install", "verify", "test"])
def test_too_little_disk_is_named_before_pip_runs(tmp_path, mode):
    out = _run(tmp_path, 100, mode)
    assert out.returncode == 1, out.stderr
    assert "not enough free disk" in out.stderr and "100 MB free" in out.stderr, out.stderr
    assert "install reached" not in out.stderr


def test_enough_disk_goes_on_to_the_install(tmp_path):
    out = _run(tmp_path, 500_000, "install")
    assert "not enough free disk" not in out.stderr
    assert "install reached" in out.stderr, out.stderr


def test_a_df_that_answers_nothing_does_not_block_the_install(tmp_path):
    """Free space unknown (df fails, prints no figure): the install goes on as before the check."""
    out = _run(tmp_path, None, "install")
    assert "not enough free disk" not in out.stderr
    assert "install reached" in out.stderr, out.stderr
