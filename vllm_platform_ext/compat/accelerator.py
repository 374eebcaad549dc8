"""Backfill ``torch.accelerator`` helpers that vLLM calls but an older torch (e.g. MetaX's
torch 2.8) lacks, from the active device module (``torch.cuda`` on CUDA and MetaX,
``torch.xpu``, a PrivateUse1 module, else ``torch.cpu``). Works when ``torch.cuda`` is
missing entirely. Existing helpers are never replaced.

The helper list is what vLLM 0.33 calls (shared/research/vllm_upstream.md §6).
"""
from __future__ import annotations

import sys
import types
from typing import Any, Callable

import torch

from vllm_platform_ext.report import Report

STEP = "compat"

# torch.accelerator name -> name in a device module (torch.cuda, torch.xpu, ...)
HELPERS: tuple[tuple[str, str], ...] = (
    ("synchronize", "synchronize"),
    ("current_device_index", "current_device"),
    ("set_device_index", "set_device"),
    ("device_index", "device"),
    ("current_stream", "current_stream"),
    ("set_stream", "set_stream"),
    ("is_available", "is_available"),
    ("device_count", "device_count"),
    ("empty_cache", "empty_cache"),
    ("empty_host_cache", "empty_host_cache"),
    ("get_memory_info", "mem_get_info"),
    ("memory_stats", "memory_stats"),
    ("memory_allocated", "memory_allocated"),
    ("memory_reserved", "memory_reserved"),
    ("max_memory_allocated", "max_memory_allocated"),
    ("max_memory_reserved", "max_memory_reserved"),
    ("reset_peak_memory_stats", "reset_peak_memory_stats"),
)
# Releasing cached memory is safe to skip on a device module without a caching allocator.
NOOP_OK = ("empty_cache", "empty_host_cache")


def active_device_module() -> tuple[str, Any]:
    """``(device type, module)`` of the accelerator this process uses."""
    acc_mod = getattr(torch, "accelerator", None)
    current = getattr(acc_mod, "current_accelerator", None)
    if callable(current):
        try:
            dev = current()
        except Exception:
            dev = None
        if dev is not None and getattr(torch, dev.type, None) is not None:
            return dev.type, getattr(torch, dev.type)
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and _safe_call(getattr(cuda, "is_available", None)):
        return "cuda", cuda
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and _safe_call(getattr(xpu, "is_available", None)):
        return "xpu", xpu
    try:
        pu1 = torch._C._get_privateuse1_backend_name()
    except Exception:
        pu1 = "privateuseone"
    if pu1 != "privateuseone" and getattr(torch, pu1, None) is not None:
        return pu1, getattr(torch, pu1)
    return "cpu", torch.cpu


def _safe_call(fn: Callable[[], Any] | None) -> bool:
    try:
        return bool(fn()) if callable(fn) else False
    except Exception:
        return False


def _source(module: Any, name: str) -> Callable[..., Any] | None:
    fn = getattr(module, name, None)
    if fn is None and hasattr(module, "memory"):
        fn = getattr(module.memory, name, None)
    return fn if callable(fn) else None


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def backfill(report: Report, module: Any = None, device_type: str | None = None) -> dict[str, str]:
    """Set each missing ``torch.accelerator`` helper; return ``{helper: outcome}``.

    ``module``/``device_type`` override the detected device module (tests, platform code).
    """
    if module is None:
        device_type, module = active_device_module()
    device_type = device_type or getattr(module, "__name__", "device").rsplit(".", 1)[-1]
    src = getattr(module, "__name__", repr(module))
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        acc = types.ModuleType("torch.accelerator", "created by vllm_platform_ext (this torch has none)")
        torch.accelerator = acc
        sys.modules["torch.accelerator"] = acc
        report.applied(STEP, "torch.accelerator", f"module missing in torch {torch.__version__}; created")
    outcome: dict[str, str] = {}
    for name, source_name in HELPERS:
        label = f"torch.accelerator.{name}"
        if hasattr(acc, name):
            outcome[name] = "present"
            report.skipped(STEP, label, f"present in torch {torch.__version__}")
            continue
        fn = _source(module, source_name)
        if fn is not None:
            setattr(acc, name, fn)
            outcome[name] = f"{src}.{source_name}"
            report.applied(STEP, label, f"missing in torch {torch.__version__}; set to {src}.{source_name}")
        elif name in NOOP_OK:
            setattr(acc, name, _noop)
            outcome[name] = "no-op"
            report.applied(STEP, label, f"missing in torch {torch.__version__} and in {src}; set to a no-op")
        else:
            outcome[name] = "unavailable"
            report.skipped(STEP, label, f"missing in torch {torch.__version__} and {src} has no {source_name}")
    if not hasattr(acc, "current_accelerator"):
        try:
            dev = torch.device(device_type)
        except RuntimeError as exc:
            outcome["current_accelerator"] = "unavailable"
            report.skipped(STEP, "torch.accelerator.current_accelerator", f"missing; {device_type!r} is no device: {exc}")
        else:
            acc.current_accelerator = lambda *args, **kwargs: dev
            outcome["current_accelerator"] = device_type
            report.applied(STEP, "torch.accelerator.current_accelerator", f"missing; returns torch.device({device_type!r})")
    return outcome
