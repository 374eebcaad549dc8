"""The generated tokens of a cell run, committed beside its results, and their replay anywhere.

A cell run's ``results.json`` holds verdicts and the numbers behind them (``bad``, ``floor``,
``positions``); alone it is the run's word: re-applying :func:`audit.passes` to them checks the
file against itself, and a hand-edited shard passes. The *sidecar* written beside it holds what
those numbers were computed from, small enough to commit with every result:

* ``results.tokens.json`` beside ``results.json`` (a results file committed as ``NAME.json`` keeps
  its sidecar as ``NAME.tokens.json``: :func:`sidecar_path`);
* per cell id: the engine's generated ids per prompt and the floor's parts the cell is held to;
* the prompts, ``max_tokens``, the vLLM line and versions;
* per kit model: the :func:`tiny_models.make_tiny_model` arguments, the checkpoint's tensor digest
  (:func:`cell_replay.checkpoint_digest`), and the bf16 floor's own generated ids as the run's
  reference produced them (transformers bf16 greedy, on the machine of the run);
* the batch-floor families' plain-decoding spread runs (one token set per batch composition).

Token ids are stored as base64 of one byte per id, one string per prompt: the kit vocabulary
(:data:`kit_tokens.VOCAB_SIZE`) is 256; an id that does not fit is refused by name.

:func:`replay_cells` writes the kit checkpoints again here (deterministic, seeded), refuses a model
whose digest differs, runs the float32 reference (:class:`audit.Reference`, in this process) on
the committed tokens, and recomputes each sampled cell's bad count and its floor; they must match
``results.json`` within one position, and only where the reference itself is near its threshold
(:data:`BAND`): a token flipped at a position the reference is sure of, or a bad count or floor
edited by hand, is caught. :func:`consistency` is the cheap check of every cell (tokens present
where the result was audited, their count its ``positions``). ::

    python -m vllm_platform_ext.testing.cell_tokens results/cpu/2026-12-02-cells-tokens/results.tokens.json
"""
from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import inspect
import json
import sys
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from vllm_platform_ext.testing.audit import BAD_NATS, MARGIN, observing, passes
from vllm_platform_ext.testing.bounds import ALPHA, limit
from vllm_platform_ext.testing.cell_suites import Cell
from vllm_platform_ext.testing.kit_tokens import VOCAB_SIZE

FORMAT = "vpe-cell-tokens/1"
SUFFIX = ".tokens.json"
# A position whose float32 regret lies within BAND nats of BAD_NATS may fall either side of it on another
# machine's float32 (the GPU's reference against this CPU's): only there may a recomputed count differ
# from the committed one, and by at most MAX_DIFF positions per count.
BAND = 0.05
MAX_DIFF = 1
SAMPLE = 2  # cells replayed per sidecar by the CI test (:func:`sample`)
PROMPTS_SOURCE = "vllm_platform_ext.testing.prompts.default_prompts()"


# ---- naming and encoding ----------------------------------------------------------------------

def sidecar_path(results: str | Path) -> Path:
    """The sidecar of a results file: ``results.json`` -> ``results.tokens.json``, ``NAME.json`` ->
    ``NAME.tokens.json``."""
    results = Path(results)
    if results.suffix != ".json" or results.name.endswith(SUFFIX):
        raise ValueError(f"{results}: not a results file (want NAME.json, not a {SUFFIX} sidecar)")
    return results.with_name(results.name[:-len(".json")] + SUFFIX)


def results_path(sidecar: str | Path) -> Path:
    """The results file a sidecar belongs to (the inverse of :func:`sidecar_path`)."""
    sidecar = Path(sidecar)
    if not sidecar.name.endswith(SUFFIX):
        raise ValueError(f"{sidecar}: not a token sidecar (its name ends {SUFFIX})")
    return sidecar.with_name(sidecar.name[:-len(SUFFIX)] + ".json")


