"""tests/conftest.py shares the CPUs among pytest-xdist workers: each worker's CPU engines and references get
cpus // workers threads (CI: 2 workers on 2 cores, one thread each), a single process keeps vLLM's own."""
import os
import subprocess
import sys

from conftest import REPO, worker_threads


def test_share_per_worker():
    assert [worker_threads(2, 2), worker_threads(16, 2), worker_threads(2, 4), worker_threads(8, 1)] == [1, 8, 1, None]


def test_a_worker_process_gets_its_share_and_an_outside_setting_wins():
    """What a worker's engine subprocess inherits: conftest imported as xdist's worker imports it."""
    code = ("import sys, os; sys.path.insert(0, 'tests'); import conftest; "
            "print(os.environ.get('OMP_NUM_THREADS'), os.environ.get('NUMBA_NUM_THREADS'))")
    base = {k: v for k, v in os.environ.items()  # this test may itself run in an xdist worker
            if k not in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS") and not k.startswith("PYTEST_XDIST_")}
    cpus = len(os.sched_getaffinity(0))

    def child(**env):
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**base, **env}, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split()

    share = str(max(1, cpus // 2))
    assert child(PYTEST_XDIST_WORKER="gw0", PYTEST_XDIST_WORKER_COUNT="2") == [share, share]
    assert child(PYTEST_XDIST_WORKER="gw1", PYTEST_XDIST_WORKER_COUNT="2", OMP_NUM_THREADS="3") == ["3", "3"]
    assert child() == ["None", "None"]
