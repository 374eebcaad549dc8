"""``vllm-platform-ext doctor MODEL_PATH``: how the installed vLLM will build a checkpoint's target and MTP
layer, against what its tensors are (issue 50: the MTP layer built with a quantization config its weights
do not match, vLLM #47828 / #39475 / #37667).

Nothing is loaded and no engine starts: ``config.json`` and the safetensors *headers* are read (names,
dtypes, shapes), and the line's own code builds the target and the MTP draft on the ``meta`` device
(``EngineArgs.create_engine_config`` with ``method="mtp"``, then ``initialize_model`` for the target's
model config and for the draft's, as the proposer does): the quantization method, its ``dynamic`` rules,
``modules_to_not_convert`` and each model's own guards (0.32's ``qwen3_5_mtp`` drops GPTQ for a ``-:`` MTP
rule) are vLLM's, not restated here. Each layer that has a quant method is then compared with the
checkpoint tensors under its prefix (a fused layer's shards through the model's
``packed_modules_mapping``): built *packed* (``qweight``/``weight_packed``), *fp8* or *float*, against
the tensors' kind. A mismatch on the MTP layer is a warning (``--strict``: exit 1); a bad path, or a
folder that is not a safetensors checkpoint, is an error (exit 2).
"""
from __future__ import annotations

import json
import os
import struct
from collections import Counter
from pathlib import Path

from vllm_platform_ext.verify.meta_init import init_distributed

PACKED = ("qweight", "weight_packed")
MTP_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers", "mtp_num_layers")
ADVICE = ('exclude the MTP layer from quantization in quantization_config (GPTQ: dynamic {"-:.*mtp.*": {}}; '
          "others: its prefix in modules_to_not_convert / ignore), or ship its tensors quantized")


