"""Child process of ``test_quant_mtp_layer.py``: one vLLM line's REAL quantization config classes
(the line's Python on ``PYTHONPATH``), asked which method they build for the MTP layer's and the
target's fused-MoE and linear layers -- with ``quant.mtp_layer_config`` off, then on; and, for AutoRound's
native format, ``inc_layer_child.cases()`` with ``quant.inc_extra_config`` off, then on (one interpreter per
line serves both). Prints ``JSON{...}``.

The layers are the line's real ``RoutedExperts``/``FusedMoE`` and ``ReplicatedLinear`` classes,
made without ``__init__`` (which needs a model context) and given the attributes the config code
reads (``moe_config``: the line's own ``FusedMoEConfig``). The checkpoint's quantized-module list is
what the line's ``maybe_update_config`` reads from a real safetensors file (its tensors' dtypes).
With no accelerator the quantized methods' constructors may raise while choosing a kernel; the
choice is then read from the traceback (the quantize-method class whose ``__init__`` raised).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import traceback

DYN = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
       "dynamic": {"-:.*mtp.*": {}}}
PLAIN = {k: v for k, v in DYN.items() if k != "dynamic"}
MTP_MOE, TGT_MOE = "mtp.layers.0.mlp.experts", "model.layers.0.mlp.experts"
RELATIVE = [["self_attn.q_proj"], ["mlp.experts.0.gate_proj", "mlp.experts.0.up_proj", "mlp.experts.0.down_proj"]]
MTP_LIN, TGT_LIN = "mtp.layers.0.self_attn.q_proj", "model.layers.0.self_attn.q_proj"


def checkpoint() -> str:
    """A checkpoint as GPTQ exports ship it: target int4 (qweight int32, scales fp16), MTP bf16."""
    import torch
    from safetensors.torch import save_file

    d = tempfile.mkdtemp(prefix="gptq-mtp-")
    t = {}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        t[f"{TGT_MOE}.0.{proj}.qweight"] = torch.zeros(16, 8, dtype=torch.int32)
        t[f"{TGT_MOE}.0.{proj}.scales"] = torch.zeros(1, 8, dtype=torch.float16)
        t[f"{MTP_MOE}.0.{proj}.weight"] = torch.zeros(8, 8, dtype=torch.bfloat16)
    t[f"{TGT_LIN}.qweight"] = torch.zeros(16, 8, dtype=torch.int32)
    t[f"{TGT_LIN}.scales"] = torch.zeros(1, 8, dtype=torch.float16)
    t[f"{MTP_LIN}.weight"] = torch.zeros(8, 8, dtype=torch.bfloat16)
    save_file(t, os.path.join(d, "model.safetensors"))
    return d


def moe_layer(hidden: int):
    import torch
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.fused_moe import config as C
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    vals = dict(tp_size=1, pcp_size=1, dp_size=1, ep_size=1, tp_rank=0, pcp_rank=0, dp_rank=0, ep_rank=0, sp_size=1,
                use_ep=False, all2all_backend="naive", enable_eplb=False, num_experts=4, experts_per_token=2,
                hidden_dim=hidden, intermediate_size=128, intermediate_size_per_partition=128, num_local_experts=4,
                num_logical_experts=4, activation=MoEActivation.SILU, device="cpu",
                routing_method=C.RoutingMethodType.Renormalize, in_dtype=torch.bfloat16)

    def make(cls, **extra):
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        return cls(**{n: extra.get(n, vals.get(n)) for n in required})

    moe = make(C.FusedMoEConfig, moe_parallel_config=make(C.FusedMoEParallelConfig))
    layer = object.__new__(RoutedExperts)  # the line's class (FusedMoE up to 0.23, RoutedExperts after)
    layer.__dict__.update(moe_config=moe, hidden_size=hidden, intermediate_size_per_partition=128,
                          apply_router_weight_on_input=False, activation=MoEActivation.SILU, global_num_experts=4,
                          local_num_experts=4, num_experts=4, top_k=2, use_ep=False, params_dtype=torch.bfloat16)
    return layer


def linear_layer():
    from vllm.model_executor.layers.linear import ReplicatedLinear

    layer = object.__new__(ReplicatedLinear)
    layer.__dict__.update(input_size=128, output_size=128)
    return layer


def choice(config, layer, prefix) -> str:
    """The quantize-method class the config builds for ``layer`` (or whose constructor raised)."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    try:
        method = config.get_quant_method(layer, prefix)
    except Exception as exc:
        tb = exc.__traceback__
        chosen = None
        while tb is not None:
            me = tb.tb_frame.f_locals.get("self")
            if tb.tb_frame.f_code.co_name == "__init__" and isinstance(me, QuantizeMethodBase):
                chosen = type(me).__name__
                break
            tb = tb.tb_next
        if chosen is None:
            return f"error {type(exc).__name__}: {str(exc)[:200]} | {traceback.format_exc()[-600:]}"
        return chosen
    return type(method).__name__ if method is not None else "None"


