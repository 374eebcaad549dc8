"""torch.accelerator backfill: helpers removed, torch.cuda deleted, torch.accelerator absent."""
import sys
import types

import torch

from vllm_platform_ext.compat import accelerator
from vllm_platform_ext.report import Report, Status

NAMES = [name for name, _ in accelerator.HELPERS]


def _remove_helpers(monkeypatch):
    for name in NAMES:
        monkeypatch.delattr(torch.accelerator, name, raising=False)


def _fake_device_module():
    calls = []

    def rec(name, ret=None):
        def fn(*args, **kwargs):
            calls.append((name, args))
            return ret

        fn.__name__ = name
        return fn

    mod = types.SimpleNamespace(
        __name__="torch.fakedev",
        synchronize=rec("synchronize"),
        current_device=rec("current_device", 3),
        set_device=rec("set_device"),
        device=rec("device"),
        current_stream=rec("current_stream"),
        is_available=rec("is_available", True),
        device_count=rec("device_count", 4),
        empty_cache=rec("empty_cache"),
        mem_get_info=rec("mem_get_info", (1, 2)),
        memory=types.SimpleNamespace(memory_allocated=rec("memory_allocated", 7)),
    )
    return mod, calls


def test_missing_helpers_come_from_the_device_module(monkeypatch):
    _remove_helpers(monkeypatch)
    mod, calls = _fake_device_module()
    rep = Report()
    out = accelerator.backfill(rep, module=mod, device_type="fakedev")
    acc = torch.accelerator
    assert acc.current_device_index() == 3 and acc.device_count() == 4
    assert acc.get_memory_info(0) == (1, 2)
    assert acc.memory_allocated() == 7  # found in the module's .memory submodule
    acc.empty_cache()
    acc.synchronize(1)
    assert ("empty_cache", ()) in calls and ("synchronize", (1,)) in calls
    assert out["get_memory_info"] == "torch.fakedev.mem_get_info"
    entry = rep.find("compat", "torch.accelerator.get_memory_info")
    assert entry.status == Status.APPLIED and "torch.fakedev.mem_get_info" in entry.detail
    # no source: a no-op where releasing a cache is safe to skip, reported skipped otherwise
    assert out["empty_host_cache"] == "no-op" and acc.empty_host_cache() is None
    assert out["memory_stats"] == "unavailable" and not hasattr(acc, "memory_stats")
    assert rep.find("compat", "torch.accelerator.memory_stats").status == Status.SKIPPED
    assert len([e for e in rep.entries if e.name.startswith("torch.accelerator.")]) == len(NAMES)


def test_present_helpers_are_never_replaced():
    before = {name: getattr(torch.accelerator, name) for name in NAMES if hasattr(torch.accelerator, name)}
    assert before, "this torch has no accelerator helpers at all"
    mod, _ = _fake_device_module()
    rep = Report()
    accelerator.backfill(rep, module=mod)
    for name, fn in before.items():
        assert getattr(torch.accelerator, name) is fn
        assert rep.find("compat", f"torch.accelerator.{name}").status == Status.SKIPPED


def test_works_with_torch_cuda_deleted(monkeypatch):
    monkeypatch.delattr(torch, "cuda")
    _remove_helpers(monkeypatch)
    assert not hasattr(torch, "cuda")
    dev_type, mod = accelerator.active_device_module()
    assert (dev_type, mod) == ("cpu", torch.cpu)  # this CPU-only machine, no torch.cuda
    rep = Report()
    out = accelerator.backfill(rep)
    assert torch.accelerator.synchronize is torch.cpu.synchronize
    assert torch.accelerator.device_count is torch.cpu.device_count
    torch.accelerator.empty_cache()  # vLLM's call that failed on MetaX no longer raises
    assert out["empty_cache"] == "no-op" and out["get_memory_info"] == "unavailable"
    assert not rep.has_failure("compat")


def test_torch_accelerator_module_absent(monkeypatch):
    monkeypatch.delattr(torch, "accelerator")
    monkeypatch.delitem(sys.modules, "torch.accelerator", raising=False)
    mod, _ = _fake_device_module()
    rep = Report()
    accelerator.backfill(rep, module=mod, device_type="xpu")
    assert sys.modules["torch.accelerator"] is torch.accelerator
    assert torch.accelerator.current_accelerator() == torch.device("xpu")
    assert torch.accelerator.device_count() == 4
    assert rep.find("compat", "torch.accelerator").status == Status.APPLIED


CUDA_GONE = r"""
import sys, torch
del torch.cuda
sys.modules["torch.cuda"] = None  # "import torch.cuda" now fails too
for name in ("empty_cache", "synchronize", "get_memory_info"):
    delattr(torch.accelerator, name)
import vllm_platform_ext.compat as compat
from vllm_platform_ext.report import Report
rep = Report()
compat.accelerator.backfill(rep)
torch.accelerator.empty_cache(); torch.accelerator.synchronize()
print("OK", [e.status.value for e in rep.entries if e.name == "torch.accelerator.empty_cache"])
"""


def test_compat_imports_and_backfills_without_torch_cuda_in_fresh_process(python):
    proc = python(CUDA_GONE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK ['applied']" in proc.stdout
