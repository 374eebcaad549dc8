"""vLLM patch groups by concern: the code paths of vLLM this plugin routes to its ops.

Kept apart from the kernels (``vllm_platform_ext.ops``), which import without vLLM. Each module
declares ``GROUPS`` (each group with its probe, its why / upstream / retire record); the
TurboQuant groups live in their own wing, :mod:`vllm_platform_ext.patch.turboquant`.
:func:`groups` is the one list the bootstrap applies, in order; ``patch/README.md`` is generated
from it (``python ci/tools/patch_ledger.py write``).
"""
from __future__ import annotations

from vllm_platform_ext.patching import PatchGroup


def groups() -> list[PatchGroup]:
    """Every patch group of the plugin, in the order the bootstrap applies them (the quantization
    groups of :mod:`vllm_platform_ext.quant` last)."""
    from vllm_platform_ext import quant
    from vllm_platform_ext.patch import (gdn_cpu, gdn_cuda, guard, load_check, maca_moe, mamba_align_cpu,
                                         mamba_align_split, spec_cpu_dispatch, spec_cpu_sampling, spec_draft_ids,
                                         vllm_env)
    from vllm_platform_ext.patch.turboquant import cache_dtype, reserve_workspace, spec_verify

    return [*vllm_env.GROUPS, *gdn_cpu.GROUPS, *gdn_cuda.GROUPS, *mamba_align_cpu.GROUPS, *mamba_align_split.GROUPS,
            *spec_cpu_dispatch.GROUPS, *spec_cpu_sampling.GROUPS, *spec_draft_ids.GROUPS, *spec_verify.GROUPS, *reserve_workspace.GROUPS, *cache_dtype.GROUPS,
            *maca_moe.GROUPS, *quant.groups(),
            *load_check.GROUPS, *guard.GROUPS]


def group_names() -> list[str]:
    """Every patch-group name ``VLLM_PLATFORM_EXT_DISABLE`` accepts (imports torch, not vLLM)."""
    return [g.name for g in groups()]