def cases(ckpt: str) -> dict:
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
    from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Config

    out = {}
    # 1. GPTQ with the releases' dynamic rule, a MoE layer Marlin cannot take (hidden 64): AutoGPTQ's
    #    fallback to MoeWNA16Config
    cfg = AutoGPTQConfig.from_config(DYN)
    small = moe_layer(64)
    out["gptq_dynamic_fallback"] = {"mtp_moe": choice(cfg, small, MTP_MOE), "target_moe": choice(cfg, small, TGT_MOE)}
    # 2. GPTQ without a rule (the shipped dtypes say it), a Marlin-fitting layer: AutoGPTQ's own MoE path
    cfg = AutoGPTQConfig.from_config(PLAIN)
    cfg.maybe_update_config(ckpt)
    big = moe_layer(128)
    out["gptq_shipped_marlin"] = {"mtp_moe": choice(cfg, big, MTP_MOE), "target_moe": choice(cfg, big, TGT_MOE),
                                  "mtp_linear": choice(cfg, linear_layer(), MTP_LIN),
                                  "target_linear": choice(cfg, linear_layer(), TGT_LIN)}
    # 3. AutoRound's own GPTQ export: a module list of names relative to the block, which match the MTP
    #    layer's modules by substring (vLLM #47828); the shipped dtypes are then not read
    cfg = AutoGPTQConfig.from_config(dict(PLAIN, modules_in_block_to_quantize=RELATIVE))
    cfg.maybe_update_config(ckpt)
    out["gptq_relative_list"] = {"mtp_moe": choice(cfg, big, MTP_MOE), "target_moe": choice(cfg, big, TGT_MOE),
                                 "mtp_linear": choice(cfg, linear_layer(), MTP_LIN),
                                 "target_linear": choice(cfg, linear_layer(), TGT_LIN)}
    # 3a. AutoRound's own rules: one negative rule per excluded linear (its to_standard_regex), here the MTP
    #     experts' -- never matching the fused layer's own name (the dtypes not read: the rules alone decide)
    import re

    per_linear = {f"-:.*{re.escape(f'{MTP_MOE}.{e}.{p}')}.*": {} for e in range(4)
                  for p in ("gate_proj", "up_proj", "down_proj")}
    cfg = AutoGPTQConfig.from_config(dict(PLAIN, dynamic=per_linear))
    out["gptq_autoround_rules"] = {"mtp_moe": choice(cfg, big, MTP_MOE), "target_moe": choice(cfg, big, TGT_MOE)}
    # 3b. the same checkpoint behind a model whose weights mapper renames mtp.* (vLLM's names differ from
    #     the checkpoint's): the shipped dtypes follow the names the layers get (with AutoRound's list, which
    #     matches every name, only the dtypes can tell)
    from vllm.model_executor.models.utils import WeightsMapper

    cfg = AutoGPTQConfig.from_config(dict(PLAIN, modules_in_block_to_quantize=RELATIVE))
    cfg.maybe_update_config(ckpt)
    cfg.apply_vllm_mapper(WeightsMapper(orig_to_new_prefix={"mtp.": "draft."}))
    out["gptq_mapped_names"] = {"mtp_moe": choice(cfg, big, MTP_MOE.replace("mtp.", "draft.")),
                                "target_moe": choice(cfg, big, TGT_MOE)}
    # 4. explicit quantization="moe_wna16" on the GPTQ checkpoint, with and without the rule
    for name, raw in (("moe_wna16_dynamic", DYN), ("moe_wna16_shipped", PLAIN)):
        cfg = MoeWNA16Config.from_config(dict(raw))
        cfg.maybe_update_config(ckpt)
        out[name] = {"mtp_moe": choice(cfg, big, MTP_MOE), "target_moe": choice(cfg, big, TGT_MOE),
                     "mtp_linear": choice(cfg, linear_layer(), MTP_LIN),
                     "target_linear": choice(cfg, linear_layer(), TGT_LIN)}
    return out


UNSET = "not passed"


