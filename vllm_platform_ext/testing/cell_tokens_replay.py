"""The replay of a committed token sidecar (:mod:`.cell_tokens`): the kit checkpoints written again here
(their digests checked), the float32 reference run on the committed tokens, each sampled cell's bad count
and floor recomputed and held to ``results.json`` within one position near the threshold. ::

    python -m vllm_platform_ext.testing.cell_tokens_replay results/cpu/2026-12-02-cells-tokens/results.tokens.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from vllm_platform_ext.testing.audit import BAD_NATS, MARGIN, passes
from vllm_platform_ext.testing.bounds import ALPHA, limit
from vllm_platform_ext.testing.cell_tokens import (BAND, MAX_DIFF, SUFFIX, _decode_all, _part_missing, consistency, floor_parts, load, load_results, results_path, sample)

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
        from vllm_platform_ext.testing.recall_weights import checkpoint_digest
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
