"""The committed GPU cell results judged again under the rule of 2026-12-02 (issue 49 item 3), from
the numbers they hold, into ``results/gpu/2026-12-02-rejudge/RESULTS.md``::

    python ci/tools/rejudge.py write    # (re)generate RESULTS.md
    python ci/tools/rejudge.py check    # exit 1 when RESULTS.md is not what the committed results give

Every ``results/gpu/*/*.json`` that is a list of cell results (``cell_judge.CellResult`` dicts; other
JSON there is skipped) is one run. A record holds its bad fraction at 0.5 nats, its positions, the floor
it was judged against and that floor's source, plain decoding's spread (the MoE family) and its token
identity with plain decoding. From them, per cell with tokens:

* its count of bad positions (``bad`` x ``positions``, which must be a whole number);
* the bf16 floor's count for its model in that run: the floor of a record whose source is bf16
  transformers (before 2026-11-25's ``ea6aada`` every floor was); where no record of the model has one
  (the MoE family: its floor was always the spread's worst), only a range is known -- from 0 to one
  less than the smallest floor any of its records replaced it with -- and the verdict is worked at
  both ends: where they differ it is *undetermined*, not guessed;
* a speculative cell's plain decoding: the same-KV plain cell of the same run (``cell_judge._plain_key``:
  that cell, else the MoE spread run's own batch composition), capped at its own limit;
* the new rule at 0.5 nats (``bounds.limit``, alpha 0.01): the count against the limit of max(bf16,
  capped plain); the MoE spread's worst composition against the limit of the bf16 floor (a plugin cell);
  the split rule on the recorded identity (``identity.split_problem``).

The 0.1-nat criterion cannot be applied: the records keep no regrets, only the 0.5-nat fractions and
each prompt's first difference from plain decoding. A cell whose old verdict did not rest on its tokens
(a crash, a harness or kit error, no draft accepted) keeps it.
"""

# no "from __future__ import annotations": tests load this file by path (conftest.load_tool), where a
# dataclass with string annotations finds no module of its own
import argparse
import json
import pathlib
import re
import sys
from dataclasses import dataclass, fields, replace

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vllm_platform_ext.testing.audit import MARGIN, passes  # noqa: E402
from vllm_platform_ext.testing.bounds import ALPHA, limit  # noqa: E402
from vllm_platform_ext.testing.cell_suites import Cell  # noqa: E402
from vllm_platform_ext.testing.engine import COMPOSITIONS  # noqa: E402
from vllm_platform_ext.testing.identity import split_problem  # noqa: E402

GPU_RESULTS = ROOT / "results" / "gpu"
OUT = GPU_RESULTS / "2026-12-02-rejudge" / "RESULTS.md"
SPREAD_NAMES = ("batch", *COMPOSITIONS)  # cell_judge's order of a spread run's audits
BF16 = "bf16 transformers"


@dataclass
class Rejudged:
    file: str
    id: str
    plugin: bool
    old: str
    new: str  # a status, or "undetermined"
    bad: int
    positions: int
    bf16: tuple  # (low, high): equal where the run recorded it
    plain: int | None  # the plain decoding counted, uncapped
    limits: tuple  # the limit at bf16 low and high
    why: str  # what fails it ("" where it passes); for undetermined, at the low end
    fails: tuple = ()  # which rules fail it there: "count", "spread", "split"


