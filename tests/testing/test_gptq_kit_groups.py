"""testing/gptq_groups.py: one base group for the three GPTQ kits (no quantizer, no engine).

Each value is what the kit's own branch used for it, and what its checkpoints were measured with: the dense
cpu-dims ``qwen3_5_text`` kit 64 (its hidden size; test_gptq_kit), the dense gpu-dims ``qwen3_5`` kit 128 (every
quantized input a multiple of 128; test_gptq_multimodal), the gpu-dims ``qwen3_5_moe`` kit 32 (vLLM gives a
FusedMoE one group and checks the base group against moe_intermediate_size 32; test_gptq_moe_kit).
"""
from __future__ import annotations

import pytest

from vllm_platform_ext.testing import gptq_groups, gptq_kit
from vllm_platform_ext.testing.tiny_models import CONDITIONAL, conditional_config, config_dict

KITS = [("qwen3_5_text", "cpu", 64), ("qwen3_5", "gpu", 128), ("qwen3_5_moe", "gpu", 32)]


def _config(kind: str, dims: str) -> dict:
    """The kit's config.json as make_tiny_model writes it."""
    text = config_dict(kind, dims=dims)
    return conditional_config(kind, text) if kind in CONDITIONAL else text


def _linears(kind: str, dims: str) -> list:
    """(name, (out, in)) of the kit's text model's nn.Linears, as AutoRound sees them (meta tensors)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    text = config_dict(kind, dims=dims)
    cfg = AutoConfig.for_model(**text)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return list(gptq_groups._linears(model))


@pytest.mark.parametrize("kind,dims,want", KITS)
def test_base_group_of_each_kit(kind, dims, want):
    cfg = _config(kind, dims)
    assert gptq_kit.base_group(cfg) == want
    assert gptq_kit.base_group(cfg.get("text_config", cfg)) == want  # the text form AutoRound quantizes
    linears = _linears(kind, dims)
    ins = [i for _, (o, i) in linears if not (o % gptq_groups.MIN_OUT or i % gptq_groups.MIN_OUT)]
    assert ins and gptq_kit.base_group(cfg, ins) == want  # _autoround's call: the quantized inputs too
    for name, (o, i) in linears:
        g = gptq_kit.group_for(i, name, want)
        assert i % g == 0, (name, i, g)  # every quantized layer's group divides its input
        if name.rsplit(".", 1)[-1] in gptq_groups.FUSED or ".experts." in name:
            assert g == want, name  # vLLM fuses it: dynamic rules cannot reach it, it takes the base group


def test_base_group_refuses_sizes_no_group_divides():
    with pytest.raises(ValueError, match="no group of"):
        gptq_kit.base_group({"hidden_size": 48})
    with pytest.raises(ValueError, match="no group of"):
        gptq_kit.base_group({"hidden_size": 128, "num_experts": 4, "moe_intermediate_size": 16})
    assert gptq_kit.base_group({"hidden_size": 128}, [192]) == 64  # a 192-input layer takes the base group
