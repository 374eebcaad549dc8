"""Wiring: unquantized MoE layers under the standalone ``MacaPlatform``.

vLLM (every line 0.22-0.33) gives an out-of-tree platform the ``OOT`` unquantized-MoE backend with
no experts class and expects the platform's own plugin to register its MoE op (vLLM-metax does,
with ``register_oot``). Our platform runs vLLM's CUDA code paths through Triton, and has no such
op: Qwen3-Next / Qwen3.5-MoE layers then fail at the first forward with ``'UnquantizedFusedMoEMethod'
object has no attribute 'is_monolithic'`` (vLLM 0.23 on an H100 under
``VLLM_PLATFORM_EXT_PLATFORM=maca``, 2026-11-25; the real error, ``experts_cls`` None, is masked by
``nn.Module.__getattr__``). The group gives such layers the Triton experts vLLM picks on CUDA.
Applies only where the resolved platform is this package's ``MacaPlatform``.
"""
from __future__ import annotations

from vllm_platform_ext.patching import Patch, PatchGroup

NAME = "maca.unquantized_moe_triton"
TARGET = "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method:select_unquantized_moe_backend"


def _select_factory(orig):
    def select_unquantized_moe_backend(moe_config, *args, **kwargs):
        backend, experts_cls = orig(moe_config, *args, **kwargs)
        if experts_cls is None and getattr(backend, "name", "") == "OOT":
            from vllm.model_executor.layers.fused_moe.oracle.unquantized import (
                UnquantizedMoeBackend,
                backend_to_kernel_cls,
            )

            experts = backend_to_kernel_cls(UnquantizedMoeBackend.TRITON)  # a class up to 0.24, a list from 0.25
            return UnquantizedMoeBackend.TRITON, experts[0] if isinstance(experts, (list, tuple)) else experts
        return backend, experts_cls

    return select_unquantized_moe_backend


def _skip_if() -> str | None:
    from vllm.platforms import current_platform

    if type(current_platform).__module__ != "vllm_platform_ext.platform":
        return f"not needed: the platform is {type(current_platform).__name__}, not this package's MacaPlatform"
    return None


GROUPS: list[PatchGroup] = [
    PatchGroup(
        name=NAME,
        why="the OOT unquantized-MoE backend has no experts under the standalone MacaPlatform "
            "(first MoE forward: 'UnquantizedFusedMoEMethod' object has no attribute 'is_monolithic'): "
            "use vLLM's Triton experts, as on CUDA",
        build=lambda: [Patch(TARGET, _select_factory)],
        targets=(TARGET,),
        skip_if=_skip_if,
        upstream="by design upstream: an OOT platform registers its own MoE op (vLLM-metax does)",
        retire="when MacaPlatform registers a MACA MoE op of its own, or vLLM lets an OOT platform pick "
               "the Triton backend",
    )
]