def kernel_call(applicable: bool) -> dict:
    """vLLM's MoeWNA16Method (what every path builds: the registry name, AutoGPTQ's fallback, INC, a plugin's
    config) calling a kernel object: does each call carry ``inplace``? Kernels: an older API whose
    ``apply`` / ``apply_monolithic`` take it, and the line's own ``FusedMoEKernel`` class (its real
    signature; its call recorded on the instance). Where the line's method has no kernel object, whether
    its class mentions one at all (the retired registry subclass acted only on a set ``moe_kernel``)."""
    import inspect

    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Config, MoeWNA16Method

    served = get_quantization_config("moe_wna16") is MoeWNA16Config
    if not applicable:
        return {"applicable": False, "served_vllms_own": served,
                "class_mentions_moe_kernel": "moe_kernel" in inspect.getsource(MoeWNA16Method),
                "own_select_gemm_impl": "select_gemm_impl" in vars(MoeWNA16Method)}
    import torch
    from types import SimpleNamespace
    from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEKernel

    seen = {}

    class LegacyKernel:  # an older fused-experts API: apply / apply_monolithic take inplace
        is_monolithic = False

        def apply(self, hidden_states, *args, inplace=UNSET, **kwargs):
            seen["legacy"] = inplace
            return hidden_states

    class LegacyMonolithic:
        is_monolithic = True

        def apply_monolithic(self, hidden_states, *args, inplace=UNSET, **kwargs):
            seen["legacy_monolithic"] = inplace
            return hidden_states

    class LineKernel(FusedMoEKernel):  # the line's class, its apply signature as shipped
        is_monolithic = False

        def __init__(self):
            pass

    def real_apply(hidden_states, *args, **kwargs):
        seen["real"] = kwargs.get("inplace", UNSET)
        return hidden_states

    line_kernel = LineKernel()
    line_kernel.apply = real_apply  # the call lands here; KernelCallAdapter reads the class's signature
    layer = SimpleNamespace(w13_weight=None, w2_weight=None, activation=None, global_num_experts=4, expert_map=None,
                            apply_router_weight_on_input=False, num_expert_group=None, topk_group=None,
                            e_score_correction_bias=None, routed_scaling_factor=1.0, routing_sink=None)
    x = torch.ones(1, 4)
    adapted = {}
    for name, kernel in (("legacy", LegacyKernel()), ("legacy_monolithic", LegacyMonolithic()), ("real", line_kernel)):
        method = object.__new__(MoeWNA16Method)
        method.__dict__.update(moe=moe_layer(128).moe_config, moe_kernel=kernel)
        if kernel.is_monolithic:
            method.apply_monolithic(layer, x, torch.ones(1, 4))
        else:
            method.apply(layer, x, torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.int32), None, None)
        adapted[name] = type(method.moe_kernel).__name__ == "KernelCallAdapter"
    return {"applicable": True, "served_vllms_own": served, "adapted": adapted, "inplace": seen,
            "real_takes_inplace": "inplace" in inspect.signature(FusedMoEKernel.apply).parameters,
            "real_monolithic_takes_inplace": "inplace" in inspect.signature(FusedMoEKernel.apply_monolithic).parameters}


def main() -> dict:
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # our bootstrap (compat; the groups named in VLLM_PLATFORM_EXT_DISABLE stay off)
    import vllm
    from vllm_platform_ext import patching, quant
    from vllm_platform_ext.quant import inc_layer, moe_wna16, mtp_layer
    from vllm_platform_ext.report import Report

    groups = {g.name: g for g in quant.groups()}
    ckpt = checkpoint()
    import inspect

    from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Method

    applicable = "self.moe_kernel" in inspect.getsource(MoeWNA16Method.apply)  # the line's own apply
    import inc_layer_child  # AutoRound's native format (vLLM's INC) on the same line, in the same process

    res = {"vllm": vllm.__version__, "file": vllm.__file__, "off": cases(ckpt), "kernel_off": kernel_call(applicable),
           "inc_off": inc_layer_child.cases()}
    report = Report()
    os.environ.pop("VLLM_PLATFORM_EXT_DISABLE", None)
    for name in (mtp_layer.NAME, moe_wna16.KERNEL_CALL_GROUP, inc_layer.NAME):
        patching.apply_group(groups[name], report)
    res["groups"] = {e.name: [e.status.value, e.detail[:300]] for e in report.entries}
    res["on"] = cases(ckpt)
    res["kernel_on"] = kernel_call(applicable)
    res["inc_on"] = inc_layer_child.cases()
    return res


if __name__ == "__main__":
    print("JSON" + json.dumps(main()))
    sys.stdout.flush()
