"""A child process run to completion or killed with its whole process group: an engine's
EngineCore and workers go with it, so a cell or benchmark past its time frees the GPU and the CPUs
for the next one (``testing/engine.py``, ``benchmarks/e2e_spec_decode.py``)."""
from __future__ import annotations

import os
import signal
import subprocess


def run_group(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` in its own process group, output captured. Past ``timeout`` the whole group is killed
    (vLLM's EngineCore and workers with it: left running they would hold the GPU and the CPUs the
    next cells need) and ``returncode`` is ``"timeout"``, with the output so far."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, "timeout", out or "", err or "")