def encode_ids(ids: list, what: str) -> str:
    """One prompt's token ids as base64 of one byte per id; ``ValueError`` naming ``what`` for an id
    outside the kit vocabulary (and so for any id one byte cannot hold)."""
    if VOCAB_SIZE > 256:
        raise ValueError(f"{what}: the kit vocabulary is {VOCAB_SIZE} ids, one byte per id holds 256: "
                         f"{FORMAT} cannot store its tokens (widen the encoding)")
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < VOCAB_SIZE:
            raise ValueError(f"{what}: token id {t!r} at position {i} is outside the kit vocabulary "
                             f"(0..{VOCAB_SIZE - 1}): one byte per id cannot store it")
    return base64.b64encode(bytes(ids)).decode("ascii")


def decode_ids(text, what: str) -> list[int]:
    """The inverse of :func:`encode_ids`; ``ValueError`` naming ``what`` for text that is not
    base64 or an id outside the kit vocabulary."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (AttributeError, UnicodeEncodeError, binascii.Error, ValueError) as exc:
        raise ValueError(f"{what}: not base64 token ids ({type(exc).__name__}: {exc})") from None
    ids = list(raw)
    for i, t in enumerate(ids):
        if t >= VOCAB_SIZE:
            raise ValueError(f"{what}: token id {t} at position {i} is outside the kit vocabulary (0..{VOCAB_SIZE - 1})")
    return ids


def _encode_all(token_lists: list, what: str) -> list[str]:
    return [encode_ids(list(t), f"{what}, prompt {i}") for i, t in enumerate(token_lists)]


def _decode_all(texts, what: str) -> list[list[int]] | None:
    if texts is None:
        return None
    if not isinstance(texts, list):
        raise ValueError(f"{what}: want a list of base64 strings (one per prompt), got {type(texts).__name__}")
    return [decode_ids(t, f"{what}, prompt {i}") for i, t in enumerate(texts)]


def prompts_digest(prompts: list) -> str:
    return hashlib.sha256(json.dumps([list(p) for p in prompts]).encode()).hexdigest()


def kit_args(kind: str, dims: str, target: str = "random") -> dict:
    """The whole :func:`tiny_models.make_tiny_model` call the cells runner makes for ``kind``: its
    defaults (seed, std, hot tokens, MTP mode, ...) with ``dims``, so a replay writes the same
    checkpoint even if a default changes later."""
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    args = {n: p.default for n, p in inspect.signature(make_tiny_model).parameters.items()
            if p.default is not inspect.Parameter.empty}
    return {"kind": kind, **args, "dims": dims, "target": target}


# ---- what the run's reference returned ----------------------------------------------------------

class FloorTokens:
    """The bf16 floor's own generated ids of each checkpoint, as the run's reference processes return
    them (:func:`audit.observing` around :func:`cell_judge.audit_cells`)::

        with FloorTokens() as floors:
            results = audit_cells(...)
        floors.tokens(model_dir)  # one list of ids per prompt, or None where no reference returned
    """

    def __init__(self):
        self._lock, self._tokens, self._meta, self._cm = threading.Lock(), {}, {}, None

    def __call__(self, model_dir, floor, audits, meta) -> None:
        with self._lock:
            self._tokens[str(model_dir)] = [list(t) for t in floor.generated] or None
            self._meta[str(model_dir)] = dict(meta)

    def tokens(self, model_dir) -> list | None:
        return self._tokens.get(str(model_dir))

    def meta(self, model_dir) -> dict:
        return self._meta.get(str(model_dir), {})

    def __enter__(self):
        self._cm = observing(self)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def floor_parts(cell: Cell, audited: set, spread: set) -> list[str]:
    """What a cell's floor counts, as :func:`cell_judge.audit_cells` builds it (mirrored here; a replay
    recomputes each part): ``bf16`` (the bf16 floor of the cell's model), and for a speculative cell its
    plain decoding on the same KV preset, graphs, plugin setting and platform: ``cell:<id>`` where that
    cell ran, else ``spread:<id>`` (a batch-floor family's spread run, its own batch composition). The
    floor is max(bf16, plain capped at :func:`bounds.limit` of bf16): a plain run that is itself wrong
    cannot raise it. ``audited``: ids of the run's cells whose engine gave tokens; ``spread``: ids of the
    spread runs that did."""
    parts = ["bf16"]
    if cell.mode == "base":
        return parts
    same = replace(cell, mode="base", k=0).id
    if same in audited:
        parts.append(f"cell:{same}")
    elif same in spread:
        parts.append(f"spread:{same}")
    return parts


# ---- writing ------------------------------------------------------------------------------------

def build(results: list, models: dict, runs: dict, spread_runs: dict, prompts: list, max_tokens: int, dims: str,
          floors: FloorTokens | None, digests: dict | None = None, kit: str = "random") -> dict:
    """The sidecar of one cell run: ``results`` (CellResult), ``models`` (kind -> checkpoint dir),
    ``runs`` / ``spread_runs`` (Cell -> EngineRun), ``floors``: the reference's bf16 tokens (None: not
    kept, the floor then cannot be replayed and :func:`consistency` says so); ``digests``: kind ->
    checkpoint digest where already known."""
    from vllm_platform_ext.testing.cell_replay import checkpoint_digest

    vers = next((dict(r.versions) for r in results if r.versions), {})
    data = {
        "format": FORMAT,
        "about": "a cell run's generated token ids (vllm_platform_ext/testing/cell_tokens.py): results.json's "
                 "bad/floor recomputed from these by the float32 reference",
        "encoding": f"base64 of one byte per token id, one string per prompt (kit vocabulary {VOCAB_SIZE})",
        "vllm": vers.get("vllm", ""), "versions": vers, "max_tokens": int(max_tokens), "dims": dims,
        "prompts": {"source": PROMPTS_SOURCE, "sha256": prompts_digest(prompts), "ids": _encode_all(prompts, "prompts")},
        "models": {}, "spread": {}, "cells": {},
    }
    for kind, path in sorted(models.items()):
        floor = floors.tokens(path) if floors is not None else None
        data["models"][kind] = {
            "make_tiny_model": kit_args(kind, dims, kit),
            "checkpoint_sha256": (digests or {}).get(kind) or checkpoint_digest(path),
            "reference": floors.meta(path) if floors is not None else {},
            "floor_bf16": None if floor is None else _encode_all(floor, f"{kind}'s bf16 floor"),
        }
    for cell, run in spread_runs.items():
        if not run.error:
            data["spread"][cell.id] = {"model": cell.model, "runs": {
                name: _encode_all(t, f"spread run {cell.id} ({name})")
                for name, t in {"batch": run.tokens, **run.compositions}.items()}}
    audited = {c.id for c, r in runs.items() if not r.error}
    for r in results:
        cell = Cell(**r.cell)
        run = runs.get(cell)
        tokens = None if run is None or run.error else _encode_all(run.tokens, f"cell {r.id}")
        data["cells"][r.id] = {"model": cell.model, "tokens": tokens,
                               "floor_parts": floor_parts(cell, audited, set(data["spread"]))}
    return data


def write(path: str | Path, data: dict) -> Path:
    """Write a sidecar (one line per prompt's tokens: small diffs); returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path


# ---- reading and checking -----------------------------------------------------------------------

def load(path: str | Path) -> dict:
    """A sidecar, its format checked; ``ValueError`` naming the file otherwise."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a token sidecar: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: token sidecar format {got!r}, this reads {FORMAT!r}")
    for key in ("prompts", "models", "cells", "spread", "max_tokens"):
        if key not in data:
            raise ValueError(f"{path}: token sidecar without {key!r}")
    return data


def load_results(path: str | Path) -> list[dict]:
    """A results file: a list of CellResult dicts."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not all(isinstance(r, dict) and "id" in r and "cell" in r for r in data):
        raise ValueError(f"{path}: not a list of cell results")
    return data


def consistency(side: dict, results: list[dict]) -> list[str]:
    """What makes a sidecar unfit to back its results, without the reference: the same cells; tokens
    for every audited cell, one list per prompt, no longer than ``max_tokens``, their count the cell's
    ``positions``; the floor's parts present; the models' digests and arguments; the vLLM line."""
    problems = []
    try:
        prompts = _decode_all(side["prompts"]["ids"], "prompts")
    except (KeyError, TypeError, ValueError) as exc:
        return [f"the prompts cannot be read: {exc}"]
    if prompts_digest(prompts) != side["prompts"].get("sha256"):
        problems.append("the prompts' sha256 is not that of the prompts stored")
    ids, have = [r["id"] for r in results], list(side["cells"])
    if sorted(ids) != sorted(have):
        problems.append(f"cells differ: results only {sorted(set(ids) - set(have))}, sidecar only "
                        f"{sorted(set(have) - set(ids))}")
    for kind, m in side["models"].items():
        if not isinstance(m.get("make_tiny_model"), dict) or m["make_tiny_model"].get("kind") != kind:
            problems.append(f"model {kind}: no make_tiny_model arguments of that kind")
        if not m.get("checkpoint_sha256"):
            problems.append(f"model {kind}: no checkpoint digest")
    for r in results:
        entry = side["cells"].get(r["id"])
        if entry is None:
            continue
        if r.get("versions", {}).get("vllm", "") != side.get("vllm", ""):
            problems.append(f"{r['id']}: vLLM {r.get('versions', {}).get('vllm')!r} in results, "
                            f"{side.get('vllm')!r} in the sidecar")
        if entry.get("model") not in side["models"]:
            problems.append(f"{r['id']}: its model {entry.get('model')!r} has no entry (arguments, digest)")
        try:
            tokens = _decode_all(entry.get("tokens"), f"cell {r['id']}")
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if r.get("bad") is None:
            continue  # not audited (an engine error, a kit error): no claim the tokens must back
        if tokens is None:
            problems.append(f"{r['id']}: audited (bad {r['bad']}) but the sidecar has no tokens")
            continue
        if len(tokens) != len(prompts):
            problems.append(f"{r['id']}: {len(tokens)} token lists for {len(prompts)} prompts")
        if sum(map(len, tokens)) != r.get("positions"):
            problems.append(f"{r['id']}: {sum(map(len, tokens))} tokens committed, results say "
                            f"{r.get('positions')} positions audited")
        if any(len(t) > side["max_tokens"] for t in tokens):
            problems.append(f"{r['id']}: a prompt has more than max_tokens={side['max_tokens']} tokens")
        problems += [f"{r['id']}: floor part {p}: {why}" for p in entry.get("floor_parts", [])
                     for why in [_part_missing(side, entry["model"], p)] if why]
    return problems


def _part_missing(side: dict, model: str, part: str) -> str:
    if part == "bf16":
        return "" if (side["models"].get(model) or {}).get("floor_bf16") else "no bf16 floor tokens kept"
    kind, _, ref = part.partition(":")
    if kind == "spread":
        return "" if ref in side["spread"] else "no such spread run"
    if kind == "cell":
        return "" if (side["cells"].get(ref) or {}).get("tokens") else "no such cell with tokens"
    return "unknown part"


def sample(side: dict, results: list[dict], n: int = SAMPLE) -> list[str]:
    """The cells the CI test replays (a fixed rule): of the audited cells with tokens, the one nearest
    its verdict's line (highest ``bad - floor``: where an edit from fail to pass would matter most),
    then the lowest sha256 of the id, until ``n``."""
    cand = [r for r in results if r.get("bad") is not None and r.get("floor") is not None
            and (side["cells"].get(r["id"]) or {}).get("tokens")]
    if not cand or n <= 0:
        return []
    h = {r["id"]: hashlib.sha256(r["id"].encode()).hexdigest() for r in cand}
    first = min(cand, key=lambda r: (-(r["bad"] - r["floor"]), h[r["id"]]))
    rest = sorted((r for r in cand if r is not first), key=lambda r: h[r["id"]])
    return [first["id"]] + [r["id"] for r in rest[:n - 1]]


# ---- replaying ----------------------------------------------------------------------------------

@dataclass
class Count:
    """One token set's float32 audit here: ``bad`` positions (regret > BAD_NATS); ``sure``: those past
    BAD_NATS + BAND; ``maybe``: those past BAD_NATS - BAND (the committed count must lie in between)."""
    bad: int
    sure: int
    maybe: int
    positions: int

    @property
    def fraction(self) -> float:
        return self.bad / self.positions if self.positions else float("nan")

    def admits(self, committed: int) -> bool:
        return self.sure <= committed <= self.maybe and abs(committed - self.bad) <= MAX_DIFF


@dataclass
class CellReplay:
    id: str
    bad: Count | None = None
    committed_bad: int | None = None
    floor: float | None = None  # recomputed: the highest part
    committed_floor: float | None = None
    parts: dict = field(default_factory=dict)  # part -> Count
    problems: list = field(default_factory=list)


class DigestMismatch(ValueError):
    pass


class Replayer:
    """Kit checkpoints written here and their float32 references, kept across replays (a test replays
    several sidecars and edited copies of one); every token set's audit is kept too."""

    def __init__(self, work: str | Path, threads: int | None = None):
        self.work, self.threads = Path(work), threads
        self._built, self._refs, self._counts = {}, {}, {}

    def checkpoint(self, args: dict) -> tuple[Path, str]:
        """(dir, digest) of the kit checkpoint ``make_tiny_model(**args)`` writes here."""
        from vllm_platform_ext.testing.cell_replay import checkpoint_digest
        from vllm_platform_ext.testing.tiny_models import make_tiny_model

        key = json.dumps(args, sort_keys=True)
        if key not in self._built:
            kw = dict(args)
            kind = kw.pop("kind")
            path = make_tiny_model(kind, self.work / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:10]}", **kw)
            self._built[key] = (path, checkpoint_digest(path))
        return self._built[key]

    def reference(self, name: str, args: dict, digest: str):
        """The float32 reference of a model whose checkpoint, written here, has the committed digest;
        :class:`DigestMismatch` naming the model otherwise."""
        from vllm_platform_ext.testing.audit import Reference

        path, here = self.checkpoint(args)
        if here != digest:
            raise DigestMismatch(
                f"kit model {name} (make_tiny_model {args}) written here differs from the committed checkpoint "
                f"(sha256 {here[:12]} here, {str(digest)[:12]} committed): the committed tokens are not of these weights")
        key = json.dumps(args, sort_keys=True)
        if key not in self._refs:
            self._refs[key] = Reference(str(path), threads=self.threads)
        return key, self._refs[key]

    def count(self, ref_key: str, ref, prompts: list, tokens: list) -> Count:
        key = (ref_key, json.dumps(prompts), json.dumps(tokens))
        if key not in self._counts:
            regrets = [x for p, g in zip(prompts, tokens) for x in ref.regrets(p, g)]
            self._counts[key] = Count(bad=sum(x > BAD_NATS for x in regrets),
                                      sure=sum(x > BAD_NATS + BAND for x in regrets),
                                      maybe=sum(x > BAD_NATS - BAND for x in regrets), positions=len(regrets))
        return self._counts[key]


def _part_tokens(side: dict, model: str, part: str) -> dict:
    """name -> token lists of one floor part (a spread part has one per batch composition)."""
    if part == "bf16":
        return {"bf16": _decode_all(side["models"][model]["floor_bf16"], f"{model}'s bf16 floor")}
    kind, _, ref = part.partition(":")
    if kind == "spread":  # the floor counts the spread run's own batch composition (cell_judge._plain_key)
        return {f"spread:{ref}|batch": _decode_all(side["spread"][ref]["runs"]["batch"], f"spread run {ref} (batch)")}
    return {part: _decode_all(side["cells"][ref]["tokens"], f"cell {ref}")}


def replay_cells(side: dict, results: list[dict], ids: list[str], replayer: Replayer) -> list[CellReplay]:
    """Each of ``ids`` recomputed from the sidecar's tokens here; a :class:`CellReplay` per cell, its
    ``problems`` empty when the committed bad count and floor are what the tokens give (within
    :data:`MAX_DIFF` positions, and only at positions within :data:`BAND` of the threshold) and the
    committed verdict is that of its numbers."""
    by_id = {r["id"]: r for r in results}
    prompts = _decode_all(side["prompts"]["ids"], "prompts")
    out = []
    for cid in ids:
        rep = CellReplay(cid)
        out.append(rep)
        r, entry = by_id.get(cid), side["cells"].get(cid)
        if r is None or entry is None:
            rep.problems.append(f"{cid}: not in both the results and the sidecar")
            continue
        model = entry["model"]
        m = side["models"].get(model)
        if m is None:
            rep.problems.append(f"{cid}: its model {model} has no entry in the sidecar")
            continue
        try:
            ref_key, ref = replayer.reference(model, m["make_tiny_model"], m["checkpoint_sha256"])
        except DigestMismatch as exc:
            rep.problems.append(f"{cid}: {exc}")
            continue
        tokens = _decode_all(entry["tokens"], f"cell {cid}")
        if tokens is None or r.get("bad") is None:
            rep.problems.append(f"{cid}: no tokens or no committed bad fraction to replay")
            continue
        rep.bad = replayer.count(ref_key, ref, prompts, tokens)
        rep.committed_bad = round(r["bad"] * r["positions"]) if r.get("positions") else 0
        if rep.bad.positions != r.get("positions"):
            rep.problems.append(f"{cid}: {rep.bad.positions} positions in the tokens, {r.get('positions')} committed")
        elif not rep.bad.admits(rep.committed_bad):
            rep.problems.append(
                f"{cid}: bad count {rep.committed_bad}/{r['positions']} committed, the float32 reference here gives "
                f"{rep.bad.bad} ({rep.bad.sure} past {BAD_NATS}+{BAND} nats, {rep.bad.maybe} past {BAD_NATS}-{BAND}): "
                "the committed tokens do not give the committed bad fraction")
        rep.committed_floor = r.get("floor")
        for part in entry.get("floor_parts", []):
            why = _part_missing(side, model, part)
            if why:
                rep.problems.append(f"{cid}: floor part {part}: {why}")
                continue
            for name, toks in _part_tokens(side, model, part).items():
                rep.parts[name] = replayer.count(ref_key, ref, prompts, toks)
        counted = [c for c in rep.parts.values() if c.positions]
        if rep.committed_floor is not None and counted:
            # max(bf16, plain capped at bf16's limit), as cell_judge; each count's band likewise
            bf = rep.parts.get("bf16")
            n_bf = bf.positions if bf is not None else 0
            cap = (lambda x, b: min(x, limit(b, n_bf))) if bf is not None and n_bf else (lambda x, b: x)
            lo = max((c.sure if k == "bf16" else cap(c.sure, bf.sure)) / c.positions
                     for k, c in rep.parts.items() if c.positions)
            hi = max((c.maybe if k == "bf16" else cap(c.maybe, bf.maybe)) / c.positions
                     for k, c in rep.parts.items() if c.positions)
            rep.floor = max((c.bad if k == "bf16" else cap(c.bad, bf.bad)) / c.positions
                            for k, c in rep.parts.items() if c.positions)
            step = MAX_DIFF / min(c.positions for c in counted)
            eps = 1e-9
            if not (lo - eps <= rep.committed_floor <= hi + eps and abs(rep.committed_floor - rep.floor) <= step + eps):
                rep.problems.append(
                    f"{cid}: floor {rep.committed_floor:.4f} committed, its parts give {rep.floor:.4f} here "
                    f"({', '.join(f'{k} {c.bad}/{c.positions}' for k, c in rep.parts.items())})")
        elif rep.committed_floor is not None:
            rep.problems.append(f"{cid}: floor {rep.committed_floor} committed, no floor part to recompute it from")
        status = r.get("status")
        if r.get("criteria"):  # the rule of testing/bounds.py: each threshold's count within the floor's limit
            ok = all(c["count"] <= c["limit"] == limit(max(c["floor_bf16"], c.get("floor_plain") or 0),
                                                        c["positions"], c.get("alpha", ALPHA))
                     for c in r["criteria"])
            said = "; ".join(f"{c['count']} of {c['positions']} > {c['nats']:g} nats, limit {c['limit']}"
                             for c in r["criteria"])
            if r["criteria"][0]["count"] != rep.committed_bad:
                rep.problems.append(f"{cid}: criteria count {r['criteria'][0]['count']} is not the bad count "
                                    f"{rep.committed_bad} committed")
        else:  # results before 2026-12-02: floor + 2 points
            ok = passes(r["bad"], r["floor"], MARGIN) if r.get("floor") is not None else False
            said = f"bad {r['bad']:.4f} against floor {r['floor']:.4f} + {MARGIN}"
        if status in ("pass", "upstream-works") and not ok or status == "upstream-wrong" and ok:
            rep.problems.append(f"{cid}: {status} committed, but {said} says {'pass' if ok else 'not'}")
    return out


def check(sidecar: str | Path, ids: list[str] | None = None, replayer: Replayer | None = None,
          results: str | Path | None = None) -> tuple[list[str], list[CellReplay]]:
    """(problems, replays) of one committed sidecar: :func:`consistency` over every cell, then the
    replay of ``ids`` (default: :func:`sample`). ``results``: its results file (default
    :func:`results_path`)."""
    side = load(sidecar)
    res_path = Path(results) if results else results_path(sidecar)
    if not res_path.is_file():
        return [f"{sidecar}: no results file {res_path.name} beside it"], []
    res = load_results(res_path)
    problems = consistency(side, res)
    if problems:
        return problems, []
    own = replayer is None
    tmp = tempfile.TemporaryDirectory(prefix="vpe-tokens-") if own else None
    try:
        rep = replay_cells(side, res, sample(side, res) if ids is None else ids,
                           replayer or Replayer(tmp.name))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return [p for c in rep for p in c.problems], rep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sidecars", nargs="+", type=Path, help=f"token sidecars (*{SUFFIX}) beside their results")
    ap.add_argument("--all", action="store_true", help="replay every audited cell, not the CI test's sample")
    a = ap.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="vpe-tokens-") as tmp:
        replayer = Replayer(tmp)
        for path in a.sidecars:
            if not path.is_file():
                ap.error(f"{path}: no such file (a token sidecar, *{SUFFIX})")
            ids = None
            if a.all:
                side, res = load(path), load_results(results_path(path))
                ids = [r["id"] for r in res if r.get("bad") is not None and (side["cells"].get(r["id"]) or {}).get("tokens")]
            problems, reps = check(path, ids, replayer)
            for c in reps:
                if c.bad is not None:
                    fl = "-" if c.committed_floor is None else f"{c.committed_floor:.4f}"
                    print(f"{path.name} {c.id}: bad {c.committed_bad}/{c.bad.positions} committed, {c.bad.bad} here; "
                          f"floor {fl} committed, {'-' if c.floor is None else f'{c.floor:.4f}'} here")
            for p in problems:
                print(f"{path}: {p}", file=sys.stderr)
            failed += bool(problems)
    print(f"tokens replayed: {len(a.sidecars)} sidecar(s), {failed} with problems")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
