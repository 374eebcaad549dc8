"""GPTQ int4 checkpoints of the recall kit, made by AutoRound, and their dequantized float32 twin (issue 50).

:func:`make_gptq_kit` quantizes a committed recall-kit checkpoint (:func:`tiny_models.make_tiny_model`,
``target="recall"``) with AutoRound (pinned: :data:`AUTO_ROUND_VERSION`) and AutoRound's own GPTQ export
(``format="auto_gptq"``: ``quant_method "gptq"``, sym, ``desc_act`` off, the v1 zero-point convention
``qzeros = zero - 1``). Offline: the calibration data are the kit's own recall sequences
(:func:`kit_train.recall_sequence`, seed :data:`CALIB_SEED`), never a hub dataset; ``iters=0`` is AutoRound's
RTN (its "optimized RTN" by default), deterministic.

Group plan (``group_size`` per layer, the base group, which layers stay bf16): testing/gptq_groups.py.
A multimodal kit (``qwen3_5``, ``qwen3_5_moe``): AutoRound quantizes its text form, the checkpoint is written
in the kit's multimodal form (testing/gptq_multimodal.py; the MoE's experts: testing/gptq_moe.py).

The MTP layer, two ways (``mtp``):

- ``"bf16"``: as releases keep it. transformers' Qwen3.5 class has no MTP module, so AutoRound's export
  copies the ``mtp.*`` tensors unchanged (its ``copy_missing_tensors_from_source``); its GPTQ config
  then says nothing about them, and its ``modules_in_block_to_quantize`` (``self_attn.q_proj``, ...)
  matches the MTP layer's modules by substring, so vLLM builds them quantized and the load fails
  (vLLM #47828's failure). ``exclusion=True`` adds the releases' rule, ``dynamic["-:.*mtp.*"] = {}``.
- ``"quantized"``: the MTP decoder layer's linears quantized by AutoRound's own RTN packer for tensors
  outside the transformers graph (``model_free_utils.quantize_weight_rtn``, what AutoRound's own format
  does with MTP layers), in the same GPTQ packing and group plan; ``mtp.fc`` stays bf16 as AutoRound
  leaves it (its ``BLOCK_NAME_TO_IGNORE``).

:func:`dequantize` is the float reference of one packed layer: ``scales[g] * (q - (qzeros[g] + 1))``,
exact in float32 (an fp16 scale times a 4-bit integer); :func:`write_dequantized` writes the bf16 kit's
layout with every quantized weight replaced by it, in float32, so that the audit's float32 transformers
reference judges the engine, not the quantization error.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

from vllm_platform_ext.testing.gptq_groups import (  # noqa: F401  (re-exported: gptq_kit.X as before)
    FUSED, GROUP, GROUPS, MIN_OUT, SMALL_GROUP, _linears, base_group, group_for, layer_plan)

AUTO_ROUND_VERSION = "0.16.1"
BITS = 4
CALIB_SEED = 50  # the calibration sequences' seed (the audit's prompts use 0)
CALIB_SAMPLES = 8
CALIB_SEQLEN = 64
MTP_MODES = ("bf16", "quantized")
MTP_EXCLUSION = "-:.*mtp.*"  # the rule GPTQ releases of Qwen3.5/3.6 ship for a bf16 MTP layer
PACKING = "auto_round:auto_gptq"  # AutoRound's name for GPTQ's packing (qzeros store zero - 1)


class GptqKitError(RuntimeError):
    pass


def calibration_data(n: int = CALIB_SAMPLES, length: int = CALIB_SEQLEN, seed: int = CALIB_SEED) -> list:
    """AutoRound's ``dataset``: the kit's recall sequences, one ``{"input_ids": [1, length]}`` each.
    ``attention_mask`` is None on purpose: AutoRound caches the first block's inputs for every block, and
    a hybrid model's first block (GDN) gets the 2-D long mask, which the full-attention block's SDPA
    rejects ("Expected attn_mask dtype to be bool or float"); None gives SDPA its causal path."""
    import torch

    from vllm_platform_ext.testing.kit_train import recall_sequence

    r = random.Random(seed)
    return [{"input_ids": torch.tensor([recall_sequence(r, length)[0]]), "attention_mask": None} for _ in range(n)]


def _autoround(src: Path, out: Path, iters: int, log=None, fmt: str = "auto_gptq", ignore_layers: str = "") -> Path:
    """AutoRound on the bf16 kit ``src`` into ``out``: ``fmt`` its export format (``auto_gptq``; ``auto_round``,
    its native format: testing/autoround_native.py), ``ignore_layers`` its option of that name."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import auto_round
        from auto_round import AutoRound
    except ImportError as exc:
        raise GptqKitError(f"auto-round=={AUTO_ROUND_VERSION} is not importable ({exc}); ci/setup.sh installs it "
                           "into .qdeps") from None
    if auto_round.__version__ != AUTO_ROUND_VERSION:
        raise GptqKitError(f"auto-round {auto_round.__version__}, expected {AUTO_ROUND_VERSION}")
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(str(src))
    base = base_group(json.loads((src / "config.json").read_text()), [i for _, (o, i) in _linears(model)
                                                                     if not (o % MIN_OUT or i % MIN_OUT)])
    ar = AutoRound(model, tok, bits=BITS, group_size=base, sym=True, iters=iters,
                   nsamples=CALIB_SAMPLES, seqlen=CALIB_SEQLEN, dataset=calibration_data(),
                   layer_config=layer_plan(model, base), device_map="cpu", enable_torch_compile=False, seed=0,
                   ignore_layers=ignore_layers)
    ar.quantize_and_save(str(out), format=fmt)
    found = sorted(p.parent for p in out.rglob("config.json"))
    if len(found) != 1:
        raise GptqKitError(f"AutoRound wrote {len(found)} checkpoints under {out}: {found}")
    return found[0]


