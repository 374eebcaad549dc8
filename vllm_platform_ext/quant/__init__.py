"""Hardened quantization config handling.

* :func:`register` puts this plugin's quantization configs into vLLM's quantization
  registry (``register_quantization_config``) and records each in the report; it runs in
  ``bootstrap()`` (every vLLM process).
* :func:`groups` returns the attribute patches that go with them, applied with the other
  patch groups.
"""
from __future__ import annotations

from vllm_platform_ext.patching import PatchGroup, strict_mode
from vllm_platform_ext.quant.errors import NotRegistered
from vllm_platform_ext.report import Report

STEP = "quant"


def register(report: Report | None = None) -> None:
    """Register every hardened quantization config; each success or failure is reported."""
    from vllm_platform_ext.quant import moe_wna16

    for name, fn in (("moe_wna16", moe_wna16.register),):
        try:
            detail = fn()
        except NotRegistered as why:
            if report is not None:
                report.skipped(STEP, name, str(why))
            continue
        except Exception as exc:
            if report is not None:
                report.failed(STEP, name, f"{type(exc).__name__}: {exc}")
            if strict_mode() or report is None:
                raise
            continue
        if report is not None:
            report.applied(STEP, name, detail)


def groups() -> list[PatchGroup]:
    from vllm_platform_ext.quant import inc_layer, moe_wna16, mtp_layer

    return [*moe_wna16.GROUPS, *mtp_layer.GROUPS, *inc_layer.GROUPS]
