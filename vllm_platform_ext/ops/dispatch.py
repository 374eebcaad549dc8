"""The per-platform op registry: one table of the kernels this plugin owns.

Each op has one implementation per platform key (``cuda``, ``maca``, ``cpu``). An
implementation is named by its import path (``"pkg.module:function"``) and resolved
lazily, so building the table imports neither Triton nor vLLM. Launch configurations
(``num_warps``, block sizes, ...) travel with the entry, so a platform can carry its
own (MACA caps ``num_warps`` lower than CUDA, for instance) and ``doctor`` prints them.

The entries themselves are declared beside their kernels (``ops/gdn/__init__.py``,
``ops/turboquant/__init__.py``) as :class:`OpImpl` lists and collected by
``vllm_platform_ext.ops.register_all``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

PLATFORMS = ("cuda", "maca", "cpu")


class OpDispatchError(LookupError):
    """An op or platform is unknown, or an implementation cannot be loaded."""


@dataclass(frozen=True)
class OpImpl:
    op: str  # e.g. "gdn.causal_conv1d_update"
    platform: str  # one of PLATFORMS
    impl: str  # "package.module:callable"
    backend: str  # "torch" | "triton"
    config: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise OpDispatchError(f"op {self.op!r}: unknown platform {self.platform!r}; expected one of {PLATFORMS}")
        if ":" not in self.impl:
            raise OpDispatchError(f"op {self.op!r}: impl {self.impl!r} must be 'module:callable'")


class OpRegistry:
    def __init__(self) -> None:
        self._impls: dict[tuple[str, str], OpImpl] = {}
        self._resolved: dict[tuple[str, str], Callable] = {}

    def register(self, impl: OpImpl) -> None:
        key = (impl.op, impl.platform)
        old = self._impls.get(key)
        if old is not None and old != impl:
            raise OpDispatchError(f"op {impl.op!r} already has a {impl.platform} implementation: {old.impl}")
        self._impls[key] = impl

    def ops(self) -> list[str]:
        return sorted({op for op, _ in self._impls})

    def entry(self, op: str, platform: str) -> OpImpl:
        try:
            return self._impls[(op, platform)]
        except KeyError:
            have = sorted(p for o, p in self._impls if o == op)
            if not have:
                raise OpDispatchError(f"unknown op {op!r}; registered ops: {self.ops()}") from None
            raise OpDispatchError(f"op {op!r} has no {platform!r} implementation (have: {have})") from None

    def get(self, op: str, platform: str | None = None) -> Callable:
        """The callable for ``op`` on ``platform`` (default: the active platform)."""
        platform = platform or active_platform()
        key = (op, platform)
        fn = self._resolved.get(key)
        if fn is None:
            e = self.entry(op, platform)
            module, _, attr = e.impl.partition(":")
            try:
                fn = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise OpDispatchError(f"op {op!r} on {platform}: cannot load {e.impl}: {exc}") from exc
            self._resolved[key] = fn
        return fn

    def config(self, op: str, platform: str | None = None) -> dict[str, Any]:
        return dict(self.entry(op, platform or active_platform()).config)

    def table(self) -> list[dict[str, Any]]:
        return [
            {"op": e.op, "platform": e.platform, "backend": e.backend, "impl": e.impl, "config": dict(e.config)}
            for (_, _), e in sorted(self._impls.items())
        ]


REGISTRY = OpRegistry()


def active_platform() -> str:
    """The platform key of this process: ``maca`` where the MetaX probe finds MACA,
    ``cuda`` where torch sees a CUDA device, else ``cpu``."""
    from vllm_platform_ext import detect

    if detect.probe().platform == "maca":
        return "maca"
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda"
    except (ImportError, AttributeError):
        pass
    return "cpu"


def get_op(op: str, platform: str | None = None) -> Callable:
    return REGISTRY.get(op, platform)


def op_config(op: str, platform: str | None = None) -> dict[str, Any]:
    return REGISTRY.config(op, platform)