class CheckpointError(ValueError):
    """MODEL_PATH is not a readable safetensors checkpoint."""


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, dict[str, tuple[str, tuple]]]:
    """``(config.json, {tensor: (dtype, shape)})`` from the safetensors headers; no tensor is read."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise CheckpointError(f"{p}: not a directory (MODEL_PATH is a checkpoint folder with config.json and "
                              "*.safetensors)")
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{p}: no config.json (not a Hugging Face checkpoint folder)")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{cfg_file}: not valid JSON ({exc})") from None
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{p}: no *.safetensors files (only safetensors checkpoints are read)")
    tensors: dict[str, tuple[str, tuple]] = {}
    for f in files:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error) as exc:
            raise CheckpointError(f"{f}: not a safetensors file ({type(exc).__name__}: {exc})") from None
        for name, meta in header.items():
            if name != "__metadata__":
                tensors[name] = (meta["dtype"], tuple(meta["shape"]))
    return cfg, tensors


def mtp_layer_count(cfg: dict) -> int:
    text = cfg.get("text_config", cfg)
    return next((int(text[k]) for k in MTP_KEYS if text.get(k)), 0)


def tensor_kind(dtypes: list[tuple[str, str]]) -> str:
    """packed / fp8 / float / none for ``[(tensor name, dtype)]`` of one layer."""
    if not dtypes:
        return "none"
    if any(n.rsplit(".", 1)[-1] in PACKED for n, _ in dtypes):
        return "packed"
    weights = [d for n, d in dtypes if n.endswith("weight")]
    if any(d.startswith("F8") for d in weights):
        return "fp8"
    return "float"


def module_kind(module) -> str:
    names = [n for n, _ in module.named_parameters(recurse=False)]
    if any(any(k in n for k in PACKED) for n in names):
        return "packed"
    if any("float8" in str(p.dtype) for n, p in module.named_parameters(recurse=False) if "weight" in n):
        return "fp8"
    return "float" if names else "none"


def layer_tensors(prefix: str, tensors: dict, packed_mapping: dict) -> list[tuple[str, str]]:
    """The checkpoint tensors of the layer vLLM builds at ``prefix`` (a fused layer's shards included)."""
    head, _, leaf = prefix.rpartition(".")
    roots = [prefix] + [f"{head}.{s}" if head else s for s in packed_mapping.get(leaf, [])]
    return sorted((n, d) for n, (d, _) in tensors.items() if any(n.startswith(r + ".") for r in roots))


def build_on_meta(path: str, mtp: bool):
    """``(vllm_config, target model, draft model or None, why no draft)``, built by vLLM on ``meta``."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model

    spec = {"method": "mtp", "num_speculative_tokens": 1} if mtp else None
    vc = EngineArgs(model=path, speculative_config=spec, enforce_eager=True, max_model_len=256,
                    max_num_batched_tokens=256).create_engine_config()
    init_distributed(vc)
    with set_current_vllm_config(vc), torch.device("meta"):
        target = initialize_model(vllm_config=vc, model_config=vc.model_config)
    draft, why = None, "" if mtp else "no MTP layer in this checkpoint's config"
    if mtp:
        dc = vc.speculative_config.draft_model_config
        try:
            with set_current_vllm_config(vc), torch.device("meta"):
                draft = initialize_model(vllm_config=vc, model_config=dc)
        except Exception as exc:  # vLLM cannot build it: that is the finding
            why = f"vLLM cannot build the MTP layer ({dc.architectures}): {type(exc).__name__}: {exc}"
    return vc, target, draft, why


def _layers(model, tensors: dict) -> list[dict]:
    mapping = dict(getattr(model, "packed_modules_mapping", {}) or {})
    rows = []
    for _, mod in model.named_modules():
        method = getattr(mod, "quant_method", None)
        prefix = getattr(mod, "prefix", None) or getattr(mod, "layer_name", None)
        if method is None or not isinstance(prefix, str) or not list(mod.parameters(recurse=False)):
            continue
        found = layer_tensors(prefix, tensors, mapping)
        rows.append({"prefix": prefix, "method": type(method).__name__, "built": module_kind(mod),
                     "tensors": tensor_kind(found), "dtypes": sorted({d for _, d in found})})
    return rows


def inc_mtp_rules(qc: dict) -> list[str]:
    """What an AutoRound native config (vLLM's INC) says of the MTP layer: its ``block_name_to_quantize``
    entries and the ``extra_config`` keys that name it (with their bits)."""
    blocks = qc.get("block_name_to_quantize") or []
    blocks = blocks.split(",") if isinstance(blocks, str) else blocks
    out = [f"block_name_to_quantize: {b.strip()}" for b in blocks if "mtp" in str(b)]
    extra = qc.get("extra_config") or {}
    return out + [f"extra_config: {k} bits={v.get('bits', qc.get('bits'))}" for k, v in extra.items()
                  if "mtp" in str(k) and isinstance(v, dict)]


def diagnose(path: str | os.PathLike) -> dict:
    """What :mod:`this module <vllm_platform_ext.verify.checkpoint_doctor>` reports, as a dict."""
    cfg, tensors = read_checkpoint(path)
    path = str(Path(path).resolve())
    import vllm

    qc = cfg.get("quantization_config") or cfg.get("text_config", {}).get("quantization_config") or {}
    n_mtp = mtp_layer_count(cfg)
    mtp_tensors = {n: d for n, (d, _) in tensors.items() if n.startswith("mtp.")}
    vc, target, draft, why = build_on_meta(path, n_mtp > 0)
    out = {"checkpoint": path, "vllm": vllm.__version__, "quant_method": qc.get("quant_method"),
           "vllm_quantization": vc.model_config.quantization,
           "quant_config_class": type(vc.quant_config).__name__ if vc.quant_config is not None else None,
           "mtp_layers": n_mtp, "mtp_tensor_dtypes": dict(Counter(mtp_tensors.values())), "warnings": []}
    rule_keys = sorted(k for k in (qc.get("dynamic") or {}) if "mtp" in k)
    out["mtp_rules"] = rule_keys + [f"modules_to_not_convert: {m}" for m in qc.get("modules_to_not_convert") or []
                                    if "mtp" in str(m)] + inc_mtp_rules(qc)
    for role, model in (("target", target), ("mtp", draft)):
        if model is None:
            continue
        rows = _layers(model, tensors)
        if role == "target":
            rows = [r for r in rows if not r["prefix"].startswith("mtp.")]
        out[role] = {"class": type(model).__name__, "methods": dict(Counter(r["method"] for r in rows)),
                     "mismatches": [r for r in rows if r["built"] != r["tensors"]]}
        if role == "mtp":
            out[role]["layers"] = rows
    if why and n_mtp:
        out["warnings"].append(why)
    for role in ("target", "mtp"):
        groups: dict = {}
        for r in out.get(role, {}).get("mismatches", []):
            groups.setdefault((r["method"], r["built"], r["tensors"], tuple(r["dtypes"])), []).append(r["prefix"])
        for (method, built, kind, dtypes), prefixes in groups.items():
            have = "no tensors" if kind == "none" else f"{kind} tensors ({', '.join(dtypes)})"
            out["warnings"].append(
                f"{'MTP layer' if role == 'mtp' else 'target'}: {', '.join(prefixes)} built with {method} ({built} "
                f"parameters), but the checkpoint has {have} for them: vLLM stops at load or leaves them "
                "uninitialised (vLLM #47828, #39475, #37667)" + (f"; {ADVICE}" if role == "mtp" else ""))
    return out


def format_report(d: dict) -> str:
    lines = [f"== checkpoint {d['checkpoint']} (vLLM {d['vllm']})",
             f"  quantization: checkpoint {d['quant_method'] or 'none'} -> vLLM {d['vllm_quantization'] or 'none'}"
             + (f" ({d['quant_config_class']})" if d["quant_config_class"] else "")]
    if "target" in d:
        t = d["target"]
        lines.append(f"  target {t['class']}: " + ", ".join(f"{k} x{v}" for k, v in sorted(t["methods"].items())))
    if d["mtp_layers"]:
        lines.append(f"  MTP: {d['mtp_layers']} layer(s); mtp.* tensors: "
                     + (", ".join(f"{v} {k}" for k, v in sorted(d["mtp_tensor_dtypes"].items())) or "none")
                     + f"; MTP rules in the config: {', '.join(d['mtp_rules']) or 'none'}")
        if "mtp" in d:
            m = d["mtp"]
            lines.append(f"  MTP draft {m['class']}: " + ", ".join(f"{k} x{v}" for k, v in sorted(m["methods"].items())))
            for r in m["layers"]:
                lines.append(f"    {r['prefix']}: {r['method']} ({r['built']}) <- {r['tensors']} "
                             f"{'/'.join(r['dtypes'])}")
    else:
        lines.append("  MTP: none (no MTP layer count in config.json)")
    lines += [f"  WARNING: {w}" for w in d["warnings"]] or ["  ok: every layer is built as its tensors are"]
    return "\n".join(lines)


def main(path: str, strict: bool = False, as_json: bool = False, serve_args: list[str] | None = None) -> int:
    """``serve_args`` (``--serve-args``): also the prefix-caching settings check (verify/align_settings.py)."""
    import sys

    # the report, not vLLM's start-up log; the caller's environment is left as it was (an in-process
    # call must not turn later engines' INFO logs off: CI 2026-12-06, the serve tests' log checks)
    had = os.environ.get("VLLM_LOGGING_LEVEL")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        d = diagnose(path)
        if serve_args is not None:
            from vllm_platform_ext.verify import align_settings

            d["serving"] = align_settings.check(path, serve_args)
    except (CheckpointError, ValueError) as exc:
        print(f"vllm-platform-ext doctor: {exc}", file=sys.stderr)
        return 2
    finally:
        if had is None:
            os.environ.pop("VLLM_LOGGING_LEVEL", None)
    if as_json:
        print(json.dumps(d, indent=2))
    else:
        print(format_report(d))
        if "serving" in d:
            from vllm_platform_ext.verify import align_settings

            print(align_settings.format_report(d["serving"]))
    return 1 if strict and (d["warnings"] or d.get("serving", {}).get("warnings")) else 0


if __name__ == "__main__":  # several checkpoints in one process (tests): a JSON list of diagnose()
    import sys

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    print("RESULT " + json.dumps([diagnose(p) for p in sys.argv[1:]]))
