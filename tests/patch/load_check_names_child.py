"""Child of tests/patch/test_load_check.py::test_loaded_names_and_g_idx_on_each_lines_code: run under a vLLM
line's own Python (conftest.run_line_child). Prints ``JSON {...}``: what the line's REAL ``MoERunner.load_weights``
returns for its ``routed_experts``' names and what the plugin's rule makes of them; whether the line's GPTQ/INC
linear builds ``g_idx`` and reads it only with act order, and the plugin's exemption on that line's classes."""
import dataclasses
import inspect
import json
import sys
import types

import torch
from torch import nn

import vllm
from vllm_platform_ext.patch import load_check

out = {"file": vllm.__file__, "vllm": vllm.__version__}

# --- MoE: the runner's names (0.25+ have MoERunner with a routed_experts child) ---
try:
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
except ImportError:
    MoERunner = None
if getattr(MoERunner, "load_weights", None) is None:  # before 0.25: no runner, or no routed_experts child
    out["moe"] = None
else:
    class _Routed:
        def load_weights(self, weights):
            for _name, _t in weights:
                yield "w13_weight"  # RoutedExperts.load_weights yields names relative to itself

    names = list(MoERunner.load_weights(types.SimpleNamespace(routed_experts=_Routed()), [("w1", None)]))
    model = nn.Module()
    model.experts = nn.Module()
    model.experts.routed_experts = nn.Module()
    model.experts.routed_experts.w13_weight = nn.Parameter(torch.empty(2, 2))
    loaded = {f"experts.{n}" for n in names}  # AutoWeightsLoader qualifies them with the runner's prefix
    out["moe"] = {"names": names, "ours": load_check.unreached(model, loaded)[0],
                  "without_resolution": sorted(p for p, _ in model.named_parameters() if p not in loaded)}

# --- g_idx: GPTQ / INC linears ---
import importlib

mpk = importlib.import_module("vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel")
from vllm.model_executor.layers.quantization import auto_gptq

fields = {f.name for f in dataclasses.fields(mpk.MPLinearLayerConfig)}
create = inspect.getsource(auto_gptq.AutoGPTQLinearMethod.create_weights)
res = {"has_g_idx_field": "has_g_idx" in fields, "builds_g_idx": 'register_parameter("g_idx"' in create}
if res["has_g_idx_field"]:
    res["kernel_from_desc_act"] = "has_g_idx=self.quant_config.desc_act" in create and "self.kernel = " in create
    res["kernel_keeps_config"] = "self.config = c" in inspect.getsource(mpk.MPLinearKernel.__init__)
    base = {f: None for f in fields}
    methods = {}
    for act_order in (False, True):
        cfg = mpk.MPLinearLayerConfig(**{**base, "has_g_idx": act_order})
        gptq = object.__new__(auto_gptq.AutoGPTQLinearMethod)
        gptq.kernel = types.SimpleNamespace(config=cfg)
        methods[f"gptq-{act_order}"] = gptq
        try:
            from vllm.model_executor.layers.quantization.inc.inc_linear import INCLinearMethod
            from vllm.model_executor.layers.quantization.inc.schemes import inc_wna16_linear as wna16
        except ImportError:
            continue
        scheme = object.__new__(wna16.INCWNA16LinearScheme)
        init = inspect.getsource(wna16.INCWNA16LinearScheme.__init__)
        inner = "linear_method" if "self.linear_method = " in init else "inner_method"  # 0.29: linear_method
        setattr(scheme, inner, gptq)
        res["inc_scheme_inner"] = f"self.{inner} = " in init
        res["inc_inner_desc_act_false"] = "desc_act=False" in inspect.getsource(wna16.INCWNA16LinearScheme)
        methods[f"inc-{act_order}"] = INCLinearMethod(scheme)  # the real constructor keeps .scheme
    for key, method in methods.items():
        model = nn.Module()
        model.lin = nn.Module()
        model.lin.g_idx = nn.Parameter(torch.empty(4, dtype=torch.int32), requires_grad=False)
        model.lin.quant_method = method
        res[key] = load_check.unreached(model, set())
out["g_idx"] = res
print("JSON" + json.dumps(out))
sys.stdout.flush()
