"""Issue 53's goals table in docs/results.md's end-to-end section, generated from the result files.

Each goal's figures come from the newest committed result JSON of the benchmark that measures it (the
run header's ``benchmark`` key, written by the scripts): ``tq-vs-flash`` (``benchmarks/bench_tq_vs_flash.py``,
goal 1), ``e2e`` / ``e2e-paired`` run in the line's default scheduling (``benchmarks/e2e_spec_decode.py``,
``e2e_paired.py``: goal 2, one block per model shape), ``serve-budget`` (``benchmarks/serve_budget.py``, goal
3). A goal with no result file is a "not measured" row naming the command that measures it.

    python ci/tools/e2e_section.py write    # regenerate the block between the markers
    python ci/tools/e2e_section.py check    # exit 1 when docs/results.md is out of date
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "results.md"
BEGIN, END = "<!-- issue53-goals:begin (ci/tools/e2e_section.py write) -->", "<!-- issue53-goals:end -->"
# the GPU commands, as benchmarks/README.md gives them (the bundle's repository at /tmp/x26/repo)
COMMANDS = {
    "tq-vs-flash": "python benchmarks/bench_tq_vs_flash.py --out results/bench/DATE-tq-vs-flash/tq-vs-flash.md",
    "e2e": "python benchmarks/e2e_spec_decode.py --model qwen36_a3b --layers 40 --configs B,C --batches 1,8,32 "
           "--contexts 4096,32768 --out results/gpu/DATE-issue53-e2e-a3b (then --model qwen36_27b; then "
           "--configs A,C0 --batches 1,8 --contexts 56320 for the 55K point)",
    "serve-budget": "python benchmarks/serve_budget.py --model qwen36_a3b --layers 40 --configs bf16 (then k8v4, "
                    "3bit_nc) --out DIR; then --report DIR --out DIR",
}
GOALS = (("1", "kernel vs the HBM bound and vLLM's FlashAttention", "tq-vs-flash"),
         ("2", "end to end, the line's default scheduling", "e2e"),
         ("3", "serving at a fixed KV memory budget", "serve-budget"))


def result_files(root: pathlib.Path = ROOT) -> dict[str, list[tuple[pathlib.Path, dict]]]:
    """The result JSONs under ``root/results`` by their header's ``benchmark``, newest (header date) first."""
    out: dict[str, list] = {}
    for p in sorted((root / "results").rglob("*.json")):
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        head = doc.get("header") if isinstance(doc, dict) else None
        if isinstance(head, dict) and head.get("benchmark") in ("tq-vs-flash", "e2e", "e2e-paired", "serve-budget"):
            kind = "e2e" if head["benchmark"] == "e2e-paired" else head["benchmark"]
            out.setdefault(kind, []).append((p, doc))
    for files in out.values():
        files.sort(key=lambda f: (f[1]["header"].get("date", ""), str(f[0])), reverse=True)
    return out


def _met(met) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def _link(path: pathlib.Path, root: pathlib.Path, base: pathlib.Path) -> str:
    md = path.with_suffix(".md")
    rel = os.path.relpath(md, base).replace(os.sep, "/")
    return f"[{md.parent.name}]({rel})"


def _fmt(x, percent: bool = False) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, int):
        return str(x)
    return f"{x:.1f}%" if percent else f"{x:.3f}"  # as bench_tq_vs_flash.tables writes them


def goal_rows(files: dict, root: pathlib.Path = ROOT, base: pathlib.Path | None = None) -> list[str]:
    """The table's rows: ``| goal | shape / scope | measured | target | met | result file |``."""
    base = base or root / "docs"
    rows = []
    for num, what, kind in GOALS:
        got = files.get(kind, [])
        if kind == "e2e":  # per model shape, goal, batch and context: the newest default-scheduling figure
            seen, picked = set(), []
            for p, doc in got:
                h = doc["header"]
                if h.get("scheduling", "default") != "default":
                    continue
                keep = []
                for g in doc.get("data", {}).get("goals53", []):
                    key = (h.get("model"), h.get("layers"), g["goal"], g["batch"], g["context"])
                    if g["measured"] is not None and key not in seen:
                        seen.add(key)
                        keep.append(g)
                if keep:
                    picked.append((p, doc | {"data": doc["data"] | {"goals53": keep}}))
            got = picked
        else:
            got = got[:1]
        if not got:
            rows.append(f"| {num}: {what} | — | not measured yet | — | not measured | `{COMMANDS[kind]}` |")
            continue
        for p, doc in got:
            h, data, link = doc["header"], doc["data"], _link(p, root, base)
            if kind == "tq-vs-flash":
                for g in data["goals"]:
                    scope = f"worst row {g['worst_row']}; rows met {g['rows_met']}, rows {g['rows']}"
                    rows.append(f"| {num}: {g['goal']} | {scope} | {_fmt(g['worst'], '%' in g['target'])} | "
                                f"{g['target']} | {_met(g['met'])} | {link} |")
            elif kind == "e2e":
                shape = f"{h.get('model')}, {h.get('layers')} layers, async {h.get('async_scheduling', '?')}"
                for g in data["goals53"]:
                    m = "n/a" if g["measured"] is None else f"{g['measured']:.2f}"
                    rows.append(f"| {num}: {g['goal']} | {shape}; batch {g['batch']}, context {g['context']} | "
                                f"{m} | {g['target']} | {_met(g['met'])} | {link} |")
            else:
                scope = f"{h.get('model')}, {h.get('concurrency')} streams, {h.get('input_len')} in / {h.get('output_len')} out"
                for g in data["goals"]:
                    m = g["measured"]
                    m = "n/a" if m is None else (f"{m:.2f}" if isinstance(m, float) else str(m))
                    met = "reported" if g.get("reported") else _met(g["met"])
                    rows.append(f"| {num}: {g['goal']} | {scope} | {m} | {g['target']} | {met} | {link} |")
    return rows


def table(root: pathlib.Path = ROOT, base: pathlib.Path | None = None) -> str:
    head = ["| goal (issue 53) | shape / scope | measured | target | met | result file or command |",
            "|---|---|---|---|---|---|"]
    return "\n".join(head + goal_rows(result_files(root), root, base))


def render(doc: str, block: str) -> str:
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"docs/results.md has no issue 53 block: add the lines {BEGIN!r} and {END!r}")
    head, rest = doc.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{rest.split(END, 1)[1]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=("write", "check"))
    a = ap.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    new = render(text, table())
    if a.cmd == "check":
        if new != text:
            print("docs/results.md's issue 53 table is out of date: python ci/tools/e2e_section.py write",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