def _read_tensors(d: Path) -> tuple[dict, dict]:
    """({name: tensor}, {name: file}) of a checkpoint folder (single file or an index)."""
    from safetensors.torch import load_file

    files = sorted(d.glob("*.safetensors"))
    tensors, where = {}, {}
    for f in files:
        for k, v in load_file(str(f)).items():
            tensors[k], where[k] = v, f.name
    return tensors, where


def _quantize_mtp(tensors: dict, base: int = SMALL_GROUP) -> tuple[dict, list[str]]:
    """The MTP decoder layer's 2-D ``.weight`` tensors (its routed experts' too: one per expert) packed by
    AutoRound's RTN packer, each with its ``g_idx``; ``mtp.fc``, the norms and the router / shared-expert gate
    (out < 32) unchanged. Returns (new tensors, quantized layer names)."""
    import torch
    from auto_round.utils.model_free_utils import quantize_weight_rtn

    out, done = {}, []
    for name, t in sorted(tensors.items()):
        if not (name.startswith("mtp.layers.") and name.endswith(".weight") and t.dim() == 2):
            out[name] = t
            continue
        out_f, in_f = t.shape
        if out_f % MIN_OUT or in_f % MIN_OUT:
            out[name] = t
            continue
        layer = name[: -len(".weight")]
        group = group_for(in_f, layer, base)
        qweight, qzeros, scales = quantize_weight_rtn(t, BITS, group, sym=True, packing=PACKING)
        g_idx = (torch.arange(in_f) // group).to(torch.int32)  # as AutoRound's export writes it (experts too)
        out.update({f"{layer}.qweight": qweight, f"{layer}.qzeros": qzeros, f"{layer}.scales": scales,
                    f"{layer}.g_idx": g_idx})
        done.append(layer)
    return out, done


def _regex(layer: str) -> str:
    import re

    return ".*" + re.escape(layer) + ".*"


def autoround_export(kind: str, src: str | os.PathLike, out_dir: str | os.PathLike, iters: int = 0) -> Path:
    """AutoRound's GPTQ export of the bf16 kit ``src`` of ``kind`` into ``out_dir`` (for a multimodal kind:
    of its text form, :func:`gptq_multimodal.text_form`), which :func:`make_gptq_kit` turns into each variant."""
    from vllm_platform_ext.testing.gptq_multimodal import is_multimodal, text_form

    out = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="vpe-gptq-") as tmp:
        if is_multimodal(src):
            src = text_form(src, Path(tmp) / "text")
        made = _autoround(Path(src), Path(tmp) / "ar", iters)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(made, out)
    return out


