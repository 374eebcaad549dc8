"""vLLM wiring: the patch groups that route vLLM's code paths to the ops of this plugin.

Kept apart from the kernels (``vllm_platform_ext.ops``), which import without vLLM. Each
module declares ``GROUPS``; this is the one list bootstrap applies, in order.
"""
from __future__ import annotations

from vllm_platform_ext.patching import PatchGroup


def groups() -> list[PatchGroup]:
    from vllm_platform_ext.wiring import (gdn_cpu, gdn_cuda, maca_moe, mamba_align_cpu, turboquant,
                                          turboquant_cache_dtype, turboquant_workspace, vllm_env)

    return [*vllm_env.GROUPS, *gdn_cpu.GROUPS, *gdn_cuda.GROUPS, *mamba_align_cpu.GROUPS, *turboquant.GROUPS,
            *turboquant_workspace.GROUPS, *turboquant_cache_dtype.GROUPS, *maca_moe.GROUPS]
