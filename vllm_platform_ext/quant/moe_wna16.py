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

from vllm_platform_ext.patching import Patch, PatchGroup, PatchTargetMissing, resolve

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


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def vendor_config() -> type | None:
    """The ``moe_wna16`` config another plugin registered (vLLM-metax registers its MACA one,
    which turns Marlin off), else ``None``."""
    from vllm.model_executor.layers import quantization as q

    current = getattr(q, "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG", {}).get(NAME)
    if current is None or current.__module__.startswith(("vllm.", __name__)):
        return None
    return current


def register() -> str:
    """Register :class:`MoeWNA16CompatConfig` as ``moe_wna16``; returns a report line.

    A vendor's registration is kept (raises :class:`NotRegistered` with the reason): replacing
    it would undo what the vendor changed for its hardware. Its MoE method is served by the
    ``moe.disable_inplace_default`` group where the vLLM line dropped the field it reads."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    from vllm_platform_ext.quant.errors import NotRegistered

    vendor = vendor_config()
    if vendor is not None:
        raise NotRegistered(f"kept {_qualname(vendor)}, registered as {NAME} by another plugin; "
                            f"{DISABLE_INPLACE_GROUP} covers its MoE method")
    config_cls, _ = classes()
    register_quantization_config(NAME)(config_cls)
    return f"{NAME} -> {_qualname(config_cls)} (inplace via KernelCallAdapter)"


# -- FusedMoEConfig.disable_inplace where the line dropped it ------------------------------------

DISABLE_INPLACE_GROUP = "moe.disable_inplace_default"
FUSED_MOE_CONFIG = "vllm.model_executor.layers.fused_moe.config:FusedMoEConfig"


def _disable_inplace_skip() -> str | None:
    try:
        owner, name = resolve(FUSED_MOE_CONFIG)
    except PatchTargetMissing as exc:
        return str(exc)
    klass = getattr(owner, name)
    if hasattr(klass, "disable_inplace") or "disable_inplace" in getattr(klass, "__dataclass_fields__", {}):
        return "not needed: this vLLM's FusedMoEConfig has disable_inplace"
    metax = vllm_metax_moe_sources()
    if metax and not any("disable_inplace" in text for text in metax.values()):
        return (f"not needed: vLLM-metax's moe_wna16 ({', '.join(metax)}) does not read disable_inplace "
                "(its v0.25 line on), nor does vLLM's own code on this line")
    return None


def vllm_metax_moe_sources() -> dict[str, str]:
    """The source of vLLM-metax's ``moe_wna16`` module(s) where vLLM-metax is installed (path ->
    text), found without importing it (its package imports its compiled parts); else empty."""
    import importlib.util
    import pathlib

    try:
        spec = importlib.util.find_spec("vllm_metax")
    except (ImportError, ValueError):
        return {}
    out = {}
    for root in (spec.submodule_search_locations or []) if spec else []:
        for rel in ("quant_config/moe_wna16.py", "registry/quant_config/moe_wna16.py"):
            f = pathlib.Path(root) / rel
            if f.is_file():
                out[str(f)] = f.read_text(errors="replace")
    return out


# -- the kernel-call adapter on vLLM's MoeWNA16Method itself ------------------------------------

KERNEL_CALL_GROUP = "moe.wna16_kernel_call"
WNA16_METHOD = "vllm.model_executor.layers.quantization.moe_wna16:MoeWNA16Method"
KERNEL_METHODS = ("apply", "apply_monolithic")


def _kernel_call_factory(orig):
    def call(self, layer, x, *args, **kwargs):
        _adapted(self)
        return orig(self, layer, x, *args, **kwargs)

    call.__name__ = getattr(orig, "__name__", "apply")
    return call


def _uses_kernel(cls: type, attr: str) -> bool:
    fn = vars(cls).get(attr)
    try:
        return fn is not None and "self.moe_kernel" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


def method_classes() -> list[type]:
    """vLLM's ``MoeWNA16Method`` and any subclass (a plugin's, e.g. vLLM-metax's ``MoeWNA16Method``)
    with its own ``apply``/``apply_monolithic`` that calls ``self.moe_kernel``: every path that builds
    moe_wna16 methods (AutoGPTQ's fallback, INC, vLLM-metax's configs) ends in one of them."""
    owner, name = resolve(WNA16_METHOD)
    base = getattr(owner, name)
    out, todo = [base], [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if not sub.__module__.startswith(__name__) and any(_uses_kernel(sub, a) for a in KERNEL_METHODS):
                out.append(sub)
    return out


def _kernel_call_build() -> list[Patch]:
    from vllm_platform_ext.patching import carries

    return [Patch(f"{cls.__module__}:{cls.__qualname__}.{attr}", _kernel_call_factory)
            for cls in method_classes() for attr in KERNEL_METHODS
            if _uses_kernel(cls, attr) and not carries(cls, attr, KERNEL_CALL_GROUP)]


def _kernel_call_skip() -> str | None:
    """Not applicable where this line's MoeWNA16Method calls fused_experts itself, with no kernel object (0.22-0.26)."""
    try:
        owner, name = resolve(WNA16_METHOD)
    except PatchTargetMissing as exc:
        return f"not applicable: {exc}"
    if not any(_uses_kernel(getattr(owner, name), a) for a in KERNEL_METHODS):
        return ("not applicable: this vLLM's MoeWNA16Method calls fused_experts itself (no kernel object; "
                f"its inplace reading is {DISABLE_INPLACE_GROUP}'s)")
    return None


