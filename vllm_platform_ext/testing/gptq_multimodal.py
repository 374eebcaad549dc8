"""The GPTQ kit in the multimodal form the CUDA lines load with MTP (issue 50, the GPU part).

vLLM 0.23-0.26 CUDA take Qwen3.5/3.6 MTP only on ``Qwen3_5ForConditionalGeneration`` /
``Qwen3_5MoeForConditionalGeneration`` (``SpeculativeConfig`` rewrites model types ``qwen3_5`` /
``qwen3_5_moe`` to ``qwen3_5_mtp``; ``Qwen3_5ForCausalLM``'s text config is refused). AutoRound's multimodal
path wants a processor the kit does not have, so the kit is quantized through AutoRound's TEXT path and
the checkpoint is then written in the multimodal layout, as releases of Qwen3.5 ship it:

- :func:`text_form`: the multimodal bf16 kit as a ``Qwen3_5ForCausalLM`` checkpoint (``model.language_model.X``
  -> ``model.X``; the ``text_config`` with the text architecture), which AutoRound quantizes as any text model;
- :func:`to_multimodal`: its GPTQ export back in the multimodal layout: ``model.X`` -> ``model.language_model.X``
  (``lm_head.*`` and ``mtp.*`` unchanged: vLLM's ``Qwen3_5MTP`` reads ``mtp.*`` and the target's mapper
  ``lm_head.`` -> ``language_model.lm_head.``), the multimodal ``config.json`` of the bf16 kit with the
  ``quantization_config``, whose full module names (``modules_in_block_to_quantize``, ``block_name_to_quantize``)
  get the multimodal prefix (vLLM maps them with the model's ``hf_to_vllm_mapper``); ``dynamic``'s regexes
  stay as AutoRound writes them (``.*model\\.layers\\.0\\.mlp\\.down_proj.*``): GPTQ matches them against vLLM's
  module names (``language_model.model.layers.0.mlp.down_proj``), which they match with either layout.

The same path serves the MoE kit (``qwen3_5_moe``, testing/gptq_moe.py): its experts are unfused by AutoRound
and written per expert, under the same prefixes.

The kit has no vision tower (neither has the bf16 kit): the engine runs it with ``language_model_only=True``
(testing/engine.py), which builds no tower. tests/testing/test_gptq_multimodal.py proves the result against
the lines' own code (registry, speculative config, GPTQ config, weight names after vLLM's mapping).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

MM_PREFIX = "model.language_model."
TEXT_PREFIX = "model."
TEXT_ARCH = {"qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM"}
# the multimodal kit kinds whose text form AutoRound quantizes (qwen3_5_moe: testing/gptq_moe.py, its experts)
TEXT_KIND = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


class MultimodalFormError(RuntimeError):
    pass


def is_multimodal(ckpt_dir) -> bool:
    """Whether the checkpoint folder ``ckpt_dir`` has the multimodal layout (a ``text_config``)."""
    return "text_config" in json.loads((Path(ckpt_dir) / "config.json").read_text())


def _to_text_name(name: str) -> str:
    if name.startswith(MM_PREFIX):
        return TEXT_PREFIX + name[len(MM_PREFIX):]
    if name.startswith("model."):
        raise MultimodalFormError(f"{name}: a multimodal kit tensor under model.* but not {MM_PREFIX}* "
                                  "(a vision tower?): the text form has no place for it")
    return name


def _to_mm_name(name: str) -> str:
    return MM_PREFIX + name[len(TEXT_PREFIX):] if name.startswith(TEXT_PREFIX) else name


def _copy_tokenizer(src: Path, out: Path) -> None:
    for f in src.iterdir():
        if f.is_file() and f.name.startswith("tokenizer"):
            shutil.copy2(f, out / f.name)


def text_form(mm_dir, out_dir) -> Path:
    """``mm_dir`` (a multimodal bf16 kit: ``text_config``, ``model.language_model.*``) as a text checkpoint."""
    from safetensors.torch import load_file, save_file

    mm_dir, out = Path(mm_dir), Path(out_dir)
    cfg = json.loads((mm_dir / "config.json").read_text())
    text = cfg.get("text_config")
    if not text or text.get("model_type") not in TEXT_ARCH:
        raise MultimodalFormError(f"{mm_dir}/config.json: no text_config of type {tuple(TEXT_ARCH)}")
    out.mkdir(parents=True, exist_ok=True)
    sd = load_file(str(mm_dir / "model.safetensors"))
    save_file({_to_text_name(k): v for k, v in sd.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    text = {**text, "architectures": [TEXT_ARCH[text["model_type"]]], "tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps(text, indent=1, sort_keys=True) + "\n")
    _copy_tokenizer(mm_dir, out)
    return out


def _mm_module(name: str) -> str:
    return _to_mm_name(name) if name.startswith(TEXT_PREFIX + "layers") else name


def multimodal_quant_config(qc: dict) -> dict:
    """AutoRound's GPTQ ``quantization_config`` of the text form, for the multimodal form (see the module)."""
    qc = dict(qc)
    mods = qc.get("modules_in_block_to_quantize")
    if mods:
        qc["modules_in_block_to_quantize"] = [[_mm_module(m) for m in b] if isinstance(b, list) else _mm_module(b)
                                              for b in mods]
    extra = qc.get("extra_config")  # AutoRound's native format: per-layer entries by name (regex keys unchanged)
    if isinstance(extra, dict):
        qc["extra_config"] = {_mm_module(k): v for k, v in extra.items()}
    block = qc.get("block_name_to_quantize")
    if isinstance(block, str):
        qc["block_name_to_quantize"] = ",".join(_mm_module(b) for b in block.split(","))
    elif isinstance(block, list):
        qc["block_name_to_quantize"] = [_mm_module(b) for b in block]
    return qc


def to_multimodal(gptq_text_dir, mm_bf16_dir, out_dir) -> Path:
    """The GPTQ export of :func:`text_form`'s checkpoint, in the layout of the multimodal kit ``mm_bf16_dir``."""
    from safetensors.torch import load_file, save_file

    src, mm, out = Path(gptq_text_dir), Path(mm_bf16_dir), Path(out_dir)
    qc = json.loads((src / "config.json").read_text()).get("quantization_config")
    if not qc:
        raise MultimodalFormError(f"{src}/config.json has no quantization_config")
    cfg = json.loads((mm / "config.json").read_text())
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = sorted(src.glob("*.safetensors"))
    weight_map = {}
    for f in files:
        sd = {_to_mm_name(k): v.contiguous() for k, v in load_file(str(f)).items()}
        save_file(sd, str(out / f.name), metadata={"format": "pt"})
        weight_map.update({k: f.name for k in sd})
    if (src / "model.safetensors.index.json").is_file():
        idx = json.loads((src / "model.safetensors.index.json").read_text())
        idx["weight_map"] = dict(sorted(weight_map.items()))
        (out / "model.safetensors.index.json").write_text(json.dumps(idx, indent=2) + "\n")
    cfg["quantization_config"] = multimodal_quant_config(qc)
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    if (src / "quantization_config.json").is_file():
        (out / "quantization_config.json").write_text(json.dumps(cfg["quantization_config"], indent=2,
                                                                 sort_keys=True) + "\n")
    _copy_tokenizer(mm, out)
    with_mtp = [k for k in weight_map if k.startswith("mtp.")]
    stray = [k for k in weight_map if not k.startswith((MM_PREFIX, "mtp.", "lm_head."))]
    if not with_mtp or stray:
        raise MultimodalFormError(f"{out}: mtp tensors {len(with_mtp)}, tensors outside the multimodal layout "
                                  f"{stray[:4]}")
    return out