def make_gptq_kit(kind: str, out_dir: str | os.PathLike, mtp: str = "bf16", exclusion: bool = True, iters: int = 0,
                  dims: str = "cpu", src: str | os.PathLike | None = None,
                  export: str | os.PathLike | None = None) -> Path:
    """Write the GPTQ int4 checkpoint of the recall kit ``kind``/``dims`` to ``out_dir`` (see the module's
    note); ``src``: an already written bf16 recall kit of that kind (else one is made in a temporary folder).
    ``exclusion``: with ``mtp="bf16"``, ship the releases' ``-:.*mtp.*`` rule (False: AutoRound's own
    output, which vLLM builds with a quantized MTP layer). ``export``: :func:`autoround_export`'s folder for
    ``src``, or a checkpoint this function wrote with ``mtp="bf16"`` from the same kit: its AutoRound tensors are
    reused (``iters=0`` is deterministic RTN) instead of running AutoRound again. A multimodal kit (``qwen3_5``;
    ``qwen3_5_moe``, ``dims="gpu"``: hidden 128, the Marlin-fitting MoE) is quantized through its text form and
    written in the multimodal layout (testing/gptq_multimodal.py). Returns ``out_dir``."""
    from vllm_platform_ext.testing.gptq_multimodal import is_multimodal, to_multimodal
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    if mtp not in MTP_MODES:
        raise ValueError(f"mtp {mtp!r} not in {MTP_MODES}")
    if export and iters:
        raise ValueError("export reuses an iters=0 AutoRound export; iters must stay 0")
    out = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="vpe-gptq-") as tmp:
        src = Path(src) if src else make_tiny_model(kind, Path(tmp) / "bf16", dims=dims, target="recall")
        made = Path(export) if export else autoround_export(kind, src, Path(tmp) / "ar", iters)
        if is_multimodal(src) and not is_multimodal(made):  # the variant made on the text form, written back
            to_multimodal(_variant(made, Path(tmp) / "gptq", kind, mtp, exclusion), src, out)
        else:  # a text kit, or a multimodal checkpoint this function wrote (export=)
            _variant(made, out, kind, mtp, exclusion)
    check_checkpoint_files(out)
    return out


