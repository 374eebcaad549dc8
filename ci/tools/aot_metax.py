"""Compile, for a CUDA target and without a GPU, every Triton kernel this plugin launches on MetaX,
with the Triton importable here (issue 33, item 3: the Triton each vLLM-metax branch pins).

    PYTHONPATH=<folder holding triton X.Y>:<repo> python ci/tools/aot_metax.py [--arch 80]

The op platform is forced to ``maca`` (``VLLM_PLATFORM_EXT_PLATFORM=maca``), so each op takes
MetaX's launch configuration (``num_warps`` <= 16, TurboQuant with ``gluon=False``). The ops'
own host code runs on CPU tensors over the standard GDN cases and every TurboQuant preset; each
``kernel[grid](...)`` it makes is turned into a compile-only call (Triton's ``warmup``) against
a driver stub that reports a CUDA device of the given arch, so Triton builds TTIR -> TTGIR ->
LLVM -> PTX -> cubin (bundled ptxas) and nothing runs. Prints one JSON line: the Triton
version and, per kernel and specialization, whether it compiled (with the error if not).

MetaX's Triton compiles the same Triton IR for MACA instead of PTX; what this checks is that the
kernels' Python/Triton language is accepted by that Triton release (front end and the
target-independent passes), which is where a kernel written for a newer Triton breaks.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

os.environ["VLLM_PLATFORM_EXT_PLATFORM"] = "maca"
os.environ.pop("TRITON_INTERPRET", None)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.append(ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class _Driver:
    """The parts of Triton's active driver a compile-only launch touches (no GPU)."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True

    def get_device_interface(self):
        return torch.cuda

    def map_python_to_cpp_type(self, ty):  # 3.6's launcher binder (unused without a launch)
        return ty


RESULTS: list[dict] = []
_SEEN: set = set()


def _compile_only(orig):
    def run(self, *args, grid=None, warmup=False, **kwargs):
        name = getattr(self.fn, "__name__", str(self))
        try:
            kernel = orig(self, *args, grid=grid, warmup=True, **kwargs)
        except Exception as exc:
            cause = exc
            while cause.__cause__ is not None:  # Triton chains the inner function's error
                cause = cause.__cause__
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            key = (name, f"{type(exc).__name__}: {(lines[-1] if lines else '')[:300]}"
                         + (f" (cause: {type(cause).__name__}: {_last_lines(cause)})" if cause is not exc else ""))
            if key not in _SEEN:
                _SEEN.add(key)
                RESULTS.append({"kernel": name, "ok": False, "error": key[1],
                                "where": traceback.format_exc(limit=-3)[-1200:]})
            raise _Skip() from exc
        asm = getattr(kernel, "asm", {}) or {}
        key = (name, len(asm.get("ptx", "")))
        if key not in _SEEN:
            _SEEN.add(key)
            RESULTS.append({"kernel": name, "ok": "cubin" in asm, "ptx_lines": asm.get("ptx", "").count("\n"),
                            "num_warps": getattr(kernel.metadata, "num_warps", None)})
        return kernel

    return run


def _last_lines(exc: BaseException) -> str:
    """Triton's CompilationError text: the location, the source excerpt, the message last."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return " | ".join([lines[0], *lines[-2:]])[:600] if lines else ""


class _Skip(Exception):
    """A kernel failed to compile: recorded; the op call that launched it is abandoned."""


def _gdn_calls():
    from vllm_platform_ext.ops.gdn import triton_ops
    from vllm_platform_ext.testing import gdn_cases as cases
    from vllm_platform_ext.testing import gdn_harness as harness

    for name, case in cases.standard_cases().items():
        for dtype in (torch.bfloat16,):  # the models' dtype; fp16/fp32 add specializations, not constructs
            yield f"gdn {name} {dtype}", lambda c=case, d=dtype: harness.call_op(triton_ops, c, d, "cpu")


def _device_word_views(kv_cache):
    """What ``triton_verify._word_views`` gives on a device (2-byte-aligned slots: the v2 kernel)."""
    kv16 = kv_cache.view(torch.int16) if kv_cache.shape[-1] % 2 == 0 else None
    kv32 = kv_cache.view(torch.int32) if kv_cache.shape[-1] % 4 == 0 else None
    return (kv16, kv32) if kv16 is not None else (None, None)


def _turboquant_calls(arch: int):
    from vllm_platform_ext import ops
    from vllm_platform_ext.ops.dispatch import op_config
    from vllm_platform_ext.ops.turboquant import layout as L
    from vllm_platform_ext.ops.turboquant import triton_verify as TV
    from vllm_platform_ext.report import Report

    ops.register_all(Report())
    cfg = op_config("turboquant.verify_attention", "maca")  # gluon=False, inline_ptx=False
    byte_views = TV._word_views  # CPU tensors: no word views, the byte-load kernel (v1)

    def call(preset, d, k1, dtype, views):
        TV._word_views = views
        lay = L.layout_for(preset, d)
        hk, g, b, page, nb = 2, 4, 2, 16, 8
        view = torch.zeros(nb, page, hk, lay.slot_size_aligned, dtype=torch.uint8)
        q = torch.zeros(b * k1, hk * g, d, dtype=dtype)
        bt = torch.arange(nb, dtype=torch.int32).view(b, nb // b)
        sl = torch.full((b,), 40, dtype=torch.int32)
        c, h = L.lloyd_max_centroids(d, lay.centroid_bits), L.hadamard(d)
        TV.turboquant_verify_attention(q, view, bt, sl, k1, preset=preset, scale=d ** -0.5, centroids=c, PiT=h,
                                       fp8_e4b15=arch < 89, **cfg)  # e4b15 below SM 8.9, as on a device

    for kernel, views in (("v2", _device_word_views), ("v1", byte_views)):
        for preset in L.PRESETS:
            for d, k1, dtype in ((256, 4, torch.bfloat16), (128, 1, torch.float16)):
                yield (f"turboquant {kernel} {preset} d={d} K+1={k1} {dtype}",
                       lambda a=(preset, d, k1, dtype, views): call(*a))


def main(argv: list[str]) -> int:
    arch = int(argv[argv.index("--arch") + 1]) if "--arch" in argv else 80
    driver.set_active(_Driver(arch))
    JITFunction.run = _compile_only(JITFunction.run)
    calls, errors = 0, []
    for label, call in (*_gdn_calls(), *_turboquant_calls(arch)):
        calls += 1
        try:
            call()
        except _Skip:
            pass
        except Exception as exc:  # host code failed before or after a launch: say where
            errors.append({"call": label, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    print("JSON" + json.dumps({"triton": triton.__version__, "arch": arch, "calls": calls,
                               "kernels": RESULTS, "host_errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
