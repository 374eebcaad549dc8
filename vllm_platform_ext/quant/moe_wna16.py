"""``moe_wna16`` that survives ``FusedMoEConfig``/kernel API drift across vLLM versions.

What drifted (and broke vLLM-metax on vLLM 0.23, see its PR #294):

* ``FusedMoEConfig.disable_inplace``: older vLLM has it, and MoE methods passed
  ``inplace=not self.moe.disable_inplace`` to the fused-experts call; vLLM 0.32 has
  neither the field nor an ``inplace`` argument on ``FusedMoEKernel.apply``. Code that
  reads the field unconditionally crashes with ``AttributeError`` on newer vLLM.

The hardening is two patch groups, applied with the others; vLLM's quantization registry is left
as it is (vLLM's ``MoeWNA16Config``, or the one a platform plugin such as vLLM-metax registers):

* ``moe.wna16_kernel_call``: where vLLM's ``MoeWNA16Method`` calls a kernel object (0.27 on), its
  ``apply``/``apply_monolithic`` -- and those of any subclass that calls ``self.moe_kernel`` itself --
  call it through :class:`KernelCallAdapter`, which passes ``inplace`` only to a kernel whose method
  accepts it (value from :func:`moe_inplace`: the config's ``disable_inplace`` when the field exists,
  else vLLM's default, in place) and drops an ``inplace`` the caller passes to one that no longer
  takes it. It lands on the class every path builds (the registry name, AutoGPTQ's fallback, INC, a
  plugin's config), so no config of ours is registered.
* ``moe.disable_inplace_default``: the field given back, as a class default, where the line dropped it
  and a method installed here still reads it (vLLM-metax's v0.22-v0.24 lines).
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
            if _reachable(sub) and any(_uses_kernel(sub, a) for a in KERNEL_METHODS):
                out.append(sub)
    return out


def _reachable(cls: type) -> bool:
    """``cls`` is what its module's name path resolves to (a class made in a function, or whose module was
    not imported by name, cannot be a patch target)."""
    import sys

    obj: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


def _kernel_call_patches() -> list[Patch]:
    """The kernel-calling methods of :func:`method_classes` not yet carrying the group's wrapper."""
    from vllm_platform_ext.patching import carries

    return [Patch(f"{cls.__module__}:{cls.__qualname__}.{attr}", _kernel_call_factory)
            for cls in method_classes() for attr in KERNEL_METHODS
            if _uses_kernel(cls, attr) and not carries(cls, attr, KERNEL_CALL_GROUP)]


def land_on_subclasses() -> list[str]:
    """Apply the group's wrapper to the kernel-calling subclasses imported after it was applied (a plugin
    whose general plugin ran after our bootstrap); each is recorded in this process's report."""
    from vllm_platform_ext import patching
    from vllm_platform_ext.report import current

    patches = _kernel_call_patches()
    if not patches:
        return []
    patching.apply(KERNEL_CALL_GROUP, patches)
    report = current()
    for p in patches:
        if report is not None:
            report.applied("patch", f"{KERNEL_CALL_GROUP} -> {p.target}",
                           "a plugin's moe_wna16 method calling self.moe_kernel: through KernelCallAdapter")
    return [p.target for p in patches]


def _init_factory(orig):
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        # a subclass that calls its kernel in its own apply (a plugin's, imported after the bootstrap):
        # the group lands on it before its first call
        from vllm_platform_ext.patching import carries

        if any(attr in vars(k) and not carries(k, attr, KERNEL_CALL_GROUP) and _uses_kernel(k, attr)
               for k in type(self).__mro__ for attr in KERNEL_METHODS):
            try:
                land_on_subclasses()
            except Exception as exc:  # reported; the method is built as vLLM builds it
                from vllm_platform_ext.patching import strict_mode
                from vllm_platform_ext.report import current

                report = current()
                if report is not None:
                    report.failed("patch", f"{KERNEL_CALL_GROUP} -> {type(self).__qualname__}",
                                  f"{type(exc).__name__}: {exc}")
                if strict_mode():
                    raise

    __init__.__name__ = "__init__"
    return __init__


