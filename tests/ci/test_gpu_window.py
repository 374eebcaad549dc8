"""The device window's helpers (ci/gpu/window/): launch jobs on a card and CPUs, bring results back.

Run here with stand-in commands: what a window's plan relies on -- a job's stamps, output and exit
status, its card and CPU set, a shard's command, the pack's status lines and tar, a poll that ends
once the jobs it waits for are done."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

WINDOW = Path(__file__).resolve().parents[2] / "ci" / "gpu" / "window"


def _bash(script: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_job_runs_on_its_card_and_cpus_and_stamps_start_output_and_exit(tmp_path):
    r = tmp_path / "w"
    probe = ("import json, os; print(json.dumps({'card': os.environ['CUDA_VISIBLE_DEVICES'], "
             "'cpus': sorted(os.sched_getaffinity(0))}))")
    cpu = sorted(os.sched_getaffinity(0))[0]
    p = _bash(f". {WINDOW}/lib.sh; job ok {cpu} 3 python3 -c \"{probe}\"; job bad {cpu} 1 sh -c 'exit 7'; wait",
              tmp_path, R=str(r))
    assert p.returncode == 0, p.stderr
    out = (r / "ok.out").read_text().splitlines()
    assert json.loads(out[0]) == {"card": "3", "cpus": [cpu]} and out[-1] == "rc=0"
    assert (r / "bad.out").read_text().splitlines()[-1] == "rc=7"
    for n in ("ok", "bad"):
        assert int((r / f"{n}.start").read_text()) <= int((r / f"{n}.done").read_text())
    assert (r / "t0").exists()


def test_cells_shard_runs_run_sh_with_the_shard_and_stamps_it(tmp_path):
    (tmp_path / "ci" / "gpu").mkdir(parents=True)
    (tmp_path / "ci" / "gpu" / "run.sh").write_text('printf "%s|" "$@" > "$(dirname "$0")/args"\n')
    r = tmp_path / "w"
    p = _bash(f'. {WINDOW}/lib.sh; bash -c "$(cells_shard /tmp/b/wheels full 8/12 $R/full8 12 300)"', tmp_path,
              R=str(r))
    assert p.returncode == 0, p.stderr
    args = (tmp_path / "ci" / "gpu" / "args").read_text().split("|")[:-1]
    assert args == ["--wheels", "/tmp/b/wheels", "--do", "engine", "--timeout", "300", "--suite", "full",
                    "--parallel", "12", "--shard", "8/12", "--out", str(r / "full8"), "--", "-k", "not serve"]
    assert (r / "full8.start_ts").exists() and (r / "full8.end").exists()


def test_pack_lists_jobs_and_tars_the_small_files(tmp_path):
    r, out = tmp_path / "w", tmp_path / "out"
    (r / "full8").mkdir(parents=True)
    out.mkdir()
    (r / "t0").write_text(str(int(time.time()) - 100))
    (r / "a.start").write_text(str(int(time.time()) - 50))
    (r / "a.done").write_text(str(int(time.time()) - 10))
    (r / "a.out").write_text("log\nrc=0\n")
    (r / "b.start").write_text(str(int(time.time()) - 30))
    (r / "full8.end").write_text("1")
    (r / "full8" / "results.json").write_text("[]")
    (r / "full8" / "model.safetensors").write_bytes(b"x" * 10)
    (r / "big.log").write_bytes(b"x" * (4 << 20))
    p = _bash(f"bash {WINDOW}/pack.sh", tmp_path, R=str(r), OUT=str(out))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("t+") and "done: a 40s rc=0" in lines and any(l.startswith("running: b ") for l in lines)
    assert "full8.end" in p.stdout
    with tarfile.open(out / "w.tgz") as t:
        names = set(t.getnames())
    assert "w/full8/results.json" in names and "w/a.out" in names
    assert "w/full8/model.safetensors" not in names and "w/big.log" not in names


def test_poll_ends_once_the_jobs_it_waits_for_are_done(tmp_path):
    r = tmp_path / "w"
    p = _bash(f". {WINDOW}/lib.sh; job a 0 0 sleep 1; t=$(date +%s); bash {WINDOW}/poll.sh 60 1; "
              "echo took=$(( $(date +%s) - t ))", tmp_path, R=str(r), POLL_EVERY="0.2", OUT="")
    assert p.returncode == 0, p.stderr
    assert "done: a " in p.stdout and int(p.stdout.rsplit("took=", 1)[1]) < 10


def test_poll_ends_once_the_plan_has_ended(tmp_path):
    """A plan's last line writes $R/plan.end: the poll stops there even when it was asked for more jobs than the
    plan has (window 12: 5 asked, 1 job, 150 s of device time polled after the end)."""
    r = tmp_path / "w"
    plan = tmp_path / "plan.sh"
    plan.write_text(f". {WINDOW}/lib.sh; job a 0 0 sleep 1; wait_jobs; date +%s > $R/plan.end\n")
    p = _bash(f". {WINDOW}/lib.sh; launch {plan} {tmp_path}/plan.log; t=$(date +%s); "
              f"bash {WINDOW}/poll.sh 60 5; echo took=$(( $(date +%s) - t ))", tmp_path, R=str(r), POLL_EVERY="0.2", OUT="")
    assert p.returncode == 0, p.stderr
    assert "done: a " in p.stdout and "plan.end" in p.stdout and int(p.stdout.rsplit("took=", 1)[1]) < 10


def test_wait_jobs_waits_for_the_jobs_not_for_the_host_logger(tmp_path):
    """The endless host logger runs beside the jobs; waiting for the jobs must not wait for it (a bare
    `wait` did, and the plan's next step never started in windows 9 and 10)."""
    r = tmp_path / "w"
    p = _bash(f". {WINDOW}/lib.sh; host_log 0.2; job a 0 0 sleep 0.5; t=$(date +%s); wait_jobs; "
              "echo took=$(( $(date +%s) - t )); sleep 0.6", tmp_path, R=str(r))
    try:
        assert p.returncode == 0, p.stderr
        assert int(p.stdout.rsplit("took=", 1)[1]) < 5 and (r / "a.done").exists()
        lines = (r / "host.log").read_text().splitlines()
        assert len(lines) >= 2 and all(len(l.split("|")) == 3 for l in lines), lines
        assert float(lines[0].split()[1]) >= 0  # the 1-minute load average
        time.sleep(0.5)
        assert len((r / "host.log").read_text().splitlines()) > len(lines)  # still logging after the plan's shell ended
    finally:
        os.kill(int((r / "host_log.pid").read_text()), 9)


def test_a_launched_plan_outlives_the_call_that_launched_it(tmp_path):
    """A device call's processes end with the call: a plan started with `launch` keeps running after
    the launching shell's whole process group is killed; a plain background job does not."""
    r = tmp_path / "w"
    plan = tmp_path / "plan.sh"
    plan.write_text(f"sleep 1; touch {r}/launched.ok\n")
    call = subprocess.Popen(["bash", "-c", f". {WINDOW}/lib.sh; launch {plan} {tmp_path}/plan.log; "
                             f"job plain 0 0 bash -c 'sleep 1; touch {r}/plain.ok'; sleep 30"],
                            cwd=tmp_path, env={**os.environ, "R": str(r)}, start_new_session=True)
    time.sleep(0.3)
    os.killpg(call.pid, 9)  # the call ends
    call.wait()
    deadline = time.time() + 10
    while not (r / "launched.ok").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    assert (r / "launched.ok").exists() and not (r / "plain.ok").exists()
