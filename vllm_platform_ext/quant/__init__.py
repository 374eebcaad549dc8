"""Hardened quantization handling: patch groups on vLLM's quantization classes (and the ones a
platform plugin such as vLLM-metax registers), applied with the other patch groups. Nothing is
registered in vLLM's quantization registry.

* :mod:`.moe_wna16`: the ``moe_wna16`` MoE method's kernel call and ``disable_inplace`` drift;
* :mod:`.mtp_layer`: the MTP layer's quantization config;
* :mod:`.inc_layer`: INC/AutoRound ``extra_config`` entries.
"""
from __future__ import annotations

from vllm_platform_ext.patching import PatchGroup


def groups() -> list[PatchGroup]:
    from vllm_platform_ext.quant import inc_layer, moe_wna16, mtp_layer

    return [*moe_wna16.GROUPS, *mtp_layer.GROUPS, *inc_layer.GROUPS]
