"""The live guard's cost per engine step against the step itself (issue 54: goal <= 1% at batch 64).

Two measurements, both written to one result (``--out``):

* **synthetic** (any host, no engine): the guard's two hooks as vLLM calls them -- the output hook on a
  step's ``EngineCoreOutput`` list (vLLM's own class) and ``GuardStatLogger.record`` on vLLM's own
  ``SchedulerStats`` / ``SpecDecodingStats`` -- for ``--batch`` requests a step, each gaining 1-4 ids a
  step (MTP k=3 at a mean acceptance length of ~2.5), ids from a 150k vocabulary, a quarter of the
  requests looping; requests finish and are replaced. Median and mean microseconds per step.
* **engine** (``--engine``): `vllm serve` of ``--model`` (default: the recall kit, qwen3_5_text) with
  ``VLLM_PLATFORM_EXT_GUARD=1`` and ``--batch`` concurrent requests of ``--tokens`` tokens; from
  ``/metrics`` before and after: the guard's own seconds (``vllm_platform_ext:guard_seconds_total``, the
  hooks timed inside the server) over its steps (``..._steps_total``) against the wall time of the
  run over the same steps. The tiny kit's steps are short, so its ratio is a pessimistic bound for a
  real model's; the GPU figure comes from the same command on the GPU machine with a real checkpoint.

    python benchmarks/bench_guard_overhead.py --engine --out results/cpu/2026-12-07-guard-overhead/RESULTS.md
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace as NS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import markdown_table, run_header, write_result  # noqa: E402


def synthetic(batch: int, steps: int, k: int = 3, seed: int = 0) -> dict:
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from vllm_platform_ext.guard import monitor
    from vllm_platform_ext.guard.stat_logger import GuardStatLogger

    monitor.install(None)
    cfg = NS(speculative_config=NS(num_speculative_tokens=k, method="mtp"), model_config=NS(served_model_name="b"))
    logger = GuardStatLogger(cfg, 0)
    guard = monitor.current()
    guard.log = NS(warning=lambda *a: None)  # incidents still counted; the log line is not what is timed
    r = random.Random(seed)
    live: dict[str, dict] = {}
    nxt = 0
    per_step, cpu = [], []  # wall and this thread's CPU time (a shared host preempts the wall clock)
    for step in range(steps):
        while len(live) < batch:
            cyc = [r.randrange(150000) for _ in range(r.randrange(2, 20))]
            live[f"req-{nxt}"] = {"left": r.randrange(64, 512), "loop": nxt % 4 == 0, "cyc": cyc, "i": 0, "new": True}
            nxt += 1
        outs, spec = [], SpecDecodingStats.new(k)
        for rid, st in list(live.items()):
            n = 1 if st["new"] else min(st["left"], r.choice([1, 2, 3, 3, 4]))
            if st["loop"]:
                ids = [st["cyc"][(st["i"] + j) % len(st["cyc"])] for j in range(n)]
                st["i"] += n
            else:
                ids = [r.randrange(150000) for _ in range(n)]
            st["left"] -= n
            done = st["left"] <= 0
            if not st["new"]:
                spec.observe_draft(num_draft_tokens=k, num_accepted_tokens=n - 1)
            st["new"] = False
            outs.append(EngineCoreOutput(request_id=rid, new_token_ids=ids, finish_reason=1 if done else None))
            if done:
                del live[rid]
        sched = SchedulerStats(num_running_reqs=len(outs), spec_decoding_stats=spec)
        it = IterationStats()
        t0, c0 = time.perf_counter(), time.thread_time()
        guard.observe(outs, {})
        logger.record(sched, it)
        per_step.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    warm = per_step[steps // 10:]
    cpu_warm = cpu[steps // 10:]
    monitor.install(None)
    return {"batch": batch, "steps": len(warm), "median_us": statistics.median(warm) * 1e6,
            "mean_us": statistics.fmean(warm) * 1e6, "p99_us": sorted(warm)[int(len(warm) * 0.99)] * 1e6,
            "cpu_mean_us": statistics.fmean(cpu_warm) * 1e6,
            "incidents": dict(guard.counts)}


def _metric(text: str, name: str) -> float:
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{"))


def engine(model: str | None, batch: int, tokens: int, serve_args: list[str], work: Path) -> dict:
    from vllm_platform_ext.testing.kit_tokens import hot_token_ids
    from vllm_platform_ext.testing.serve_load import start_server, stop_server
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    if model is None:
        model = str(make_tiny_model("qwen3_5_text", work / "recall", target="recall"))
    proc, port = start_server(model, serve_args, str(work / "serve.log"), {"VLLM_PLATFORM_EXT_GUARD": "1"})
    hot = hot_token_ids(8)
    r = random.Random(0)

    def metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as f:
            return f.read().decode()

    def one(i: int) -> int:
        body = {"model": "tiny", "prompt": [r.choice(hot) for _ in range(8 + i % 24)], "max_tokens": tokens,
                "temperature": 0, "ignore_eos": True}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=1200) as f:
            return json.loads(f.read())["usage"]["completion_tokens"]

    try:
        # warm-up: the measured batch's own shapes once. With one request as the warm-up, the tiny kit's batch-64 step
        # came out at 83.5 ms on an H100 (2026-12-07): first-time costs of the batch's shapes (Triton compiling for
        # them, likely) fell in the measured window and inflated the step the overhead is set against.
        with ThreadPoolExecutor(batch) as pool:
            list(pool.map(one, range(batch)))
        before = metrics()
        t0 = time.monotonic()
        with ThreadPoolExecutor(batch) as pool:
            done = sum(pool.map(one, range(batch)))
        wall = time.monotonic() - t0
        after = metrics()
    finally:
        stop_server(proc)
    steps = _metric(after, "vllm_platform_ext:guard_steps_total") - _metric(before, "vllm_platform_ext:guard_steps_total")
    guard_s = _metric(after, "vllm_platform_ext:guard_seconds_total") - _metric(before, "vllm_platform_ext:guard_seconds_total")
    return {"model": model, "batch": batch, "tokens": done, "steps": int(steps), "wall_s": wall,
            "step_ms": wall / steps * 1e3, "guard_us_per_step": guard_s / steps * 1e6,
            "overhead_pct": 100 * guard_s / wall, "serve_args": " ".join(serve_args)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3000, help="synthetic steps")
    ap.add_argument("--engine", action="store_true", help="also serve --model and measure in the server")
    ap.add_argument("--model", default=None, help="a checkpoint path (default: the recall kit)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens a request in the engine run")
    ap.add_argument("--serve-args", default=json.dumps(["--dtype", "bfloat16", "--enforce-eager", "--max-model-len",
                                                        "512", "--max-num-seqs", "64", "--speculative-config",
                                                        json.dumps({"method": "mtp", "num_speculative_tokens": 3})]),
                    help="JSON list of `vllm serve` arguments")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    syn = [synthetic(b, a.steps) for b in sorted({8, a.batch, 256})]
    print(markdown_table(syn))
    eng = None
    if a.engine:
        with tempfile.TemporaryDirectory() as tmp:
            eng = engine(a.model, a.batch, a.tokens, json.loads(a.serve_args), Path(tmp))
        print(markdown_table([eng]))
    if a.out:
        body = ("## Synthetic: the hooks on vLLM's own output and stats objects\n\n"
                + markdown_table(syn, fmt={"median_us": ".1f", "mean_us": ".1f", "p99_us": ".1f", "cpu_mean_us": ".1f"}) + "\n")
        if eng:
            body += ("\n## In `vllm serve`: the guard's own seconds (timed in the server) over the run's wall time\n\n"
                     + markdown_table([eng], fmt={"wall_s": ".1f", "step_ms": ".2f", "guard_us_per_step": ".1f",
                                                  "overhead_pct": ".3f"}) + "\n")
        write_result(a.out, "Live guard overhead per engine step", run_header(), body, {"synthetic": syn, "engine": eng})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
