"""Paired end-to-end step times (issue 32): two configurations' engines alive at once on one GPU,
taking turns at timed blocks, so that each ratio (C / B, R / C) compares steps measured seconds apart.

Why: at batch 1 an engine step is mostly host work. Window 9 saw one configuration's median verify
step at 5.6 ms in one engine instance and 9.4 ms in the next, on a quiet host, in rounds minutes
apart: ``e2e_spec_decode.py --rounds`` (one engine per configuration per round) cannot judge a 10%
goal through that. Here the two engines start once, each with its KV cache given
(``--kv-cache-memory-bytes``: neither's memory profiling counts the other) and each on its own CPUs
(``--cpus A:B``). Then, block after block, one engine runs a timed generate while the other waits,
in alternating order (AB, BA, AB, ...). Halfway through, the two swap CPU sets (every thread of each
engine's process group is re-pinned), so a slow CPU set is paid by both. Before each generate, a fixed
pure-Python probe is timed on the engine's own thread: where the host's speed moves, the probe moves
with the steps.

    python benchmarks/e2e_paired.py --configs C,B --batch 1 --context 4096 --blocks 16 --cpus 0-6:7-13 --out DIR
    python benchmarks/e2e_paired.py --configs C,R --batch 1 --context 32768 --blocks 16 --cpus 0-6:7-13 --out DIR
    python benchmarks/e2e_paired.py --model tiny --configs B,B-off --graphs eager --kv-presets auto \\
        --batch 1 --context 64 --max-tokens 16 --blocks 4 --out DIR                   # CPU smoke

Output: ``e2e.md`` / ``e2e.json`` / ``e2e.png`` as ``e2e_spec_decode.py`` writes them (each block is a
round there: the table and goals take each configuration's median block), then the blocks side by side:
each block's steps, probes, CPUs, the time the hypervisor stole from the engine's CPUs during it, and the pair's ratio; the median of the ratios per CPU-set half and
overall. Engine logs: ``DIR/engine-<config>/engine.log``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_spec_decode as E  # noqa: E402
from bench_common import header_markdown, run_header  # noqa: E402

POLL_S = 0.01


def parse_cpus(text: str) -> set[int]:
    """A CPU list as the kernel writes one (``0-6,9``) as a set of CPU numbers."""
    out = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or (hi.isdigit() and int(hi) < int(lo)):
            raise ValueError(f"CPU list {text!r}: {part!r} is not N or N-M with N <= M")
        out |= set(range(int(lo), int(hi or lo) + 1))
    if not out:
        raise ValueError(f"CPU list {text!r} names no CPU")
    return out


def cpu_sets(text: str | None) -> tuple[set[int] | None, set[int] | None]:
    """``--cpus A:B``: the two engines' CPU sets (each within this process's), or (None, None)."""
    if not text:
        return None, None
    parts = text.split(":")
    if len(parts) != 2:
        raise ValueError(f"--cpus {text!r}: give two CPU lists joined by ':' (0-6:7-13)")
    sets = tuple(parse_cpus(p) for p in parts)
    allowed = os.sched_getaffinity(0)
    for s in sets:
        if not s <= allowed:
            raise ValueError(f"--cpus {text!r}: CPUs {sorted(s - allowed)} are not this process's ({sorted(allowed)})")
    return sets


def host_probe(n: int = 200_000, reps: int = 3) -> float:
    """Milliseconds of a fixed pure-Python loop on the calling thread (median of ``reps``): the host's
    speed for interpreter work, which is what a batch-1 engine step mostly is."""
    times = []
    for _ in range(reps):
        t0, acc = time.perf_counter(), 0
        for i in range(n):
            acc += i * i
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def steal_ms(cpus) -> float | None:
    """Milliseconds the hypervisor has so far run something else on ``cpus`` while they had work
    (``/proc/stat``'s steal column, summed over those CPUs); None where the kernel reports none."""
    total, seen = 0, False
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus and len(fields) > 7:
                    total += int(fields[7])
                    seen = True
    except OSError:
        return None
    return 1e3 * total / os.sysconf("SC_CLK_TCK") if seen else None


def pin_group(leader: int, cpus: set[int]) -> int:
    """Pin every thread of every process in ``leader``'s process group to ``cpus``; the count pinned."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != leader:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), cpus)
                n += 1
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue  # gone meanwhile
    return n


def _write_json(path: Path, data) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # the driver never reads half a file


# ------------------------------------------------------------------- the engine process

def serve(job_path: str, d: str) -> int:
    """One engine that runs a timed generate for each ``go.<i>`` file in ``d`` and answers with
    ``done.<i>.json`` (its steps, probe, CPU, spec counters), until ``quit`` appears."""
    job, d = json.loads(Path(job_path).read_text()), Path(d)
    from vllm_platform_ext.testing.engine import apply_engine_env, engine_path, run_engine, timed_generate

    apply_engine_env()
    log = E.StepLog()
    E.install_step_timer(log)
    cfg, settings, extra = E.engine_setup(job)
    (batch, context), = job["pairs"]
    prompts = E._prompts(batch, context, job["vocab"])

    def blocks(llm, sp):
        path = engine_path(llm)
        _write_json(d / "ready.json", {"pid": os.getpid(), "engine_path": path, "gpu_local_cpus": E.gpu_local_cpus()})
        i = 0
        while True:
            while not (d / f"go.{i}").exists():
                if (d / "quit").exists():
                    return
                time.sleep(POLL_S)
            probe = host_probe()
            log.take()  # nothing of the wait between blocks
            mine = os.sched_getaffinity(0)
            t0, stolen = time.time(), steal_ms(mine)
            outs, gen_s, spec = timed_generate(llm, prompts, sp, 0)
            after = steal_ms(mine)
            _write_json(d / f"done.{i}.json", {
                "t0": t0, "probe_ms": probe, "affinity": sorted(mine),
                "steal_ms": None if stolen is None or after is None else after - stolen,
                "steps": log.take(),
                "run": {"generate_s": gen_s, "num_generated": sum(len(o.outputs[0].token_ids) for o in outs),
                        "engine_path": path, **spec}})
            i += 1

    run_engine(job["model"], prompts, cfg, settings, llm_kwargs=extra, then=blocks)
    return 0


# ------------------------------------------------------------------- the driver

class Engine:
    """One configuration's engine process (its own process group, its own directory)."""

    def __init__(self, setup: E.Setup, job: dict, d: Path, cpus: set[int] | None):
        self.setup, self.d = setup, d
        d.mkdir(parents=True, exist_ok=True)
        (d / "job.json").write_text(json.dumps(job))
        self.log = open(d / "engine.log", "w")
        pre = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(d / "job.json"), str(d)],
                                     env=E.engine_env(setup), stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=pre)

    def wait_for(self, name: str, deadline: float) -> dict:
        path = self.d / name
        while not path.exists():
            if self.proc.poll() is not None:
                tail = (self.d / "engine.log").read_text(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"engine {self.setup.name} exited ({self.proc.returncode}) before {name}: "
                                   + " | ".join(tail)[-400:])
            if time.time() > deadline:
                raise TimeoutError(f"engine {self.setup.name}: no {name} within the time allowed")
            time.sleep(POLL_S)
        return json.loads(path.read_text())

    def pin(self, cpus: set[int]) -> None:
        pin_group(self.proc.pid, cpus)

    def stop(self, grace: float = 60) -> None:
        (self.d / "quit").touch()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.log.close()


