"""How often each patched vLLM function sent a call to the plugin's op, and how often it left the
call to vLLM, in this process: the proof that a route ran (a patch group reported *applied* is
patched, not necessarily called).

Each patch group that routes keeps one :func:`counter` under its group name; the engine harness
reads :func:`snapshot` in every worker (``testing.ranks.route_state``) and the audits require routed
calls where the plugin is on and none where the route is off. Calls replayed inside a captured CUDA
graph do not run Python and are not counted: a FULL-graph engine counts its capture and eager calls.
Imports nothing of vLLM.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

_COUNTERS: dict[str, Counter] = {}
_PROBES: dict[str, Callable[[], dict]] = {}


def counter(group: str, keys: tuple[str, ...]) -> Counter:
    """The counter of ``group`` (made once, every key present at 0, so a snapshot shows the zeros)."""
    c = _COUNTERS.get(group)
    if c is None:
        c = _COUNTERS[group] = Counter({k: 0 for k in keys})
    return c


def probe(group: str, read: Callable[[], dict]) -> None:
    """Add ``group`` to every :func:`snapshot`, its figures read by ``read()`` at snapshot time (figures
    kept on a device, e.g. a route check's largest difference, which captured CUDA graphs update)."""
    _PROBES[group] = read


def snapshot() -> dict[str, dict]:
    """``{group: {key: count or figure}}`` of this process."""
    out = {g: dict(c) for g, c in sorted(_COUNTERS.items())}
    for g, read in sorted(_PROBES.items()):
        try:
            out[g] = read()
        except Exception as exc:  # a probe that cannot be read is reported, never raised into the engine
            out[g] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
