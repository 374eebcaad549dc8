"""The live guard's outputs as printed, for docs/live_guard.md: `vllm serve` on the CPU engine with
VLLM_PLATFORM_EXT_GUARD=1, the servers and requests of tests/guard/test_guard_serve.py (planted: the recall
kit, MTP k=3, the guard-collapse plant; healthy: the random kit, plain decoding), a third server (the random
kit, ngram k=2) and the guard fed crafted steps (test_guard_detect.py's feed) for a spec_slower line.

    python results/cpu/2026-12-07-live-guard/repro.py --out results/cpu/2026-12-07-live-guard/RESULTS.md
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "tests" / "guard"), str(REPO / "benchmarks"), str(REPO)]

import test_guard_detect as D  # noqa: E402
import test_guard_serve as T  # noqa: E402
from bench_common import run_header, write_result  # noqa: E402


def _guard_lines(run: dict) -> list[str]:
    return [ln[ln.index("WARNING"):] if "WARNING" in ln else ln for ln in run["log"].splitlines()
            if "vllm-platform-ext guard" in ln]


def _metrics(run: dict) -> list[str]:
    return [ln for ln in run["metrics"].splitlines() if ln.startswith("vllm_platform_ext") and "_created" not in ln]


def crafted_spec_slower() -> list[str]:
    buf = io.StringIO()
    log = logging.getLogger("guard-demo")
    log.addHandler(logging.StreamHandler(buf))
    log.propagate = False
    clock = D.Clock()
    g = D.Guard(2, "ngram", log=log, clock=clock)
    D._run(g, {"p": [1] * 20, "q": [1] * 20, "r": [1] * 20}, clock, step_s=0.010, k=0)
    D._run(g, {"s": [2, 1] * 40, "t": [2, 1] * 40, "u": [1, 2] * 40}, clock, step_s=0.040)
    return buf.getvalue().splitlines()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from vllm_platform_ext.testing.kit_tokens import hot_token_ids
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    hot = hot_token_ids(8)
    r = random.Random(0)
    noise = [[r.choice(hot) for _ in range(n)] for n in (7, 13, 11, 9)]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        recall = str(make_tiny_model("qwen3_5_text", tmp / "recall", target="recall"))
        rand = str(make_tiny_model("qwen3_5_text", tmp / "random"))
        plant = os.pathsep.join([T.PLANT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        runs["planted: recall kit, MTP k=3, guard-collapse plant"] = T._serve(
            recall, T.ARGS + T.MTP3, tmp / "planted.log", {"PYTHONPATH": plant, "VPE_TEST_PLANT": "guard-collapse"},
            [[("base-1", noise[0]), ("base-2", noise[1])], [("collapse-1", noise[2]), ("loop-1", hot[:5] * 3)]])
        runs["healthy: random kit, plain decoding"] = T._serve(
            rand, T.ARGS, tmp / "healthy.log", {}, [[(f"healthy-{i}", p) for i, p in enumerate(noise)]])
        ngram = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 2,
                                                     "prompt_lookup_min": 2, "prompt_lookup_max": 3})]
        runs["random kit, ngram k=2 (text with no repeats)"] = T._serve(
            rand, T.ARGS + ngram, tmp / "ngram.log", {}, [[(f"ngram-{i}", p) for i, p in enumerate(noise)]])
    body = [f"Requests of {T.MAX_TOKENS} greedy tokens each (`ignore_eos`), 4 at most at once; "
            f"`vllm serve` arguments {' '.join(T.ARGS)} (+ the speculative config named).\n"]
    data = {}
    for name, run in runs.items():
        body += [f"## {name}\n", "Server log, the guard's lines:\n", "```", *_guard_lines(run), "```\n",
                 "`/metrics`, the guard's families:\n", "```", *_metrics(run), "```\n"]
        data[name] = {"guard_lines": _guard_lines(run), "metrics": _metrics(run)}
    slow = crafted_spec_slower()
    body += ["## spec_slower on crafted steps\n",
             "The guard fed tests/guard/test_guard_detect.py's feed: three requests' draft-free decode steps of 10 ms, "
             "then three requests' speculative steps of 40 ms gaining 1.5 tokens a request (ngram k=2):\n",
             "```", *slow, "```\n"]
    data["crafted spec_slower"] = slow
    write_result(a.out, "The live guard's warnings and metrics as printed (CPU engine)", run_header(),
                 "\n".join(body), data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
