"""The routed TurboQuant call's host path keeps what does not change in a process: a CUDA device's
properties are read once per device (the op read them three times a call), and the wiring resolves
the op, its config and the workspace once per attention impl and device. Window 7 measured the
routed call's host time at batch 1 about halved on an H200 (``results/gpu/2026-11-28-40-layer-c-vs-d-token-split/2026-11-28-w7-host-route.md``);
these tests pin the caching itself, on the CPU, and that every call's tensor is still checked.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from vllm_platform_ext.ops.turboquant import launch_policy as policy
from vllm_platform_ext.patch.turboquant import spec_verify as wiring


def test_device_properties_are_read_once_per_device(monkeypatch):
    reads = []

    def props(index):
        reads.append(index)
        return SimpleNamespace(major=9, minor=index, multi_processor_count=132 - index)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    policy._cuda_properties.cache_clear()
    try:
        for _ in range(3):
            assert policy.device_capability(torch.device("cuda", 0)) == (9, 0)
            assert policy._num_sms(torch.device("cuda", 0)) == 132
            assert policy.device_capability(torch.device("cuda")) == (9, 1)  # the current device: 1
        assert sorted(reads) == [0, 1]
        assert policy._num_sms(torch.device("cpu")) == 132 and sorted(reads) == [0, 1]  # no CUDA read off CUDA
    finally:
        policy._cuda_properties.cache_clear()


def test_route_op_is_resolved_once_per_impl_and_device(monkeypatch):
    from vllm_platform_ext.ops import dispatch

    calls = []

    def get_op(op, platform=None):
        calls.append(("op", op, platform))
        return lambda *a, **k: None

    monkeypatch.setattr(dispatch, "active_platform", lambda: "cpu")
    monkeypatch.setattr(dispatch, "get_op", get_op)
    monkeypatch.setattr(dispatch, "op_config", lambda op, platform=None: {"flag": platform})
    impl, other = SimpleNamespace(), SimpleNamespace()
    for _ in range(3):
        op, extra = wiring._route_op(impl, torch.device("cpu"))
        assert extra == {"flag": "cpu"}
    wiring._route_op(other, torch.device("cpu"))
    assert calls == [("op", wiring.OP, "cpu")] * 2  # once per impl
    wiring._route_op(impl, torch.device("meta"))  # another device: resolved again
    assert len(calls) == 3


def test_cached_layout_still_checks_each_tensor(monkeypatch):
    """The impl keeps its probed layout and slot size, but every call's tensor is still checked:
    a cache of the wrong head count keeps vLLM's path (None) on a later call too."""
    from vllm_platform_ext.patch.turboquant import cache_view as TL

    class Impl:
        num_kv_heads, head_size, kv_cache_dtype = 2, 256, "turboquant_k8v4"

    class Backend:
        @staticmethod
        def get_impl_cls():
            return Impl

    TL.remember(Backend, TL.CacheLayout(("blocks", "tokens", "heads", "slot"), "test"))
    monkeypatch.setattr(wiring, "_report_mismatch", lambda reason: None)
    impl = Impl()
    assert not hasattr(impl, "_pe_layout")
    assert wiring._op_cache_view(impl, torch.zeros(3, 16, 4, 1, dtype=torch.uint8)) is None  # found, then checked
    good_slot = impl._pe_layout[1]
    good = torch.zeros(3, 16, 2, good_slot, dtype=torch.uint8)
    assert wiring._op_cache_view(impl, good) is not None
    assert wiring._op_cache_view(impl, torch.zeros(3, 16, 4, good_slot, dtype=torch.uint8)) is None
    assert wiring._op_cache_view(impl, good) is not None
