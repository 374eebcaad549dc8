"""Each GPU cell's draft acceptance before and after the recall kit (issue 49): the latest committed run of
the same cell id on the same vLLM line with the random kit (before 2026-12-02) against the recall kit's run.

    python ci/tools/acceptance_before_after.py results/gpu/2026-12-02-recall-kit-core-tq > TABLE.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cells(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError):
        return []
    return [r for r in data if isinstance(r, dict) and "id" in r and "accepted" in r] if isinstance(data, list) else []


def _length(r: dict) -> str:
    return f"{1 + r['accepted'] / r['drafts']:.2f}" if r.get("drafts") else "-"


def table(new_dir: Path) -> str:
    before: dict = {}
    for f in sorted((ROOT / "results" / "gpu").rglob("*.json")):
        if new_dir in f.parents or f.name.endswith(".tokens.json"):
            continue
        for r in _cells(f):
            line = (r.get("versions") or {}).get("vllm", "")
            if r.get("drafts") and not r.get("error"):
                before[(line, r["id"])] = (r, f.relative_to(ROOT))  # later files win: the latest run
    rows = ["| vLLM | cell | before: accepted / draft tokens | mean acc. length | after (recall kit) | mean acc. length"
            " | accepted per draft position (after) | before from |", "|---|---|---|---|---|---|---|---|"]
    for f in sorted(new_dir.rglob("results.json")):
        for r in _cells(f):
            if not r.get("drafts"):
                continue
            line = (r.get("versions") or {}).get("vllm", "")
            old, src = before.get((line, r["id"]), (None, None))
            b = f"{old['accepted']}/{old['draft_tokens']}" if old else "-"
            rows.append(f"| {line} | {r['id']} | {b} | {_length(old) if old else '-'} | {r['accepted']}/{r['draft_tokens']}"
                        f" | {_length(r)} | {r.get('accepted_per_pos')} of {r['drafts']} | {src or '-'} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table((ROOT / sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT / "results/gpu/2026-12-02-recall-kit-core-tq"))