def block_order(i: int) -> tuple[int, int]:
    """Which engine goes first in block ``i``: AB, BA, AB, ... (neither always follows the other)."""
    return (0, 1) if i % 2 == 0 else (1, 0)


def run_pair(model: Path, pair: list[E.Setup], batch: int, context: int, a, out: Path) -> list[dict]:
    """The two engines side by side, ``a.blocks`` blocks in turns; one row per engine and block
    (``summarize``'s row with round = block, plus the probe, the CPU set and who ran first)."""
    sets = cpu_sets(a.cpus)
    engines = [Engine(s, E.engine_job(model, s, [(batch, context)], a), out / f"engine-{s.name}", c)
               for s, c in zip(pair, sets)]
    rows = []
    try:
        start = time.time() + a.timeout
        ready = [e.wait_for("ready.json", start) for e in engines]
        for i in range(a.blocks):
            if i == a.blocks // 2 and sets[0] is not None and sets[0] != sets[1]:  # halfway: swap CPU sets
                engines[0].pin(sets[1])
                engines[1].pin(sets[0])
            for pos, j in enumerate(block_order(i)):
                e = engines[j]
                (e.d / f"go.{i}").touch()
                done = e.wait_for(f"done.{i}.json", time.time() + a.block_timeout)
                res = {"run": done["run"], "steps": done["steps"] | {"gpu_local_cpus": ready[j]["gpu_local_cpus"]}}
                row = E.summarize(e.setup, batch, context, res) | E._host_load(i + 1)
                row |= {"probe_ms": done["probe_ms"], "cpu_set": done["affinity"], "first": pos == 0, "t0": done["t0"],
                        "steal_ms": done.get("steal_ms")}
                rows.append(row)
                with open(out / "rows.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
    except (RuntimeError, TimeoutError) as exc:
        rows.append({"config": pair[0].name, "error": str(exc)})
    finally:
        for e in engines:
            e.stop()
    return rows


def step_ms(row: dict) -> float | None:
    return row.get("verify_ms") or row.get("plain_ms")


def _ms(v) -> str:
    return "—" if v is None else f"{v:.0f}"


def _cpus_text(cpus) -> str:
    cpus = sorted(cpus or ())
    if len(cpus) > 1 and cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"{cpus[0]}-{cpus[-1]}"
    return ",".join(map(str, cpus))


def pair_table(rows: list[dict], names: tuple[str, str]) -> tuple[str, dict]:
    """The blocks side by side (Markdown) and the paired figures: per block the first configuration's
    step over the second's; the median ratio overall and per CPU-set half, their range."""
    by = {(r["config"], r["round"]): r for r in rows if "error" not in r}
    blocks = sorted({b for _, b in by})
    a, b = names
    lines = [f"| block | first | {a} step ms | {b} step ms | {a} / {b} | {a} probe ms | {b} probe ms | "
             f"{a} CPU set | {a} steps' CPU | {b} steps' CPU | {a} steal ms | {b} steal ms |", "|" + "---|" * 12]
    ratios, halves = [], {}
    for k in blocks:
        x, y = by.get((a, k)), by.get((b, k))
        if not x or not y or not step_ms(x) or not step_ms(y):
            continue
        q = step_ms(x) / step_ms(y)
        ratios.append(q)
        halves.setdefault(_cpus_text(x["cpu_set"]), []).append(q)
        lines.append(f"| {k} | {a if x['first'] else b} | {step_ms(x):.2f} | {step_ms(y):.2f} | {q:.3f} | "
                     f"{x['probe_ms']:.1f} | {y['probe_ms']:.1f} | {_cpus_text(x['cpu_set'])} | "
                     f"{E.main_cpu(x)} | {E.main_cpu(y)} | {_ms(x.get('steal_ms'))} | {_ms(y.get('steal_ms'))} |")
    med = lambda v: statistics.median(v) if v else None  # noqa: E731
    figures = {"pair": [a, b], "ratios": ratios, "median_ratio": med(ratios),
               "min_ratio": min(ratios, default=None), "max_ratio": max(ratios, default=None),
               "median_ratio_by_cpu_set": {k: med(v) for k, v in halves.items()}}
    if not ratios:
        return "(no block has both configurations' steps)\n", figures
    summary = (f"\n{a} / {b} step, paired: median {figures['median_ratio']:.3f} over {len(ratios)} blocks "
               f"(range {figures['min_ratio']:.3f}-{figures['max_ratio']:.3f}); by {a}'s CPU set: "
               + ", ".join(f"{k}: {v:.3f}" for k, v in figures["median_ratio_by_cpu_set"].items()) + ".\n")
    return "\n".join(lines) + "\n" + summary, figures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", nargs=2, metavar=("JOB", "DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=E.MODELS, default="qwen36_a3b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--configs", default="C,B", help="two configurations of e2e_spec_decode.py (A B B-off C R E ...)")
    ap.add_argument("--graphs", default="full_and_piecewise")
    ap.add_argument("--kv-presets", default=None, help="restrict to these KV dtypes (auto on the CPU)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4,
                    help="each engine's share (vLLM checks it as free at start-up; two engines share the GPU)")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=8 << 30,
                    help="each engine's KV cache (vLLM skips its memory profiling, which the other engine would trip)")
    ap.add_argument("--blocks", type=int, default=16, help="timed generates per engine, in turns")
    ap.add_argument("--cpus", default=None, help="the two engines' CPU sets, A:B (0-6:7-13); swapped halfway")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for both engines to start")
    ap.add_argument("--block-timeout", type=float, default=300, help="seconds for one timed generate")
    ap.add_argument("--scheduling", choices=E.SCHEDULING, default="default",
                    help="default: async scheduling as the line resolves it (users' mode); sync: off")
    ap.add_argument("--out", default="results/gpu/new-e2e-paired")
    a = ap.parse_args(argv)
    if a.serve:
        return serve(*a.serve)
    a.tp, a.mode = 1, a.scheduling
    if a.blocks < 2:
        ap.error(f"--blocks takes a count >= 2; got {a.blocks}")
    try:
        cpu_sets(a.cpus)
    except ValueError as exc:
        ap.error(str(exc))
    names = a.configs.split(",")
    if len(names) != 2:
        ap.error(f"--configs takes two configurations; got {a.configs!r}")
    kv_only = set(a.kv_presets.split(",")) if a.kv_presets else None
    pair = []
    for tries in E.setups(names, a.graphs):  # D's fallbacks do not apply: the first setup of each
        tries = [s for s in tries if kv_only is None or s.kv in kv_only]
        if not tries:
            ap.error(f"--kv-presets {a.kv_presets!r} leaves no setup of one of {names}")
        pair.append(tries[0])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vpe-e2e-paired-") as tmp:
        model = E.write_model(a.model, a.layers, Path(tmp) / a.model)
        rows = run_pair(model, pair, a.batch, a.context, a, out)
    errors = [r for r in rows if "error" in r]
    ok = [r for r in rows if "error" not in r]
    table, figures = pair_table(ok, (pair[0].name, pair[1].name))
    extra = ("\n## Blocks side by side (both engines alive; each block: one timed generate each, in alternating "
             "order; CPU sets swapped halfway; probe: a fixed Python loop on the engine's thread just before; steal: time the hypervisor ran something else on the engine's CPUs during its generate)\n\n"
             + table + "".join(f"\nerror: {r['error']}\n" for r in errors))
    title = (f"Paired end-to-end step times, model {a.model}"
             + (f" ({a.layers} layers, dummy weights)" if a.model != "tiny" else "") + f": {' vs '.join(names)}")
    head = run_header(device=next((r["device"] for r in ok if r.get("device")), None) or "?",
                      scheduling=a.mode, async_scheduling=E.resolved_async(ok), benchmark="e2e-paired",
                      model=a.model, layers=a.layers if a.model != "tiny" else None)
    body = E.report(ok, out, title, head, extra=extra, extra_data={"paired": figures, "errors": errors})
    print(f"# {title}\n\n{header_markdown(head)}\n\n{body}")
    return 1 if errors or not figures["ratios"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
