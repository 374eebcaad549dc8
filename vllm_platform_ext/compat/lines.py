"""The vLLM lines this project keeps, and how far each is proven: the one list the per-line tests read,
and the support status ``doctor`` names.

A *line* is a vLLM minor release (``(0, 27)`` for 0.27.0 / 0.27.1). The lines kept are the ones with a
compat schema table (``compat/tables/vllm-X.Y.Z.json``, derived from that release's wheel by
``ci/tools/compat_tables.py generate X.Y.Z``): :data:`LINES`. Every per-line test (the engine contract, the
compat tables, the platform calls, each patch group's probe on the line's own code) runs on :data:`LINES`
and keeps its expected verdict per line in a dict that must name every line (``tests/conftest.py``
``every_line``), so a new table makes each of them ask for the new line's verdict.
``tests/compat/test_lines.py`` fails when the package index serves a vLLM line that has no table.

Support status of a line (:func:`support`):

* ``proven in an engine (CPU / GPU)``: committed cell results under ``results/`` ran that line's real
  engine with the plugin on and passed (``line_support.json``, written from ``results/`` by
  ``ci/tools/line_support.py write``; CI checks it against ``results/``);
* ``contract only``: a table and the per-line contract tests, no engine run committed;
* ``unknown``: no table (a line newer or older than the project's).
"""
from __future__ import annotations

import json
import pathlib

from vllm_platform_ext.compat import schemas

# Every kept line, oldest first: the compat tables' index.
LINES: tuple[tuple[int, int], ...] = tuple(sorted(schemas.TABLES))

SUPPORT_FILE = pathlib.Path(__file__).with_name("line_support.json")
PROVEN, CONTRACT, UNKNOWN = "proven in an engine", "contract only", "unknown"


def label(key: tuple[int, int]) -> str:
    """``(0, 27)`` -> ``"0.27"``."""
    return f"{key[0]}.{key[1]}"


def release(key: tuple[int, int]) -> str:
    """The release a line's table (and its per-line tests) were derived from: ``(0, 27)`` -> ``"0.27.1"``."""
    return schemas.TABLE_SOURCES[key]["vllm"]


def final_release(version: str) -> tuple[int, int, int] | None:
    """``"0.27.1"`` -> ``(0, 27, 1)``; None for a pre-release, dev or post build (``0.34.0rc1``)."""
    parts = version.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def served_lines(versions: list[str]) -> dict[tuple[int, int], str]:
    """Line -> its newest final release among ``versions`` (a package index's list for ``vllm``)."""
    out: dict[tuple[int, int], tuple[int, int, int]] = {}
    for v in versions:
        rel = final_release(v)
        if rel is not None and rel > out.get(rel[:2], (-1, -1, -1)):
            out[rel[:2]] = rel
    return {k: ".".join(map(str, v)) for k, v in sorted(out.items())}


def missing_lines(versions: list[str]) -> dict[tuple[int, int], str]:
    """Served lines from the oldest kept one on that have no table: line -> newest release served."""
    return {k: v for k, v in served_lines(versions).items() if k >= LINES[0] and k not in schemas.TABLES}


def engine_proof() -> dict[str, dict[str, dict]]:
    """``line_support.json``'s lines: ``"0.26"`` -> ``{"gpu": {"cells_passed": n, "runs": [folders]}, ...}``."""
    try:
        return json.loads(SUPPORT_FILE.read_text())["lines"]
    except (OSError, ValueError, KeyError):
        return {}


def _speculative(proof: dict) -> bool:
    """Whether an engine's proof holds a passing speculative cell (a file without ``modes``: assumed so)."""
    return any(m != "base" for m in proof.get("modes", ("mtp",)))


def support(version: str) -> dict:
    """The support status of the line of vLLM ``version`` (any form ``schemas.parse_version`` reads)."""
    try:
        key = schemas.parse_version(version)
    except ValueError as exc:
        return {"line": None, "status": UNKNOWN, "detail": str(exc)}
    proof = engine_proof().get(label(key), {})
    if proof:
        where = " / ".join(d.upper() if _speculative(p) else f"{d.upper()}: plain decoding only"
                           for d, p in sorted(proof.items()))
        runs = sum(len(p["runs"]) for p in proof.values())
        cells = sum(p["cells_passed"] for p in proof.values())
        return {"line": label(key), "status": f"{PROVEN} ({where})", "engines": sorted(proof),
                "detail": f"{cells} cells passed with the plugin in {runs} committed runs under results/"}
    if key in schemas.TABLES:
        return {"line": label(key), "status": CONTRACT, "engines": [],
                "detail": f"compat table and per-line contract tests from vLLM {release(key)}'s own code; "
                          "no engine run of this line committed"}
    kept = f"{label(LINES[0])}-{label(LINES[-1])}"
    return {"line": label(key), "status": UNKNOWN, "engines": [],
            "detail": f"no compat table or contract tests for this line (kept: {kept})"}
