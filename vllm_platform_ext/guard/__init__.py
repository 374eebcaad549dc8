"""The live guard in ``vllm serve`` (issue 54, part 2): watches each request and the engine for silent
degeneration and says so in ``/metrics`` and the server log, without touching a token.

Off by default; ``VLLM_PLATFORM_EXT_GUARD=1`` turns it on. On, the patch group ``guard.live``
(:mod:`vllm_platform_ext.patch.guard`) adds :class:`~vllm_platform_ext.guard.stat_logger.GuardStatLogger`
to the stat loggers ``AsyncLLM`` builds and lets the guard read each step's outputs; off, that group is
skipped: no logger, no hook, nothing runs. :mod:`.detect` holds the detectors, :mod:`.monitor` the
per-request state, :mod:`.stat_logger` vLLM's stat-logger interface and the Prometheus metrics.
"""
from __future__ import annotations

from vllm_platform_ext.envs import GUARD, parse_bool


def enabled() -> bool:
    """``VLLM_PLATFORM_EXT_GUARD`` is on (a bad value is off here; the switch check reports it)."""
    return parse_bool(GUARD, False)
