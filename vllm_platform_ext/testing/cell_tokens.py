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
  (:func:`recall_weights.checkpoint_digest`), and the bf16 floor's own generated ids as the run's
  reference produced them (transformers bf16 greedy, on the machine of the run);
* the batch-floor families' plain-decoding spread runs (one token set per batch composition).

Token ids are stored as base64 of one byte per id, one string per prompt: the kit vocabulary
(:data:`kit_tokens.VOCAB_SIZE`) is 256; an id that does not fit is refused by name.

:func:`cell_tokens_replay.replay_cells` writes the kit checkpoints again here (deterministic, seeded), refuses a model
whose digest differs, runs the float32 reference (:class:`audit.Reference`, in this process) on
the committed tokens, and recomputes each sampled cell's bad count and its floor; they must match
``results.json`` within one position, and only where the reference itself is near its threshold
(:data:`BAND`): a token flipped at a position the reference is sure of, or a bad count or floor
edited by hand, is caught. :func:`consistency` is the cheap check of every cell (tokens present
where the result was audited, their count its ``positions``). ::

    python -m vllm_platform_ext.testing.cell_tokens_replay results/cpu/2026-12-02-cells-tokens/results.tokens.json
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
    from vllm_platform_ext.testing.recall_weights import checkpoint_digest

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