def cell_result_files(results_dir: pathlib.Path = GPU_RESULTS) -> dict:
    """{path: records} of every committed list of cell results under ``results_dir/*/``."""
    out = {}
    for path in sorted(results_dir.glob("*/*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, list) and data and all(isinstance(r, dict) and "cell" in r and "status" in r for r in data):
            out[path] = data
    return out


def _count(fraction: float, positions: int, what: str) -> int:
    n = round(fraction * positions)
    if abs(fraction * positions - n) > 1e-6:
        raise ValueError(f"{what}: {fraction!r} of {positions} positions is not a whole number of positions")
    return n


def _cell(r: dict, where: str) -> Cell:
    known = {f.name for f in fields(Cell)}
    extra = set(r["cell"]) - known
    if extra:
        raise ValueError(f"{where}: cell fields {sorted(extra)} unknown to cell_suites.Cell")
    return Cell(**r["cell"])


def _audited(r: dict) -> bool:
    return r.get("bad") is not None and r.get("positions", 0) > 0


def bf16_range(records: list, model: str, n: int, where: str) -> tuple[int, int]:
    """The bf16 floor's count for ``model`` in one run: (c, c) where a record names it, else (0, the
    smallest replaced floor - 1): a floor from plain decoding replaced bf16 only where it was larger."""
    exact, high = set(), n
    for r in records:
        if r["cell"]["model"] != model or r.get("floor") is None:
            continue
        floor = _count(r["floor"], n, f"{where} {r['id']} floor")
        if r.get("floor_source", BF16) == BF16:
            exact.add(floor)
        else:
            high = min(high, floor - 1)
    if len(exact) > 1:
        raise ValueError(f"{where}: records of {model} name different bf16 floors {sorted(exact)}")
    if exact:
        (c,) = exact
        return c, c
    return 0, max(high, 0)


def _why_old_fail_is_not_the_audit(r: dict) -> bool:
    """A plugin cell's old fail that did not come from the audit (no draft accepted, a route, a patch)."""
    return r["status"] == "fail" and not r.get("error", "").startswith("bad ")


def _where(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def rejudge_run(path: pathlib.Path, records: list) -> list[Rejudged]:
    where = _where(path)
    by_id = {r["id"]: r for r in records}
    out = []
    for r in records:
        if not _audited(r) or r["status"] in ("upstream-crash", "harness-error", "kit-error"):
            continue
        cell, n = _cell(r, where), r["positions"]
        bad = _count(r["bad"], n, f"{where} {r['id']}")
        old_ok = r["status"] in ("pass", "upstream-works")
        if not _why_old_fail_is_not_the_audit(r) and passes(r["bad"], r["floor"], MARGIN) != old_ok:
            raise ValueError(f"{where} {r['id']}: the old rule on its own bad / floor does not give its status "
                             f"{r['status']}: not a record this tool understands")
        lo, hi = bf16_range(records, cell.model, n, where)
        plain = None
        if cell.mode != "base":
            sib = by_id.get(replace(cell, mode="base", k=0).id)
            if sib is not None and _audited(sib) and sib["positions"] == n:
                plain = _count(sib["bad"], n, f"{where} {sib['id']}")
            elif r.get("plain_spread") and replace(cell, mode="base", k=0) == Cell(cell.model, "base", 0, cell.kv, cell.graphs):
                plain = _count(r["plain_spread"][0], n, f"{where} {r['id']} spread")  # its batch composition
        spread = []
        if cell.plugin and r.get("plain_spread"):
            names = SPREAD_NAMES if len(r["plain_spread"]) == len(SPREAD_NAMES) else \
                [f"composition {i + 1}" for i in range(len(r["plain_spread"]))]
            spread = [(_count(x, n, f"{where} {r['id']} spread"), name) for x, name in zip(r["plain_spread"], names)]
        split = split_problem(r.get("identity") or [], cell.model, cell.kv) if cell.mode != "base" else None

        def verdict(bf16: int) -> tuple[str, int, str, tuple]:
            own = limit(bf16, n, ALPHA)
            lim = limit(max(bf16, min(plain, own) if plain is not None else 0), n, ALPHA)
            why = {"count": f"{bad}/{n} bad > limit {lim}"} if bad > lim else {}
            if spread and max(spread)[0] > own:
                worst, name = max(spread)
                why["spread"] = f"plain decoding in batch composition {name!r}: {worst}/{n} > limit {own}"
            if split:
                why["split"] = split
            if cell.plugin:
                status = "fail" if why or _why_old_fail_is_not_the_audit(r) else "pass"
            else:
                status = "upstream-wrong" if why else "upstream-works"
            return status, lim, "; ".join(why.values()), tuple(why)

        (s_lo, l_lo, w_lo, f_lo), (s_hi, l_hi, _, _) = verdict(lo), verdict(hi)
        new = s_lo if s_lo == s_hi else "undetermined"
        out.append(Rejudged(where, r["id"], cell.plugin, r["status"], new, bad, n, (lo, hi), plain, (l_lo, l_hi),
                            w_lo if new != "pass" else "", f_lo if new != "pass" else ()))
    return out


def rejudge(files: dict) -> list[Rejudged]:
    """Every audited cell of ``files`` (:func:`cell_result_files`) judged again."""
    return [x for path, recs in files.items() for x in rejudge_run(path, recs)]


def _old(floor_bad: int, n: int) -> int:
    """The most bad positions of ``n`` the old rule passed against a floor of ``floor_bad``."""
    return max(b for b in range(n + 1) if passes(b / n, floor_bad / n, MARGIN))


def _range(t: tuple) -> str:
    return str(t[0]) if t[0] == t[1] else f"{t[0]}-{t[1]}"


def _table(rows: list[Rejudged]) -> list[str]:
    out = ["| result file | cell | was | now | bad / positions | bf16 floor | plain decoding | limit | why |",
           "|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        out.append(f"| {x.file.removeprefix('results/gpu/')} | {x.id} | {x.old} | {x.new} | {x.bad}/{x.positions} | "
                   f"{_range(x.bf16)} | {'—' if x.plain is None else x.plain} | {_range(x.limits)} | {x.why or '—'} |")
    return out


def render(rows: list[Rejudged], files: dict) -> str:
    """RESULTS.md for ``rows`` (:func:`rejudge` of ``files``)."""
    changed = [x for x in rows if x.new not in (x.old, "undetermined")]
    open_ = [x for x in rows if x.new == "undetermined"]
    recs = {_where(p): {r["id"]: r for r in rs} for p, rs in files.items()}
    versions = sorted({r.get("versions", {}).get("vllm") for rs in files.values() for r in rs} - {None})
    lines = ["# The committed GPU cell results under the 2026-12-02 rule (issue 49 item 3)", "",
             "- date: 2026-12-02 (generated from the committed results; it changes only when they or the rule do)",
             "- device: none: re-judged from the numbers the GPU runs committed, no engine ran",
             f"- vllm: {', '.join(versions)} (as the source files record it; a run audited again elsewhere records "
             "that host's)",
             "- commit: the tree that holds this file",
             "- command: `python ci/tools/rejudge.py write` (`check` in tests/ci/test_rejudge.py)", "",
             f"Every cell result list under `results/gpu/*/` ({len(files)} files, {len(rows)} cells with audited tokens) "
             "judged again at 0.5 nats in positions: the count of bad positions against `bounds.limit` (the 0.99 "
             "binomial quantile of the floor's rate) of max(the bf16 floor, the same run's same-KV plain decoding "
             "capped at its own limit); for the MoE family's plugin cells, plain decoding's worst batch composition "
             "against the bf16 floor's limit; for speculative cells, the split rule on the recorded token identity. "
             "How each number is rebuilt: `ci/tools/rejudge.py`.", "",
             "The 0.1-nat criterion cannot be applied to these results: they keep no regrets, only the bad fraction "
             "at 0.5 nats and each prompt's first difference from plain decoding. Nor can positions be added: they "
             "are 7 prompts x 32 tokens, 224 a cell.", "",
             f"At 224 positions the bound is about the old margin, so old verdicts barely move: against a floor of 0 "
             f"it lets {limit(0, 224)} bad through where floor + {MARGIN} let {_old(0, 224)}; against a floor of 2, "
             f"{limit(2, 224)} where the old rule let {_old(2, 224)}. What the rule gains, it gains at the suites' 896 "
             f"positions from now on: there the mildest real upstream bug's rate (9 bad of 224) is 36 bad, against a "
             f"limit of {limit(4, 896)} at a floor of 4, where floor + {MARGIN} let {_old(4, 896)} through; and in what "
             "it no longer allows at any size: a margin on a plain cell's margin, a wrong plain cell raising the floor, "
             "the MoE spread as its own floor.", "",
             f"## Verdicts that change ({len(changed)})", ""]
    lines += _table(changed) if changed else ["None."]
    lines += ["", f"## Verdicts the records cannot settle ({len(open_)})", "",
              "The bf16 floor of a model is not in a run's records when every cell of it was judged against plain "
              "decoding's spread (the MoE family, always): it is known only to lie between 0 and one less than the "
              "smallest floor that replaced it. These cells' verdicts differ between the two ends (bf16 floor and "
              "limit columns: low-high; why: at the low end).", ""]
    lines += _table(open_) if open_ else ["None."]
    fails = [x for x in changed if x.plugin and x.new == "fail"]
    open_on = [x for x in open_ if x.plugin]
    lines += ["", "## Plugin cells", ""]
    if fails:
        lines.append(f"{len(fails)} plugin cell(s) turn to fail: " +
                     "; ".join(f"{x.id} ({x.file.removeprefix('results/gpu/')}): {x.why}" for x in fails) + ".")
    else:
        lines.append("No plugin cell turns to fail where the records settle the verdict.")
    if open_on:
        fam = sorted({(recs[x.file][x.id]["cell"]["model"], recs[x.file][x.id]["cell"]["kv"]) for x in open_on})
        own = [x for x in open_on if "count" in x.fails]
        names = sorted({m.group(1) for x in open_on for m in [re.search(r"composition '([^']+)'", x.why)] if m})
        lines.append(
            f"{len(open_on)} plugin cell(s), of {', '.join(f'{m} on {kv}' for m, kv in fam)}, would fail if their run's "
            "bf16 floor were at the low end of the range its records allow and pass at the high end: "
            f"{len(open_on) - len(own)} on plain decoding's worst batch composition alone (the spread run), "
            f"{len(own)} also on its own count ({', '.join(f'{x.id} in {pathlib.PurePath(x.file).name}' for x in own) or 'none'}). "
            f"The spread runs' worst composition there: {', '.join(repr(c) for c in names)}"
            + (" -- the family's plain cell's own engine configuration and batch" if names == ["batch"] else "")
            + "; plain decoding with the plugin, not the speculative path. A run under the new harness records the "
            "bf16 floor (`floor_bf16`) and settles them, at four times the positions.")
    off = [x for x in changed if not x.plugin]
    lines += ["", "## Upstream cells (plugin off)", "",
              f"{len(off)} plugin-off cell(s) change: " + (", ".join(f"{x.id} {x.old} -> {x.new}" for x in off)
                                                          if off else "none") + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=("write", "check", "show"))
    a = ap.parse_args(argv)
    files = cell_result_files()
    text = render(rejudge(files), files)
    if a.cmd == "show":
        print(text, end="")
        return 0
    if a.cmd == "check":
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{_where(OUT)} is out of date: run `python ci/tools/rejudge.py write`", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(_where(OUT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
