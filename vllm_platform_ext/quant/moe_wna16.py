"""``moe_wna16`` that survives ``FusedMoEConfig``/kernel API drift across vLLM versions.

What drifted (and broke vLLM-metax on vLLM 0.23, see its PR #294):

* ``FusedMoEConfig.disable_inplace``: older vLLM has it, and MoE methods passed
  ``inplace=not self.moe.disable_inplace`` to the fused-experts call; vLLM 0.32 has
  neither the field nor an ``inplace`` argument on ``FusedMoEKernel.apply``. Code that
  reads the field unconditionally crashes with ``AttributeError`` on newer vLLM.

The hardening: :class:`MoeWNA16CompatConfig` is registered as ``moe_wna16`` through
vLLM's quantization registry (``register_quantization_config``). Its MoE method is
vLLM's own ``MoeWNA16Method`` with one change: the fused-MoE kernel is called through
:class:`KernelCallAdapter`, which passes ``inplace`` only to a kernel whose ``apply``
accepts it (value from :func:`moe_inplace`: the config's ``disable_inplace`` when the
field exists, else vLLM's default, in-place) and drops an ``inplace`` the caller passes
to a kernel that no longer takes it. Everything else is upstream code, unchanged.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

NAME = "moe_wna16"


def moe_inplace(moe_config: Any) -> bool:
    """Whether the fused experts may write in place: ``not disable_inplace`` where the
    config has the field (older vLLM), else ``True`` (the default it had)."""
    return not bool(getattr(moe_config, "disable_inplace", False))


@functools.lru_cache(maxsize=None)
def _accepts(fn_type: type, method: str, param: str) -> bool:
    fn = getattr(fn_type, method, None)
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return param in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class KernelCallAdapter:
    """Wraps a fused-MoE kernel so ``apply``/``apply_monolithic`` get ``inplace`` exactly
    when they accept it. Other attributes are the kernel's."""

    def __init__(self, kernel: Any, moe_config: Any) -> None:
        self._kernel = kernel
        # Decided once here (not per call): the kernel type and the config do not change.
        self._inplace = {
            m: (moe_inplace(moe_config) if _accepts(type(kernel), m, "inplace") else None)
            for m in ("apply", "apply_monolithic")
        }

    @property
    def wrapped(self) -> Any:
        return self._kernel

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        inplace = self._inplace[method]
        if inplace is None:
            kwargs.pop("inplace", None)
        else:
            kwargs.setdefault("inplace", inplace)
        return getattr(self._kernel, method)(*args, **kwargs)

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("apply", args, kwargs)

    def apply_monolithic(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("apply_monolithic", args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)


def _adapted(method: Any) -> None:
    kernel = getattr(method, "moe_kernel", None)
    if kernel is not None and not isinstance(kernel, KernelCallAdapter):
        method.moe_kernel = KernelCallAdapter(kernel, method.moe)


@functools.cache
def classes() -> tuple[type, type]:
    """``(MoeWNA16CompatConfig, MoeWNA16CompatMethod)``, built on first use (imports vLLM)."""
    from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Config, MoeWNA16Method

    class MoeWNA16CompatMethod(MoeWNA16Method):
        """vLLM's ``MoeWNA16Method`` calling its kernel through :class:`KernelCallAdapter`."""

        def apply(self, layer, x, *args, **kwargs):
            _adapted(self)
            return super().apply(layer, x, *args, **kwargs)

        def apply_monolithic(self, layer, x, *args, **kwargs):
            _adapted(self)
            return super().apply_monolithic(layer, x, *args, **kwargs)

    class MoeWNA16CompatConfig(MoeWNA16Config):
        """vLLM's ``MoeWNA16Config`` whose MoE layers get :class:`MoeWNA16CompatMethod`."""

        def get_quant_method(self, layer, prefix):
            method = super().get_quant_method(layer, prefix)
            # Upstream decides which layers get MoeWNA16Method (and builds it, choosing the
            # backend); only the class changes, so no constructor logic is duplicated.
            if type(method) is MoeWNA16Method:
                method.__class__ = MoeWNA16CompatMethod
            return method

    # Module-level names, so pickle (the config travels to worker processes inside
    # VllmConfig.quant_config) finds them; __getattr__ below builds them on demand.
    for klass in (MoeWNA16CompatConfig, MoeWNA16CompatMethod):
        klass.__module__ = __name__
        klass.__qualname__ = klass.__name__
        globals()[klass.__name__] = klass
    return MoeWNA16CompatConfig, MoeWNA16CompatMethod


def __getattr__(name: str) -> Any:
    if name in ("MoeWNA16CompatConfig", "MoeWNA16CompatMethod"):
        config_cls, method_cls = classes()
        return config_cls if name == "MoeWNA16CompatConfig" else method_cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> str:
    """Register :class:`MoeWNA16CompatConfig` as ``moe_wna16``; returns a report line."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    config_cls, _ = classes()
    register_quantization_config(NAME)(config_cls)
    return f"{NAME} -> {config_cls.__module__}.{config_cls.__qualname__} (inplace via KernelCallAdapter)"


def unregister() -> None:
    """Undo :func:`register` (tests): vLLM's own ``MoeWNA16Config`` answers again."""
    from vllm.model_executor.layers import quantization as q

    registry = getattr(q, "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG", {})
    config_cls, _ = classes()
    if registry.get(NAME) is config_cls:
        del registry[NAME]
