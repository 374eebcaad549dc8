"""Which model runner a CUDA engine of the installed vLLM line builds for a Qwen3.5/3.6 model with
speculative decoding: V1 (``vllm/v1/worker/gpu_model_runner.py``) or model runner v2 (``vllm/v1/worker/gpu/``).

It matters because two patch groups patch the V1 runner only (:data:`V1_RUNNER_GROUPS`): where a line
builds v2, they are applied and never called. Measured on each line's own code (tests/compat/test_compat_lines_import.py, ``RUNNERS``):
0.22-0.28 build V1 for Qwen3.5 (v2 is the default only for a list of architectures, not the hybrid ones);
from 0.29 v2 is the CUDA default wherever it supports the config -- MTP on 0.29+, ngram from 0.32/0.33;
0.34 has no V1 runner. Read in v2 (0.33), not run in an engine: its drafts come from the speculator's own
device buffer (the draft model's argmax over its vocabulary-sized logits), not from the scheduler's host lists,
so the -1 / grammar-padding sources ``spec.draft_ids_in_vocab`` guards in V1 do not feed v2's input ids.

The answer is vLLM's own ``VllmConfig.use_v2_model_runner`` run on a stand-in config: the model, the
speculative method and the mamba cache mode as given, every other feature it asks about off (no pipeline
or context parallelism, no DBO, no HiSparse, no watermark, the default compile mode), Triton present, a
CUDA platform. ``VLLM_USE_V2_MODEL_RUNNER`` is read as vLLM reads it: a user's setting wins.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
# the groups whose targets are V1 runner methods (or read what only the V1 runner passes)
# (gdn.cuda_zero_draft_spec_rows patches v2's MambaHybridModelState.prepare_attn too, where it is old: 0.27-0.31)
V1_RUNNER_GROUPS = ("spec.draft_ids_in_vocab", "turboquant.v1_runner_cache_dtype")
QWEN3_5 = "Qwen3_5ForConditionalGeneration"


class _Off:
    """A config feature nobody set: falsy, equal to nothing, smaller and greater than nothing, empty,
    callable (returns itself), and every attribute of it is off too."""

    def __getattr__(self, name: str) -> "_Off":
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args, **kwargs) -> "_Off":
        return self

    def __eq__(self, other) -> bool:
        return False

    __hash__ = object.__hash__
    __lt__ = __le__ = __gt__ = __ge__ = __eq__

    def __iter__(self):
        return iter(())

    def __contains__(self, item) -> bool:
        return False


class _Config(_Off):
    def __init__(self, **fields: Any):
        self.__dict__.update(fields)


def _stand_in(vllm_config_cls: type, method: str | None, mamba_cache_mode: str, architecture: str,
              is_moe: bool, is_quantized: bool) -> Any:
    """An object of a subclass of nothing that carries ``VllmConfig``'s own methods and properties and the
    given config values; anything else it is asked for is :class:`_Off`."""
    members = {k: v for k, v in vllm_config_cls.__dict__.items()
               if not k.startswith("__") and (inspect.isfunction(v) or isinstance(v, (property, staticmethod, classmethod)))}
    stub_cls = type("VllmConfigStandIn", (_Off,), members)
    stub = stub_cls()
    try:
        from vllm.config.compilation import CompilationMode
        mode = CompilationMode.VLLM_COMPILE
    except (ImportError, AttributeError):
        mode = _Off()
    spec = None if method is None else _Config(method=method, num_speculative_tokens=3, parallel_drafting=False,
                                                draft_model_config=None, use_heterogeneous_vocab=False)
    stub.__dict__.update(
        model_config=_Config(architectures=[architecture], runner_type="generate", is_moe=is_moe,
                             is_quantized=is_quantized, is_hybrid=True, is_attention_free=False, is_diffusion=False),
        speculative_config=spec,
        cache_config=_Config(mamba_cache_mode=mamba_cache_mode),
        parallel_config=_Config(pipeline_parallel_size=1, tensor_parallel_size=1, prefill_context_parallel_size=1,
                                decode_context_parallel_size=1, distributed_executor_backend="mp"),
        compilation_config=_Config(mode=mode), attention_config=_Config(hisparse_config=None),
        watermark_config=None)
    return stub


class _Cuda:
    """What the property asks of ``current_platform``, answered for a CUDA host."""

    def is_rocm(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return True

    def is_unspecified(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False


def cuda_runner(method: str | None, mamba_cache_mode: str = "none", architecture: str = QWEN3_5,
                is_moe: bool = False, is_quantized: bool = False) -> dict[str, str]:
    """``{"runner": "v1" | "v2", "why": ...}``: what this line's CUDA engine builds for ``architecture`` with
    speculative ``method`` (``"mtp"``, ``"ngram"``; None: no speculative decoding)."""
    import vllm.platforms as platforms

    try:
        importlib.import_module(V1_RUNNER_MODULE)
    except ImportError:
        return {"runner": "v2", "why": f"{V1_RUNNER_MODULE} is gone: model runner v2 is the only runner"}
    vc = importlib.import_module("vllm.config.vllm")
    prop = vc.VllmConfig.__dict__.get("use_v2_model_runner")
    if not isinstance(prop, property):
        return {"runner": "v1", "why": "VllmConfig has no use_v2_model_runner: the V1 runner only"}
    stub = _stand_in(vc.VllmConfig, method, mamba_cache_mode, architecture, is_moe, is_quantized)
    saved_triton = vc.__dict__.get("HAS_TRITON", None)
    saved_platform = platforms.__dict__.get("_current_platform")
    saved_module_platform = vc.__dict__.get("current_platform")
    try:
        if "HAS_TRITON" in vc.__dict__:
            vc.HAS_TRITON = True
        platforms._current_platform = _Cuda()  # what `from vllm.platforms import current_platform` resolves
        if saved_module_platform is not None:
            vc.current_platform = platforms._current_platform
        v2 = bool(prop.fget(stub))
        unsupported = getattr(stub, "_get_v2_model_runner_unsupported_features", None)
        features = list(unsupported()) if callable(unsupported) and not isinstance(unsupported, _Off) else []
    finally:
        if saved_triton is not None:
            vc.HAS_TRITON = saved_triton
        platforms._current_platform = saved_platform
        if saved_module_platform is not None:
            vc.current_platform = saved_module_platform
    if v2:
        return {"runner": "v2", "why": "VllmConfig.use_v2_model_runner: v2 is this line's default for the config"}
    return {"runner": "v1", "why": "VllmConfig.use_v2_model_runner: "
            + (f"v2 does not support {', '.join(features)}" if features else "v1 is this line's default for the model")}


def describe() -> list[list[str]]:
    """doctor's rows: per speculative method, the runner a CUDA engine of this line builds for Qwen3.5 (vLLM's
    defaults, prefix caching off) and what that means for the groups that patch the V1 runner."""
    from vllm_platform_ext import patching

    applied = [g for g in V1_RUNNER_GROUPS if patching.applied_targets(g)]
    rows = []
    for method in ("mtp", "ngram"):
        got = cuda_runner(method)
        if not applied:
            reach = "no V1-runner group is applied in this process"
        elif got["runner"] == "v1":
            reach = f"the V1-runner groups applied here act: {', '.join(applied)}"
        else:
            reach = f"applied here, never called by v2: {', '.join(applied)}"
        rows.append([method, got["runner"], got["why"], reach])
    return rows
