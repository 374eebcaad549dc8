"""What an engine's failure says, in one line: the harness's own errors and the line that names
the failure in an engine's error output.

An engine that dies in native code prints a Python traceback, then C++'s "terminate called ..." and
a stack of "frame #N: ..." lines as the interpreter exits (vLLM 0.23.0 with TurboQuant under FULL
graphs, 2026-11-28: "CUDA error: an illegal memory access was encountered", then 22 frames). The
last line of such output names a libc frame, not the failure; :func:`error_line` skips that tail.
"""
from __future__ import annotations

import re

# Errors of the harness, not of vLLM or the plugin: side-by-side engines starving or confusing
# each other's memory start-up (vLLM's profiling counts the other engines), a cell past its time.
# Such a cell fails as "harness-error" and is never reported as an upstream or plugin result.
HARNESS_ERRORS = ("No available memory for the cache blocks", "Error in memory profiling",
                  "less than desired GPU memory utilization", "CUDA out of memory", "TimeoutExpired",
                  "engine subprocess timed out")

# a Python exception line: "ValueError: ...", "torch.AcceleratorError: ...", "AssertionError"
_EXCEPTION = re.compile(r"^\s*(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?::|\s*$)")
# the native tail an aborting process prints after its Python error
_NATIVE_TAIL = re.compile(r"^\s*(frame #\d+:|Exception raised from |terminate called |what\(\):|\[W\d{4} )")


def harness_error(error: str) -> bool:
    return any(p in error for p in HARNESS_ERRORS)


def error_line(error: str, known: list[str] | tuple[str, ...] = ()) -> str:
    """The one line of an engine's error output that names the failure (at most 300 characters): the
    last line holding one of ``known`` (messages the caller knows to look for; a Python exception line
    first), else the last Python exception line, else the last line outside a native stack dump, else
    the last line."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    named = lambda l: any(m in l for m in known if m)  # noqa: E731
    for pick in (lambda l: named(l) and _EXCEPTION.match(l), named, _EXCEPTION.match,
                 lambda l: not _NATIVE_TAIL.match(l)):
        hit = next((l for l in reversed(lines) if pick(l)), None)
        if hit is not None:
            return hit[:300]
    return lines[-1][:300]
