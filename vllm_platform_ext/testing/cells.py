"""The engine matrix's runner: each cell's engine in its own process (several side by side on
one GPU), its tokens kept as the engines finish (:class:`cell_replay.RunsFile`), audited and judged
(:mod:`.cell_judge`), and the results as JSON lines and a Markdown table (:mod:`.cells_report`),
with the generated tokens committed beside them (``results.tokens.json``, :mod:`.cell_tokens`): what
a replay on any machine recomputes the bad counts and floors from. The cells and their suites are
:mod:`.cell_suites`.

A cell is one ``LLM`` on a tiny kit model, greedy over :func:`prompts.default_prompts` with
chunked prefill at 32 tokens a step, so the long prompts' prefill chunks share steps with
decoding and verifying requests. With the plugin every cell must stay within the binomial limit
of its floor in the float32 transformers audit, at 0.5 and at 0.1 nats (:mod:`.cell_judge` has the
rule) and, when speculative, have drafts accepted. Without
the plugin a cell records what upstream does (works / wrong tokens / crash with its message):
facts for the table, not assertions.

Run a suite (the GPU harness does this through ``tests/testing/test_gpu_engine.py``)::

    python -m vllm_platform_ext.testing.cells --suite core --out results/
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from vllm_platform_ext.testing import cell_tokens
from vllm_platform_ext.testing.bounds import ALPHA
from vllm_platform_ext.testing.cell_judge import _plain_siblings, audit_cells
from vllm_platform_ext.testing.cell_replay import RunsFile  # the engines' tokens, kept as they finish
from vllm_platform_ext.testing.cell_suites import (BATCH_FLOOR_KINDS, MAX_TOKENS, MEMORY_MODES, SUITES, Cell, select,
                                                   settings_for)
from vllm_platform_ext.testing.cells_report import report
from vllm_platform_ext.testing.engine import COMPOSITIONS, EngineRun, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.tiny_models import make_tiny_model

# cells.<name> as the tests, ci/ and docs read them: the suites, the judging, the results files
from vllm_platform_ext.testing.cell_judge import (  # noqa: F401,E402
    KNOWN_UPSTREAM, CellResult, expected_upstream, judge, unlike_known_upstream, versions)
from vllm_platform_ext.testing.cell_suites import KV_CACHE_BYTES, SPECS, TURBOQUANT, suite_cells  # noqa: F401,E402
from vllm_platform_ext.testing.cells_report import markdown, write_results  # noqa: F401,E402


PLANTED_DRAFTS = ("VPE_TEST_PLANT", "bad-draft-ids")  # tests/fixtures/plant: a third of the draft slots are bad ids


def judging_kit(kit: str, engine_env: dict | None) -> str:
    """The kit the judge applies its accept rule for: with bad draft ids planted in every engine (the
    ``bad-draft`` suite) the recall kit's MTP rule (mean length, each exact path 10 times) cannot hold -- a
    planted id is rejected with every draft after it (0.26.0, H100, 2026-12-07: accepted per position
    [305, 131, 0] on qwen3_5 MTP k=3 k8v4, 0/896 bad) -- so those cells need one accepted draft, as the random
    kit's do; their tokens are audited as any cell's."""
    key, value = PLANTED_DRAFTS
    return "planted-drafts" if (engine_env or {}).get(key) == value else kit


def run_cells(cells: list[Cell], work: Path, settings: EngineSettings, parallel: int = 1,
              alpha: float = ALPHA, dims: str = "gpu", timeout: float = 1800, log=print,
              reference_python: str | None = None, log_dir: Path | None = None,
              engine_env: dict | None = None, plugins_off: str = "", tokens_path: Path | None = None,
              kit: str | None = None) -> list[CellResult]:
    """Each cell in its own engine process (``parallel`` at a time), audited against float32 in a
    reference process (:func:`audit.reference_audits`; ``reference_python`` or
    ``VPE_REFERENCE_PYTHON``: a transformers that knows the model). A checkpoint the kit cannot
    write, or a reference that cannot load it, fails its cells as ``kit-error``: never a skip.
    ``timeout``: seconds per engine (its process group is killed past it, and the cell fails as
    ``harness-error``); ``log_dir``: each engine's whole log is kept there as ``<cell id>.log``.
    ``engine_env``: added to every engine process's environment (not the reference's): a stand-in's
    ``PYTHONPATH`` and switches; ``plugins_off``: see :meth:`Cell.env`. ``tokens_path``: the token
    sidecar to write (:mod:`.cell_tokens`; ``results.tokens.json`` beside ``results.json``). ``kit``:
    the kit's weights (``make_tiny_model``'s ``target``; default ``VPE_KIT``, else "recall")."""
    kit = kit or os.environ.get("VPE_KIT", "recall")
    prompts = default_prompts()
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    models, kit_errors = {}, {}
    for kind in sorted({c.model for c in cells}):
        try:
            models[kind] = make_tiny_model(kind, work / kind, dims=dims, target=kit)
        except Exception as exc:  # our kit's failure: every cell of the family fails with it
            kit_errors[kind] = f"kit: cannot write {kind}: {type(exc).__name__}: {exc}"[:400]
    todo = [c for c in cells if c.model in models]
    # plain decoding of a batch-floor family in other batch compositions, per KV dtype and graphs
    spread = list(dict.fromkeys(Cell(c.model, "base", 0, c.kv, c.graphs) for c in todo if c.model in BATCH_FLOOR_KINDS))
    spread_settings = replace(settings, compositions=tuple(COMPOSITIONS))
    # plain decoding beside a speculative cell (its token-identity sibling) also generates the other
    # batch compositions in its own engine: the identity floor (verify.identity.floor)
    siblings = {s for c in todo if c.mode != "base" for s in _plain_siblings(c)}
    kept = None if log_dir is None else RunsFile(Path(log_dir) / "runs.json", models, prompts, settings.max_tokens,
                                                 dims, len(todo) + len(spread), kit=kit)

    def one(cell: Cell, spread_run: bool = False):
        t0 = time.perf_counter()
        try:
            # vLLM 0.22-0.26 want the "align" block within one step's token budget
            cs = spread_settings if spread_run or cell in siblings else settings
            cs = replace(cs, max_num_batched_tokens=2048) if cell.prefix_caching else cs
            lp = None if log_dir is None else str(Path(log_dir) / f"{'spread-' if spread_run else ''}{cell.id}.log")
            run = run_in_subprocess(str(models[cell.model]), prompts, [cell.engine_config()], cs,
                                    env={**(engine_env or {}), **cell.env(plugins_off)}, timeout=timeout,
                                    log_path=lp)[0]
        except Exception as exc:  # the engine process itself died (e.g. a CUDA fault aborted it) or timed out
            run = EngineRun(mode=cell.mode, k=cell.k, error=f"{type(exc).__name__}: {exc}")
        log(f"[cells] {cell.id}: {'ERROR' if run.error else 'ran'} in {time.perf_counter() - t0:.0f}s")
        if kept is not None:
            kept.add(cell, spread_run, run)
        return run

    jobs = [(c, False) for c in todo] + [(c, True) for c in spread]
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        done = list(pool.map(lambda job: one(*job), jobs))
    runs, spread_runs = dict(zip(todo, done[:len(todo)])), dict(zip(spread, done[len(todo):]))
    if kept is not None:
        kept.finish(runs, spread_runs)
    with cell_tokens.FloorTokens() as floors:  # the bf16 floor's own tokens, as the reference returns them
        results = audit_cells(cells, models, kit_errors, runs, spread_runs, prompts, settings.max_tokens, alpha, log,
                              reference_python, kit=judging_kit(kit, engine_env))
    if tokens_path is not None:
        try:
            cell_tokens.write(tokens_path, cell_tokens.build(results, models, runs, spread_runs, prompts,
                                                             settings.max_tokens, dims, floors,
                                                             None if kept is None else kept.digests, kit=kit))
            log(f"[cells] generated tokens: {tokens_path}")
        except (ValueError, OSError) as exc:  # the results still get written; a run without its sidecar fails
            log(f"[cells] ERROR: no token sidecar {tokens_path}: {type(exc).__name__}: {exc}")
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="core",
                    help=f"a suite ({', '.join(SUITES)}) or several joined by + (union) and - (without): core+prefix-tq")
    ap.add_argument("--shard", default="1/1", help="i/n: every n-th cell starting at the i-th")
    ap.add_argument("--parallel", type=int, default=4, help="engines side by side (each gets 0.8/N of the GPU)")
    ap.add_argument("--memory", default="", choices=("",) + MEMORY_MODES,
                    help="GPU memory per engine: kv-bytes (default: kv_cache_memory_bytes, no profiling) or "
                         "utilization (0.8/N of the GPU, profiled: with --parallel 1)")
    ap.add_argument("--dims", default=None, help="tiny model head sizes: gpu (default off the CPU suite) or cpu")
    ap.add_argument("--out", default="gpu-results",
                    help="results.json, results.md, results.tokens.json, progress.log, engine-logs/")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per engine (its process group is killed past it)")
    ap.add_argument("--engine-env", type=Path, default=None,
                    help="a JSON object of environment variables every engine process gets (not the reference)")
    ap.add_argument("--plugins-off", default="", help="VLLM_PLUGINS of plugin-off cells (default: no plugin)")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                    help=f"greedy tokens a prompt (default {MAX_TOKENS}, the suites' audit size; fewer: a quicker "
                         "check of the harness itself, as CI's tests/ci/test_gpu_harness.py runs the CPU suite)")
    a = ap.parse_args(argv)
    if not 1 <= a.max_tokens <= MAX_TOKENS:  # the context (MAX_MODEL_LEN) has room for MAX_TOKENS and k drafts
        ap.error(f"--max-tokens {a.max_tokens}: want 1..{MAX_TOKENS}")
    cells = select(a.suite, a.shard)
    dims = a.dims or ("cpu" if a.suite == "cpu" else "gpu")
    engine_env = json.loads(a.engine_env.read_text()) if a.engine_env else None
    if engine_env is not None and not (isinstance(engine_env, dict)
                                       and all(isinstance(v, str) for v in engine_env.values())):
        ap.error(f"--engine-env {a.engine_env}: want a JSON object of strings")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        with open(out / "progress.log", "a") as f:
            f.write(line + "\n")

    tokens = cell_tokens.sidecar_path(out / "results.json")
    tokens.unlink(missing_ok=True)  # never an earlier run's
    with tempfile.TemporaryDirectory(prefix="vpe-cells-") as tmp:
        settings = replace(settings_for(a.suite, a.parallel, a.memory), max_tokens=a.max_tokens)
        results = run_cells(cells, Path(tmp), settings, a.parallel, dims=dims,
                            timeout=a.timeout, log=log, log_dir=out / "engine-logs", engine_env=engine_env,
                            plugins_off=a.plugins_off, tokens_path=tokens)
    rc = report(results, out, "cells: {n} run")
    if not tokens.is_file():
        log(f"[cells] no token sidecar {tokens}: these results cannot be replayed (see the ERROR above)")
        return 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
