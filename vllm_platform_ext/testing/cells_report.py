"""The cells' results as Markdown and JSON files (``results.md`` / ``results.json``), and the
summary line and exit status of a run or a replay (:func:`report`)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from vllm_platform_ext.testing.identity import floor_summary, summary


def markdown(results: list) -> str:
    """One row per configuration, plugin on and upstream side by side."""
    rows: dict[tuple, dict] = {}
    for r in results:
        c = dict(r.cell)
        key = tuple((k, v) for k, v in c.items() if k != "plugin")
        rows.setdefault(key, {})["on" if c["plugin"] else "off"] = r
    first = results[0] if results else None
    lines = []
    if first:  # the device of the first engine that started and said (a crashed one may name none)
        dev = next((r.engine_path.get("device") or r.engine_path.get("cpu_path") for r in results
                    if r.engine_path.get("device") or r.engine_path.get("cpu_path")), "?")
        vers = ", ".join(f"{k} {v}" for k, v in first.versions.items())
        lines += [f"Measured {first.date} on {dev}; {vers}.", ""]
    lines += ["| model | spec | KV | graphs | platform | with the plugin | bad of positions (limit; floor) at 0.5 / 0.1 nats "
              "| accepted | init s | gen s | upstream (plugin off) | tokens vs plain decoding |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]

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
        bad = _bad_text(ref)
        acc = "—" if c["mode"] == "base" else f"{ref.accepted}/{ref.draft_tokens}"
        model = c["model"] + (f" (TP={c['tp']})" if c.get("tp", 1) > 1 else "")
        graphs = c["graphs"] + (f" ({c['disable']} off)" if c.get("disable") else "")
        lines.append(f"| {model} | {spec} | {c['kv']} | {graphs} | {c['platform'] or 'auto'} | "
                     f"{fmt(on)} | {bad} | {acc} | {ref.init_s:.0f} | {ref.generate_s:.1f} | {fmt(off)} | "
                     f"{_identity_text(ref)} |")
    return "\n".join(lines) + "\n"


def _criterion_text(c: dict) -> str:
    """``"3/896 (<= 11; bf16 2, plain 4)"``: a criterion of ``CellResult.criteria``; ``>`` where it fails."""
    floor = f"bf16 {c['floor_bf16']}" + (f", plain {c['floor_plain']}" if c.get("floor_plain") is not None else "")
    return f"{c['count']}/{c['positions']} ({'<=' if c['count'] <= c['limit'] else '>'} {c['limit']}; {floor})"


def _bad_text(r) -> str:
    """Each threshold's count against its limit and floor (results judged before 2026-12-02: the
    bad fraction / floor), and a batch-floor family's worst spread composition at 0.5 nats."""
    if r.bad is None:
        return "—"
    if not r.criteria:
        return f"{r.bad:.3f} / {r.floor:.3f}"
    text = " / ".join(_criterion_text(c) for c in r.criteria)
    worst = max(((name, cs[0]) for name, cs in (r.spread or {}).items() if cs), key=lambda x: x[1]["count"] - x[1]["limit"],
                default=None)
    if worst:
        text += f"; plain decoding over batch compositions, worst {worst[0]}: {_criterion_text(worst[1])}"
    return text


def _identity_text(r) -> str:
    """Token identity against plain decoding, and plain decoding's own identity across batches."""
    text = summary(r.identity)
    fl = floor_summary(r.identity_floor)
    return f"{text}; {fl}" if r.identity and fl else text


def write_results(results: list, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    jp, mp = out_dir / "results.json", out_dir / "results.md"
    jp.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    mp.write_text(markdown(results))
    return jp, mp


def report(results: list, out: Path, what: str) -> int:
    """Write results.json / results.md into ``out``, print the table and a summary line; the exit
    status: 1 when a cell fails (plugin, harness or kit)."""
    jp, mp = write_results(results, out)
    print(mp.read_text())
    bad = [r.id for r in results if r.status in ("fail", "harness-error", "kit-error")]
    print(f"{what.format(n=len(results))}, {len(bad)} failing (plugin, harness or kit){': ' + ', '.join(bad) if bad else ''}")
    return 1 if bad else 0
