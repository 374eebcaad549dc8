"""AutoRound's NATIVE int4 export of the recall kit (``format="auto_round"``: ``quant_method "auto-round"``,
``packing_format "auto_round:auto_gptq"``), which vLLM loads through its INC config (issue 50, vLLM #49552).

This is the format of the first user report this project was built from (Qwen3.6-27B-int4-AutoRound, MTP k=3).
The quantizer, its version, the calibration data and the group plan are the GPTQ kit's (testing/gptq_kit.py:
AutoRound 0.16.1, ``iters=0``, the kit's own recall sequences, testing/gptq_groups.py); only the export differs.
What AutoRound 0.16.1 writes (read here, 2026-12-06) and what releases of Qwen3.5/3.6 carry:

- ``mtp="quantized"``: AutoRound's default. transformers' class has no MTP module, so the export copies the
  ``mtp.*`` tensors from the source (``copy_missing_tensors_from_source``) and quantizes the MTP decoder layer's
  linears by RTN (``_woq_quantize_missing_tensors``) into ``model_extra_tensors.safetensors``; it appends
  ``mtp.layers`` to ``block_name_to_quantize`` and keeps ``mtp.fc`` bf16 (``extra_config["mtp.fc"] = {"bits": 16,
  "data_type": "fp"}``). Intel's Qwen3.5 releases (AutoRound 0.12.2+) ship exactly this shape:
  ``block_name_to_quantize ["model.language_model.layers", "mtp.layers"]``, ``mtp.fc`` in ``extra_config``.
- ``mtp="bf16"``: AutoRound run with ``ignore_layers="mtp"``, as the community releases that keep the MTP
  layer bf16 (``--ignore_layers mtp``): ``block_name_to_quantize`` without ``mtp.layers``, and ``extra_config``
  with ``".*mtp.*": {"bits": 16, "data_type": "float"}`` plus one ``{"bits": 16, "data_type": "fp"}`` entry per
  MTP linear.

Both keep GPTQ's v1 packing (``qzeros = zero - 1``, no ``g_idx``): :func:`gptq_kit.dequantize` is their float
reference too, and :func:`gptq_kit.write_dequantized` writes their float32 twin.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

FORMAT = "auto_round"  # AutoRound's format name (vLLM: quant_method "auto-round" -> its INC config)
QUANT_METHOD = "auto-round"
IGNORE = {"bf16": "mtp", "quantized": ""}  # mtp mode -> AutoRound's ignore_layers


class NativeKitError(RuntimeError):
    pass


def quantization_config(ckpt: str | os.PathLike) -> dict:
    return json.loads((Path(ckpt) / "config.json").read_text())["quantization_config"]


def blocks(qc: dict) -> list[str]:
    """``block_name_to_quantize`` as a list (AutoRound writes a string or a list)."""
    b = qc.get("block_name_to_quantize") or []
    return [s.strip() for s in b.split(",") if s.strip()] if isinstance(b, str) else list(b)


def check_variant(ckpt: str | os.PathLike, mtp: str) -> None:
    """The export is what the module's note says AutoRound writes for ``mtp`` (an AutoRound change shows
    here, not as a puzzling engine result)."""
    from vllm_platform_ext.testing.gptq_kit import _read_tensors

    qc = quantization_config(ckpt)
    tensors, _ = _read_tensors(Path(ckpt))
    packed = sorted(k for k in tensors if k.startswith("mtp.") and k.endswith(".qweight"))
    problems = []
    if qc.get("quant_method") != QUANT_METHOD or qc.get("packing_format") != "auto_round:auto_gptq":
        problems.append(f"quant_method {qc.get('quant_method')!r}, packing_format {qc.get('packing_format')!r}")
    in_blocks = any(b.startswith("mtp") for b in blocks(qc))
    if mtp == "quantized" and not (packed and in_blocks):
        problems.append(f"MTP layer not quantized ({len(packed)} packed, blocks {blocks(qc)})")
    if mtp == "bf16" and (packed or in_blocks):
        problems.append(f"MTP layer quantized ({len(packed)} packed, blocks {blocks(qc)})")
    if (qc.get("extra_config") or {}).get("mtp.fc", {}).get("bits") != 16:
        problems.append("extra_config does not keep mtp.fc at 16 bits")
    if problems:
        raise NativeKitError(f"{ckpt}: AutoRound's native export (mtp={mtp}) is not as expected: {problems}")


def make_native_variants(kind: str, root: str | os.PathLike, src: str | os.PathLike) -> Path:
    """``root/<variant>`` and ``root/<variant>-deq`` for each of :data:`gptq_kit.VARIANTS`: AutoRound's native
    export of the bf16 kit ``src`` (one AutoRound run per MTP mode: ``ignore_layers`` differs); a multimodal kit
    through its text form, written back in the multimodal layout."""
    import shutil

    from vllm_platform_ext.testing import gptq_kit
    from vllm_platform_ext.testing.gptq_multimodal import is_multimodal

    from vllm_platform_ext.testing.gptq_multimodal import text_form, to_multimodal

    root = Path(root)
    for name, mtp in gptq_kit.VARIANTS.items():
        with tempfile.TemporaryDirectory(prefix="vpe-ar-") as tmp:
            # a multimodal kit (qwen3_5, qwen3_5_moe): quantized through its text form, written back in its own
            # (testing/gptq_multimodal.py; extra_config's names get the multimodal prefix)
            text = text_form(src, Path(tmp) / "text") if is_multimodal(src) else Path(src)
            made = gptq_kit._autoround(text, Path(tmp) / "ar", 0, fmt=FORMAT, ignore_layers=IGNORE[mtp])
            out = root / name
            if out.exists():
                shutil.rmtree(out)
            if is_multimodal(src):
                to_multimodal(made, src, out)
            else:
                shutil.copytree(made, out)
        check_variant(out, mtp)
        gptq_kit.check_checkpoint_files(out)
        gptq_kit.write_dequantized(out, src, root / f"{name}-deq")
    return root


def main(argv: list[str] | None = None) -> int:
    """``variants KIND ROOT --src BF16``: :func:`make_native_variants` (run with auto-round on the path,
    ``PYTHONPATH=.qdeps``, as testing/gptq_cells.py's ``build --format auto_round`` does)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vllm_platform_ext.testing.autoround_native")
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("variants", help="every VARIANTS checkpoint (native format) and its dequantized twin")
    v.add_argument("kind")
    v.add_argument("root")
    v.add_argument("--src", required=True, help="the bf16 recall kit of KIND (text form)")
    a = ap.parse_args(argv)
    print(make_native_variants(a.kind, a.root, a.src))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
