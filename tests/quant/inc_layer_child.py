"""Cases of ``test_quant_mtp_layer.py``'s child (``mtp_layer_child.py`` runs :func:`cases` on its line; run alone,
this file does the same): one vLLM line's REAL INC config (``INCConfig``, what
``quant_method "auto-round"`` becomes), its real ``configure_quant_config`` and its real Qwen3.5 model
classes, asked which method each layer of an AutoRound native checkpoint gets -- with
``quant.inc_extra_config`` off, then on. Prints ``JSON{...}``.

The quantization configs are AutoRound 0.16.1's native export of the dense kit as it writes them
(testing/autoround_native.py; text form, and the multimodal form's names of Intel's Qwen3.5 releases):
the MTP layer quantized (``mtp.layers`` in ``block_name_to_quantize``, ``mtp.fc`` at 16 bits) or bf16
(``ignore_layers="mtp"``: ``.*mtp.*`` at 16 bits). As in the engine, the target's class maps the config
first and the draft (``Qwen3_5MTP``) then maps the same object (the proposer's ``VllmConfig`` is a
``replace`` of the target's: one quant config).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mtp_layer_child import linear_layer, moe_layer  # noqa: E402

BASE = {"quant_method": "auto-round", "packing_format": "auto_round:auto_gptq", "bits": 4, "group_size": 64,
        "sym": True, "data_type": "int", "autoround_version": "0.16.1"}
FORMS = {"text": ("model.layers", "model.layers"),  # (checkpoint block, vLLM's target prefix)
         "multimodal": ("model.language_model.layers", "language_model.model.layers")}


def native_config(form: str, mtp: str) -> dict:
    block, _ = FORMS[form]
    extra = {f"{block}.0.mlp.down_proj": {"group_size": 128},  # a partial entry: only what differs
             f"{block}.0.linear_attn.in_proj_a": {"bits": 16, "data_type": "fp"},
             "mtp.fc": {"bits": 16, "data_type": "fp"}}
    blocks = [block, "mtp.layers"] if mtp == "quantized" else block
    if mtp == "bf16":
        extra[".*mtp.*"] = {"bits": 16, "data_type": "float"}
        extra.update({f"mtp.layers.0.{m}": {"bits": 16, "data_type": "fp"}
                      for m in ("self_attn.o_proj", "mlp.down_proj")})
    return dict(BASE, block_name_to_quantize=blocks, extra_config=extra)


QUANT_PATHS = ("apply_gptq_quant_layer", "apply_awq_quant_layer", "apply_ipex_quant_layer", "get_linear_method",
               "get_moe_method")  # INC's quantized-layer builders (0.22/0.23 methods; 0.24+ schemes)


def method(config, layer, prefix) -> str:
    """quantized / unquantized, as the line's INC builds ``layer``. Without a GPU a line's quantized builder may
    refuse the kernel (0.22: "supported with Marlin kernels"): the layer took the quantized path all the same."""
    try:
        built = config.get_quant_method(layer, prefix)
    except Exception as exc:
        tb, names = exc.__traceback__, []
        while tb is not None:
            names.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        if any(n in QUANT_PATHS for n in names):
            return "quantized"
        return f"error {type(exc).__name__}: {str(exc)[:200]} ({' > '.join(names[-4:])})"
    name = type(built).__name__ if built is not None else "None"
    return "unquantized" if name.startswith("Unquantized") or name == "None" else "quantized"


def cases() -> dict:
    from vllm.model_executor.layers.quantization.inc import INCConfig
    from vllm.model_executor.model_loader.utils import configure_quant_config
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration
    from vllm.model_executor.models.qwen3_5_mtp import Qwen3_5MTP

    classes = {"text": Qwen3_5ForCausalLM, "multimodal": Qwen3_5ForConditionalGeneration}
    out = {}
    for form, (_, tgt) in FORMS.items():
        for mtp in ("quantized", "bf16"):
            cfg = INCConfig.from_config(native_config(form, mtp))
            configure_quant_config(cfg, classes[form])
            row = {"target_partial": method(cfg, linear_layer(), f"{tgt}.0.mlp.down_proj"),
                   "target_plain": method(cfg, linear_layer(), f"{tgt}.1.mlp.down_proj"),
                   "target_bf16": method(cfg, linear_layer(), f"{tgt}.0.linear_attn.in_proj_a")}
            configure_quant_config(cfg, Qwen3_5MTP)  # the draft, on the same (already mapped) object
            row.update(blocks=list(cfg.block_name_to_quantize or []),
                       mtp_linear=method(cfg, linear_layer(), "mtp.layers.0.self_attn.o_proj"),
                       mtp_fc=method(cfg, linear_layer(), "mtp.fc"),
                       mtp_moe_bits=cfg.get_layer_config(moe_layer(128), "mtp.layers.0.mlp.experts")[0])
            out[f"{form}/{mtp}"] = row
    # INC's fused-MoE aggregation of per-expert entries (experts at 8 bits), by the layer's class name
    experts = {f"model.layers.0.mlp.experts.{e}.{p}": {"bits": 8} for e in range(4)
               for p in ("gate_proj", "up_proj", "down_proj")}
    cfg = INCConfig.from_config(dict(BASE, block_name_to_quantize="model.layers", extra_config=experts))
    layer = moe_layer(128)
    out["moe_expert_entries"] = {"class": type(layer).__name__,
                                 "bits": cfg.get_layer_config(layer, "model.layers.0.mlp.experts")[0]}
    return out


def main() -> dict:
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # our bootstrap; the groups named in VLLM_PLATFORM_EXT_DISABLE stay off
    import vllm
    from vllm_platform_ext import patching, quant
    from vllm_platform_ext.quant import inc_layer
    from vllm_platform_ext.report import Report

    res = {"vllm": vllm.__version__, "file": vllm.__file__, "off": cases()}
    report = Report()
    os.environ.pop("VLLM_PLATFORM_EXT_DISABLE", None)
    patching.apply_group({g.name: g for g in quant.groups()}[inc_layer.NAME], report)
    res["groups"] = {e.name: [e.status.value, e.detail[:300]] for e in report.entries}
    res["on"] = cases()
    return res


if __name__ == "__main__":
    print("JSON" + json.dumps(main()))
    sys.stdout.flush()