def _kernel_call_build() -> list[Patch]:
    return [Patch(f"{WNA16_METHOD}.__init__", _init_factory), *_kernel_call_patches()]


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


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def kernel_call_state(cls: type) -> str:
    """Whether ``moe.wna16_kernel_call`` covers MoE method class ``cls`` in this process now, per method
    (own or inherited): it carries the group's replacement (covered), calls ``self.moe_kernel`` without it
    (bare: the group skipped or disabled), or calls no kernel object (``fused_experts`` itself, or none)."""
    from vllm_platform_ext.patching import carries

    by = {"covered": [], "bare": [], "none": []}
    for attr in KERNEL_METHODS:
        owner = next((k for k in cls.__mro__ if attr in vars(k)), None)
        if owner is None:
            continue
        by["covered" if carries(cls, attr, KERNEL_CALL_GROUP) else "bare" if _uses_kernel(owner, attr)
           else "none"].append(attr)
    parts = []
    if by["covered"]:
        parts.append(f"{', '.join(by['covered'])} covered by {KERNEL_CALL_GROUP}")
    if by["bare"]:
        parts.append(f"{', '.join(by['bare'])} call the kernel bare, not through KernelCallAdapter "
                     f"({KERNEL_CALL_GROUP} skipped or disabled)")
    if by["none"]:
        parts.append(f"{', '.join(by['none'])} call no kernel object ({KERNEL_CALL_GROUP} not applicable; "
                     f"an inplace reading there is {DISABLE_INPLACE_GROUP}'s)")
    return f"{_qualname(cls)}: " + "; ".join(parts)


def served() -> tuple[type, list[type]]:
    """The config vLLM's registry serves as ``moe_wna16`` (vLLM's own or a plugin's) and the MoE method
    classes it builds: the subclasses of vLLM's ``MoeWNA16Method`` defined beside it, else vLLM's."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    config_cls = get_quantization_config(NAME)
    owner, name = resolve(WNA16_METHOD)
    base = getattr(owner, name)
    found, todo = [], [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__ == config_cls.__module__ and sub not in found:
                found.append(sub)
    return config_cls, found or [base]


def doctor_row() -> list[str]:
    """doctor's ``fix_targets`` row: ``["moe_wna16", served config, who registered it; each method's state]``."""
    config_cls, methods = served()
    who = "vLLM's own" if config_cls.__module__.startswith("vllm.") else "registered by a plugin, kept"
    return [NAME, _qualname(config_cls), f"{who}; " + "; ".join(kernel_call_state(m) for m in methods)]


GROUPS = [
    PatchGroup(
        name=KERNEL_CALL_GROUP,
        why="fused-experts kernels differ in whether apply takes inplace (older APIs and a plugin's kernel do; "
            "FusedMoEKernel takes none on any kept line, 0.22-0.34), and every path that builds moe_wna16 "
            "methods (the registry name, AutoGPTQ's fallback, INC, vLLM-metax's configs) ends in vLLM's "
            "MoeWNA16Method or a subclass of it: their kernel call goes through KernelCallAdapter, which passes "
            "inplace exactly where the kernel's apply/apply_monolithic takes it (a plugin's subclass imported "
            "after the bootstrap: at its first construction, through MoeWNA16Method.__init__)",
        build=_kernel_call_build,
        skip_if=_kernel_call_skip,
        targets=tuple(f"{WNA16_METHOD}.{a}" for a in ("__init__", *KERNEL_METHODS)),
        upstream="none: guards the fused-experts kernels' inplace argument drift (FusedMoEKernel.apply / "
                 "apply_monolithic take none on 0.22-0.34, read from each line's wheel 2026-12-07)",
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

