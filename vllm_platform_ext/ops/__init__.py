"""Kernels this plugin owns, behind one per-platform dispatch (``ops.dispatch``).

The entries are declared beside their kernels (``OPS`` lists in ``gdn/`` and
``turboquant/``) and registered here; nothing is imported until an op is first used.
"""
from __future__ import annotations

from vllm_platform_ext.ops.dispatch import REGISTRY, OpImpl
from vllm_platform_ext.report import Report


def all_impls() -> list[OpImpl]:
    from vllm_platform_ext.ops import gdn, turboquant

    return [*gdn.OPS, *turboquant.OPS]


def register_all(report: Report | None = None) -> None:
    impls = all_impls()
    for impl in impls:
        REGISTRY.register(impl)
    if report is not None:
        for op in sorted({i.op for i in impls}):
            platforms = sorted(i.platform for i in impls if i.op == op)
            report.applied("ops", op, "platforms: " + ", ".join(platforms))