def _variant(made: Path, out: Path, kind: str, mtp: str, exclusion: bool) -> Path:
    """``made`` (an AutoRound export, or a ``mtp="bf16"`` checkpoint of :func:`make_gptq_kit`) copied to ``out``
    with the MTP layer as ``mtp`` asks (see :func:`make_gptq_kit`), in ``made``'s own form (text or multimodal:
    the ``mtp.*`` names are the same in both)."""
    from safetensors.torch import save_file

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(made, out)
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    base = qc["group_size"]  # the export's base group (base_group)
    tensors, where = _read_tensors(out)
    mtp_names = [k for k in tensors if k.startswith("mtp.")]
    if not mtp_names:
        raise GptqKitError(f"AutoRound's export of {kind} carries no mtp.* tensors")
    dynamic = {k: v for k, v in (qc.get("dynamic") or {}).items() if k != MTP_EXCLUSION}  # (an export's rule)
    if mtp == "quantized":
        if any(k.startswith("mtp.") and k.endswith(".qweight") for k in tensors):
            raise GptqKitError(f"{made}: its MTP layer is quantized already")
        mtp_file = {where[k] for k in mtp_names}
        if len(mtp_file) != 1:
            raise GptqKitError(f"the mtp.* tensors lie in {sorted(mtp_file)}")
        (fname,) = mtp_file
        mtp_tensors, layers = _quantize_mtp({k: tensors[k] for k in mtp_names}, base)
        rest = {k: v for k, v in tensors.items() if where[k] == fname and not k.startswith("mtp.")}
        save_file({k: v.contiguous() for k, v in {**rest, **mtp_tensors}.items()}, str(out / fname),
                  metadata={"format": "pt"})
        for layer in layers:  # the same group plan as the main model's layers
            in_f = tensors[layer + ".weight"].shape[1]
            if group_for(in_f, layer, base) != base:
                dynamic["+:" + _regex(layer)] = {"bits": BITS, "group_size": group_for(in_f, layer, base),
                                                 "sym": True}
        index = out / "model.safetensors.index.json"
        if index.is_file():
            idx = json.loads(index.read_text())
            wm = {k: v for k, v in idx["weight_map"].items() if not k.startswith("mtp.")}
            wm.update({k: fname for k in mtp_tensors})
            idx["weight_map"] = dict(sorted(wm.items()))
            index.write_text(json.dumps(idx, indent=2) + "\n")
    elif exclusion:
        dynamic[MTP_EXCLUSION] = {}
    qc["dynamic"] = dynamic
    cfg["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    side = out / "quantization_config.json"  # AutoRound's copy of the same dict: kept equal
    if side.is_file():
        side.write_text(json.dumps(qc, indent=2, sort_keys=True) + "\n")
    return out


def check_checkpoint_files(path: Path) -> None:
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if not (path / f).is_file():
            raise GptqKitError(f"{path}: missing {f}")


# ---- dequantization: the float reference of a packed layer ----

def unpack_rows(packed, bits: int = BITS):
    """int32 ``[n / (32/bits), m]`` packed along dim 0 (GPTQ's ``qweight``) -> ``[n, m]`` int64 values."""
    import torch

    pf, mask = 32 // bits, (1 << bits) - 1
    p = packed.to(torch.int64)
    vals = torch.stack([(p >> (bits * j)) & mask for j in range(pf)], dim=1)  # [n/pf, pf, m]
    return vals.reshape(p.shape[0] * pf, p.shape[1])


def unpack_cols(packed, bits: int = BITS):
    """int32 ``[g, m / (32/bits)]`` packed along dim 1 (GPTQ's ``qzeros``) -> ``[g, m]`` int64 values."""
    return unpack_rows(packed.t().contiguous(), bits).t().contiguous()


def dequantize(qweight, qzeros, scales, g_idx=None, bits: int = BITS, dtype=None):
    """GPTQ (v1) dequantization of one layer: ``W[o, i] = scales[g(i), o] * (q[i, o] - (qzeros[g(i), o] + 1))``,
    in float64, returned as ``dtype`` (float32: exact for fp16 scales and 4-bit integers), ``[out, in]``.
    ``g_idx``: each input row's group (None: row // group size, from the shapes)."""
    import torch

    q = unpack_rows(qweight, bits)  # [in, out]
    z = unpack_cols(qzeros, bits) + 1  # [groups, out]
    s = scales.to(torch.float64)
    n_in, groups = q.shape[0], s.shape[0]
    if z.shape != s.shape or q.shape[1] != s.shape[1]:
        raise GptqKitError(f"qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)}, scales "
                           f"{tuple(scales.shape)} do not make one layer")
    if g_idx is None:
        if n_in % groups:
            raise GptqKitError(f"{n_in} input rows in {groups} groups")
        g_idx = torch.arange(n_in) // (n_in // groups)
    g = g_idx.to(torch.int64)
    w = s[g] * (q - z[g]).to(torch.float64)  # [in, out]
    return w.t().contiguous().to(dtype or torch.float32)


def dequantized_state_dict(gptq_dir: str | os.PathLike) -> dict:
    """Every tensor of a GPTQ checkpoint with each packed layer (``qweight``/``qzeros``/``scales``
    [/``g_idx``]) replaced by its float32 ``.weight``; other tensors as float32."""
    import torch

    tensors, _ = _read_tensors(Path(gptq_dir))
    out = {}
    layers = sorted({k[: -len(".qweight")] for k in tensors if k.endswith(".qweight")})
    for layer in layers:
        out[layer + ".weight"] = dequantize(tensors[layer + ".qweight"], tensors[layer + ".qzeros"],
                                            tensors[layer + ".scales"], tensors.get(layer + ".g_idx"))
    packed = {f"{layer}.{s}" for layer in layers for s in ("qweight", "qzeros", "scales", "g_idx")}
    for k, v in tensors.items():
        if k not in packed:
            out[k] = v.to(torch.float32)
    return out


def write_dequantized(gptq_dir: str | os.PathLike, bf16_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """The float32 reference checkpoint: ``bf16_dir``'s config and tokenizer (no quantization config),
    ``gptq_dir``'s tensors dequantized, under the bf16 kit's own names (every one of them)."""
    return write_reference(dequantized_state_dict(gptq_dir), bf16_dir, out_dir)


def write_reference(sd: dict, bf16_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """``bf16_dir``'s config and tokenizer with the float32 tensors ``sd`` (a quantized checkpoint's dequantized
    state dict: every bf16 tensor's name and shape, nothing else) in place of its weights."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from vllm_platform_ext.testing import gptq_moe
    from vllm_platform_ext.testing.tiny_models import check_checkpoint

    bf16_dir, out = Path(bf16_dir), Path(out_dir)
    with safe_open(str(bf16_dir / "model.safetensors"), "pt") as f:
        want = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    sd = gptq_moe.fuse_experts(sd, want)  # per-expert (GPTQ) -> the kit's fused experts, where it has them
    if set(sd) != set(want):
        raise GptqKitError(f"dequantized tensors differ from the bf16 kit's: {sorted(set(sd) ^ set(want))[:6]}")
    bad = [k for k in sd if tuple(sd[k].shape) != want[k]]
    if bad:
        raise GptqKitError(f"dequantized shapes differ from the bf16 kit's: {bad[:6]}")
    out.mkdir(parents=True, exist_ok=True)
    for f in bf16_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy2(f, out / f.name)
    save_file({k: v.contiguous() for k, v in sorted(sd.items())}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    check_checkpoint(out)
    return out


def symmetric_zero_problems(gptq_dir: str | os.PathLike) -> list[str]:
    """The packed layers of a symmetric int4 GPTQ checkpoint whose ``qzeros`` are not the symmetric zero
    (8, stored as 7: every nibble 7). vLLM's CPU linear kernel ignores them for ``sym``; the quantizer's own
    dequantization (AutoRound's ``QuantLinear``) reads them, so a checkpoint that breaks this rule is
    dequantized differently by each."""
    tensors, _ = _read_tensors(Path(gptq_dir))
    sym_zero = (1 << (BITS - 1)) - 1
    return sorted(k[: -len(".qzeros")] for k, v in tensors.items()
                  if k.endswith(".qzeros") and bool((unpack_cols(v) != sym_zero).any()))


def plant_zero_point(gptq_dir: str | os.PathLike, layer: str, value: int = 6) -> None:
    """Overwrite one layer's ``qzeros`` (every nibble ``value``) in place: a wrong zero point."""
    from safetensors.torch import save_file

    tensors, where = _read_tensors(Path(gptq_dir))
    key = layer + ".qzeros"
    if key not in tensors:
        raise GptqKitError(f"{gptq_dir}: no {key}")
    word = 0
    for j in range(32 // BITS):
        word |= (value & ((1 << BITS) - 1)) << (BITS * j)
    import torch

    word = word - (1 << 32) if word >= 1 << 31 else word
    fname = where[key]
    part = {k: v for k, v in tensors.items() if where[k] == fname}
    part[key] = torch.full_like(part[key], word)
    save_file({k: v.contiguous() for k, v in part.items()}, str(Path(gptq_dir) / fname), metadata={"format": "pt"})


def quantizer_dequantized(gptq_dir: str | os.PathLike) -> dict:
    """Each packed layer's weight ``[out, in]`` as AutoRound's own GPTQ inference layer computes it
    (``auto_round_extension.torch.qlinear_torch_zp.QuantLinear``, the layer its export packs with and its
    loader runs): its forward on the identity, fp16 as it dequantizes. Needs auto-round importable."""
    import torch
    from auto_round_extension.torch.qlinear_torch_zp import QuantLinear

    cfg = json.loads((Path(gptq_dir) / "config.json").read_text())["quantization_config"]
    tensors, _ = _read_tensors(Path(gptq_dir))
    out = {}
    for layer in sorted(k[: -len(".qweight")] for k in tensors if k.endswith(".qweight")):
        qw, sc = tensors[layer + ".qweight"], tensors[layer + ".scales"]
        n_in, n_out = qw.shape[0] * (32 // cfg["bits"]), qw.shape[1]
        group = n_in // sc.shape[0]
        g_idx = tensors.get(layer + ".g_idx")
        if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(n_in) // group):
            raise GptqKitError(f"{layer}: g_idx is not row // {group} (desc_act off)")
        # without g_idx: the layer's g_idx forward slices the output columns by the input size (it
        # assumes act-order layers of out >= in); with desc_act off g_idx is row // group, checked above
        ql = QuantLinear(cfg["bits"], group, n_in, n_out, False, g_idx=False)
        ql.qweight.copy_(qw)
        ql.qzeros.copy_(tensors[layer + ".qzeros"])
        ql.scales.copy_(sc)
        ql.post_init()
        with torch.inference_mode():
            out[layer] = ql(torch.eye(n_in, dtype=torch.float16)).t().contiguous()
    return out


VARIANTS = {"mtp_bf16": "bf16", "mtp_quantized": "quantized"}  # checkpoint folder -> the MTP layer


def make_variants(kind: str, root: str | os.PathLike, src: str | os.PathLike) -> Path:
    """``root/<variant>`` and ``root/<variant>-deq`` for each of :data:`VARIANTS`, from one AutoRound export of
    the bf16 kit ``src``."""
    root = Path(root)
    with tempfile.TemporaryDirectory(prefix="vpe-gptq-") as tmp:
        made = autoround_export(kind, src, Path(tmp) / "ar")
        for name, mtp in VARIANTS.items():
            d = make_gptq_kit(kind, root / name, mtp=mtp, src=src, export=made)
            write_dequantized(d, src, root / f"{name}-deq")
    return root


def main(argv: list[str] | None = None) -> int:
    """``build``: :func:`make_gptq_kit` (+ :func:`write_dequantized` with ``--dequantized``);
    ``quantizer-dequant DIR OUT``: :func:`quantizer_dequantized` into a safetensors file. Run with auto-round
    on the path (``PYTHONPATH=.qdeps``): the tests call it in a subprocess, so that AutoRound's
    dependencies never enter the test process."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vllm_platform_ext.testing.gptq_kit")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("kind")
    b.add_argument("out_dir")
    b.add_argument("--src", help="the bf16 recall kit of KIND (default: made from the committed weights; "
                   "required with --dequantized)")
    b.add_argument("--dims", default="cpu", help="the kit's dims without --src (qwen3_5_moe: gpu)")
    b.add_argument("--mtp", choices=MTP_MODES, default="bf16")
    b.add_argument("--no-exclusion", action="store_true")
    b.add_argument("--iters", type=int, default=0)
    b.add_argument("--export", help="reuse this mtp=bf16 checkpoint's AutoRound tensors (no AutoRound run)")
    b.add_argument("--dequantized", help="also write the float32 dequantized twin here")
    b.add_argument("--quantizer-dequant", help="also write quantizer-dequant's file here (one interpreter start)")
    v = sub.add_parser("variants", help="every VARIANTS checkpoint and its dequantized twin from one AutoRound run")
    v.add_argument("kind")
    v.add_argument("root")
    v.add_argument("--src", required=True, help="the bf16 recall kit of KIND")
    q = sub.add_parser("quantizer-dequant")
    q.add_argument("gptq_dir")
    q.add_argument("out_file")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        if a.dequantized and not a.src:
            ap.error("--dequantized needs --src (the bf16 kit the twin takes its layout from)")
        d = make_gptq_kit(a.kind, a.out_dir, mtp=a.mtp, exclusion=not a.no_exclusion, iters=a.iters, src=a.src,
                          export=a.export, dims=a.dims)
        if a.dequantized:
            write_dequantized(d, a.src, a.dequantized)
        if a.quantizer_dequant:
            from safetensors.torch import save_file

            save_file(quantizer_dequantized(d), a.quantizer_dequant)
        print(d)
    elif a.cmd == "variants":
        print(make_variants(a.kind, a.root, a.src))
    else:
        from safetensors.torch import save_file

        save_file(quantizer_dequantized(a.gptq_dir), a.out_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
