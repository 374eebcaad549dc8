"""Wiring: reserve the TurboQuant backend's shared workspace before vLLM locks it.

vLLM's TurboQuant backend borrows its decode scratch (``_decode_attention``: ``B x Hq x splits
x (D+1)`` float32 partials, the ``B x Hq x D`` output, ``B x Hq`` log-sum-exp) and its
continuation-prefill dequant buffers (``2 x Hk x context x D`` fp16) from vLLM's
``WorkspaceManager``. The runner locks that workspace after CUDA graph capture; a later request
larger than anything seen during profiling and warm-up then fails:
``AssertionError: Workspace is locked but allocation from
'turboquant_attn.py:879:_decode_attention' requires 0.89 MB`` (vLLM 0.23, tiny Qwen3-Next,
TurboQuant k8v4 + MTP k=3, FULL_AND_PIECEWISE, on an H100: the engine dies mid-generation).

vLLM 0.24 fixed it in the metadata builder's ``__init__`` (``_reserve_workspace``: the largest
decode batch and, with chunked prefill, the longest continuation). On lines without that
method (0.22, 0.23, and vLLM-metax's copies of their backend) this group wraps the builder's
``__init__`` to reserve the same, before any lock; where the method exists it is skipped as
not needed. The reservation is sized from the model's real head size and the larger of
``max_num_seqs`` and the largest CUDA graph capture size, so it never falls short of
upstream's own later fix.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from vllm_platform_ext.patching import Patch, PatchGroup

NAME = "turboquant.reserve_workspace"
MOD = "vllm.v1.attention.backends.turboquant_attn"
WORKSPACE_MOD = "vllm.v1.worker.workspace"
CONTINUATION_DECODE_THRESHOLD = 128  # vLLM's _CONTINUATION_DECODE_THRESHOLD on 0.22-0.26


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def workspace_requests(vllm_config: Any, kv_cache_spec: Any, threshold: int = CONTINUATION_DECODE_THRESHOLD):
    """The ``get_simultaneous`` requests to make up front, as ``[((shape, dtype), ...), ...]``."""
    import torch

    sched, model, par = vllm_config.scheduler_config, vllm_config.model_config, vllm_config.parallel_config
    sizes = list(getattr(vllm_config.compilation_config, "cudagraph_capture_sizes", None) or [])
    rows = max([int(sched.max_num_seqs), *map(int, sizes)])
    hq = int(model.get_num_attention_heads(par))
    hk = int(kv_cache_spec.num_kv_heads)
    d = int(model.get_head_size())  # the real head size (the spec's may be the packed slot's half)
    splits = int(vllm_config.attention_config.tq_max_kv_splits_for_cuda_graph)
    out = [(((rows, hq, splits, d + 1), torch.float32), ((rows, hq, d), model.dtype), ((rows, hq), torch.float32))]
    if sched.enable_chunked_prefill and sched.max_num_batched_tokens > threshold:
        alloc = _round_up(max(0, int(model.max_model_len) - 1), int(kv_cache_spec.block_size))
        out.append((((1, hk, alloc, d), torch.float16), ((1, hk, alloc, d), torch.float16)))
    return out


def reserve_workspace(vllm_config: Any, kv_cache_spec: Any) -> int:
    """Grow vLLM's workspace to the largest request the backend can make; returns the bytes
    requested at most (0 where no workspace manager exists yet)."""
    ws = importlib.import_module(WORKSPACE_MOD)
    if not ws.is_workspace_manager_initialized():
        return 0
    threshold = getattr(importlib.import_module(MOD), "_CONTINUATION_DECODE_THRESHOLD",
                        CONTINUATION_DECODE_THRESHOLD)
    largest = 0
    for request in workspace_requests(vllm_config, kv_cache_spec, threshold):
        ws.current_workspace_manager().get_simultaneous(*request)
        largest = max(largest, sum(_round_up(_nbytes(s, d), 256) for s, d in request))
    return largest


def _nbytes(shape, dtype) -> int:
    import math

    import torch

    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _init_factory(orig):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs):
        orig(self, kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs)
        reserve_workspace(vllm_config, kv_cache_spec)

    return __init__


def needed(builder_cls: type) -> bool:
    """The builder lacks upstream's own reservation (vLLM 0.24+: ``_reserve_workspace``)."""
    return not hasattr(builder_cls, "_reserve_workspace")


def backend_patches(backend: type) -> list[Patch]:
    builder = backend.get_builder_cls()
    if not needed(builder):
        return []
    return [Patch(f"{builder.__module__}:{builder.__qualname__}.__init__", _init_factory)]


def _skip_if() -> str | None:
    try:
        found = importlib.util.find_spec(MOD) is not None and importlib.util.find_spec(WORKSPACE_MOD) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"this vLLM has no TurboQuant backend or workspace manager ({MOD}, {WORKSPACE_MOD})"
    builder = importlib.import_module(MOD).TurboQuantMetadataBuilder
    if not needed(builder):
        return "not needed: upstream's builder reserves its workspace itself (_reserve_workspace, vLLM 0.24+)"
    return None


def _build() -> list[Patch]:
    return backend_patches(importlib.import_module(MOD).TurboQuantAttentionBackend)


GROUPS: list[PatchGroup] = [
    PatchGroup(
        name=NAME,
        why="TurboQuant decode/continuation scratch grows the shared workspace after vLLM locked it: "
            "'Workspace is locked' mid-generation on vLLM 0.22/0.23 (fixed upstream in 0.24)",
        build=_build,
        skip_if=_skip_if,
        targets=(f"{MOD}:TurboQuantMetadataBuilder.__init__",),
        upstream="fixed in vLLM 0.24 (TurboQuantMetadataBuilder._reserve_workspace); 0.22/0.23 and "
                 "vLLM-metax's copies of their backend lack it",
        retire="probe: the builder has _reserve_workspace -> skipped as not needed",
    )
]