GROUPS = [
    PatchGroup(
        name=KERNEL_CALL_GROUP,
        why="vLLM's AutoGPTQ fallback, INC and vLLM-metax build moe_wna16 methods from vLLM's classes, not "
            "through the registry, so the registered MoeWNA16CompatConfig never reaches them: the kernel call of "
            "MoeWNA16Method itself goes through KernelCallAdapter (inplace passed exactly where the kernel's "
            "apply takes it)",
        build=_kernel_call_build,
        skip_if=_kernel_call_skip,
        targets=tuple(f"{WNA16_METHOD}.{a}" for a in KERNEL_METHODS),
        upstream="none: guards FusedMoEKernel.apply's inplace argument drift (vLLM 0.32 dropped it)",
        retire="when no served line's kernel API differs in inplace from its callers (then the group can go with "
               "KernelCallAdapter); tests/quant/test_quant_mtp_layer.py::test_kernel_call_group_reaches_vllms_own_method",
    ),
    PatchGroup(
        name=DISABLE_INPLACE_GROUP,
        why="vLLM 0.23 dropped FusedMoEConfig.disable_inplace, but vLLM-metax's moe_wna16 method on its "
            "v0.23/v0.24 lines still passes inplace=not self.moe.disable_inplace: AttributeError on the first "
            "MoE forward (vLLM-metax PR #294, unmerged). Adds the field back as a class default, False "
            "(in place), the value PR #294 reads and validated on C500 and the one moe_inplace() assumes "
            "for an absent field; retired where the field exists or vLLM-metax stops reading it (v0.25, #326)",
        build=lambda: [Patch(f"{FUSED_MOE_CONFIG}.disable_inplace", lambda _: False, add_missing=True)],
        skip_if=_disable_inplace_skip,
        targets=(f"{FUSED_MOE_CONFIG}.disable_inplace",),
        upstream="vLLM-metax PR #294 (unmerged); vLLM dropped the field in 0.23",
        retire="probe: FusedMoEConfig has disable_inplace, or an installed vLLM-metax's moe_wna16 no longer "
               "reads it (its v0.25 line on, #326) -> skipped as not needed",
    )
]


def unregister() -> None:
    """Undo :func:`register` (tests): vLLM's own ``MoeWNA16Config`` answers again."""
    from vllm.model_executor.layers import quantization as q

    registry = getattr(q, "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG", {})
    config_cls, _ = classes()
    if registry.get(NAME) is config_cls:
        del registry[NAME]
