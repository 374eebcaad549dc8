"""Wiring: vLLM 0.26's V1 model runner hands the TurboQuant backend ``cache_dtype_str="auto"``.

``GPUModelRunner._reshape_kv_cache_tensors`` (vLLM 0.26) picks each attention layer's cache dtype
as ``"auto" if kv_cache_spec.kv_quant_mode == KVQuantMode.NONE else ...``. TurboQuant is not a
``KVQuantMode`` on 0.25/0.26 (its specs are ``TQFullAttentionSpec`` with mode NONE; 0.27 adds
``KVQuantMode.TURBOQUANT``, 0.28 one mode per preset, which the specs carry), so every TurboQuant layer
asks ``TurboQuantAttentionBackend.get_kv_cache_shape`` for the shape of dtype ``"auto"`` and
the engine dies at start-up: ``ValueError: Unknown TurboQuant cache dtype: 'auto'`` (H200,
vLLM 0.26.0, 2026-11-27: every TurboQuant cell, plugin on and off, plain decoding too).
Model Runner V2 (``vllm/v1/worker/gpu/attn_utils.py``) excludes ``TQFullAttentionSpec`` from
that rule; V1 is what 0.26 runs for hybrid models (Qwen3-Next, Qwen3.5), and what vLLM-metax
master forces (``VLLM_USE_V2_MODEL_RUNNER=0``) for every model.

The group wraps ``_reshape_kv_cache_tensors`` to note the runner's configured cache dtype for
the duration of the call, and the TurboQuant backend's ``get_kv_cache_shape`` to take that
dtype when it is asked for a non-TurboQuant one while a TurboQuant dtype is configured. No
other layer is touched: vLLM gives layers it keeps unquantized
(``kv_cache_dtype_skip_layers``) another backend, never TurboQuant's. vLLM-metax's copy of the
backend gets the same wrapper where vLLM selects it (:func:`backend_patches`, landed by
``wiring.turboquant.land_on``).
"""
from __future__ import annotations

import ast
import contextvars
import functools
import importlib
import importlib.util

from vllm_platform_ext.patching import Patch, PatchGroup
from vllm_platform_ext.patch.sources import module_source, read_safely

NAME = "turboquant.v1_runner_cache_dtype"
MOD = "vllm.v1.attention.backends.turboquant_attn"
RUNNER = "vllm.v1.worker.gpu_model_runner"
RESHAPE = f"{RUNNER}:GPUModelRunner._reshape_kv_cache_tensors"
PREFIX = "turboquant_"

_configured: contextvars.ContextVar[str | None] = contextvars.ContextVar("vpe_tq_cache_dtype", default=None)


def resolve(cache_dtype_str: str | None) -> str | None:
    """The dtype TurboQuant's shape should be computed for: ``cache_dtype_str`` unless it is not a
    TurboQuant preset while the running runner is configured with one."""
    configured = _configured.get()
    if configured and configured.startswith(PREFIX) and not str(cache_dtype_str or "").startswith(PREFIX):
        return configured
    return cache_dtype_str


def _shape_factory(orig):
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str=None, *args, **kwargs):
        if cache_dtype_str is None:  # the line's own default
            return orig(num_blocks, block_size, num_kv_heads, head_size, *args, **kwargs)
        return orig(num_blocks, block_size, num_kv_heads, head_size, resolve(cache_dtype_str), *args, **kwargs)

    return get_kv_cache_shape


def _reshape_factory(orig):
    def _reshape_kv_cache_tensors(self, *args, **kwargs):
        token = _configured.set(str(getattr(self.cache_config, "cache_dtype", "") or ""))
        try:
            return orig(self, *args, **kwargs)
        finally:
            _configured.reset(token)

    return _reshape_kv_cache_tensors


def runner_passes_auto(source: str) -> bool:
    """The runner's ``_reshape_kv_cache_tensors`` source maps a ``KVQuantMode.NONE`` spec to
    ``"auto"`` without sparing TurboQuant's spec (vLLM 0.26's V1 runner)."""
    return "KVQuantMode.NONE" in source and '"auto"' in source and "TQFullAttentionSpec" not in source


@functools.lru_cache(maxsize=None)
def runner_method_source(module: str = RUNNER) -> str | None:
    """The source text of ``GPUModelRunner._reshape_kv_cache_tensors`` as the installed file has it
    (read, not imported: bootstrap runs in every vLLM process, and a patched method would show our
    wrapper), or None where the file or the method is missing."""
    found = read_safely(module_source, module)
    if found is None:
        return None
    text = found[1]
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == "GPUModelRunner":
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "_reshape_kv_cache_tensors":
                    return ast.get_source_segment(text, f)
    return None


def tq_is_a_quant_mode() -> bool:
    """The line's ``get_kv_quant_mode`` maps a TurboQuant dtype to a mode of its own (0.27's ``TURBOQUANT``,
    0.28's ``TURBOQUANT_K8V4``...): the attention layer's spec then carries that mode, never ``NONE``."""
    try:
        from vllm.v1.kv_cache_interface import KVQuantMode, get_kv_quant_mode
    except ImportError:
        return False
    return get_kv_quant_mode("turboquant_k8v4") != KVQuantMode.NONE


def needed() -> str | None:
    """None when the running line needs the group, else why not."""
    try:
        found = importlib.util.find_spec(MOD) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"this vLLM has no TurboQuant backend ({MOD})"
    source = runner_method_source()
    if source is None:
        return f"not needed: no GPUModelRunner._reshape_kv_cache_tensors in {RUNNER}"
    if not runner_passes_auto(source):
        return "not needed: this line's V1 runner hands TurboQuant layers their TurboQuant dtype"
    if tq_is_a_quant_mode():
        return ("not needed: TurboQuant is a KVQuantMode on this line (its layers' specs carry it), so the V1 "
                "runner's 'auto' for KVQuantMode.NONE never reaches a TurboQuant layer")
    return None


def backend_patches(backend: type) -> list[Patch]:
    """The shape wrapper for a TurboQuant backend class (upstream's or a vendor's copy), where the
    line needs it and the class has not got it yet."""
    from vllm_platform_ext.patching import carries

    if not hasattr(backend, "get_kv_cache_shape") or carries(backend, "get_kv_cache_shape", NAME) \
            or needed() is not None:
        return []
    return [Patch(f"{backend.__module__}:{backend.__qualname__}.get_kv_cache_shape", _shape_factory)]


def _build() -> list[Patch]:
    upstream = importlib.import_module(MOD).TurboQuantAttentionBackend
    return [Patch(RESHAPE, _reshape_factory), *backend_patches(upstream)]


GROUPS: list[PatchGroup] = [
    PatchGroup(
        name=NAME,
        why="vLLM 0.26's V1 runner asks the TurboQuant backend for the cache shape of dtype 'auto' "
            "(KVQuantMode has no TurboQuant mode): every TurboQuant engine on a hybrid model dies at "
            "start-up with 'Unknown TurboQuant cache dtype: auto'",
        build=_build,
        skip_if=needed,
        targets=(RESHAPE, f"{MOD}:TurboQuantAttentionBackend.get_kv_cache_shape"),
        upstream="vLLM 0.26 gpu_model_runner._reshape_kv_cache_tensors; Model Runner V2 spares "
                 "TQFullAttentionSpec (attn_utils.py), V1 does not",
        retire="probe: the runner's _reshape_kv_cache_tensors spares TQFullAttentionSpec (or is gone) "
               "-> skipped as not needed",
    )
]
