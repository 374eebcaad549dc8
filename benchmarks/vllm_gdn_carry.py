"""Copy vLLM's own GDN Triton kernels out of the installed wheel into ``.carry/vllm_gdn/vllm_ref``.

The GPU machine has torch + Triton but no vLLM. This takes ``causal_conv1d.py`` and FLA's
``fused_recurrent.py`` / ``fused_sigmoid_gating.py`` from the installed vLLM, unchanged except
for their imports (``vllm.triton_utils`` -> triton, ``vllm.platforms`` -> a 6-line stub that
answers ``is_arch_support_pdl`` as vLLM's CUDA platform does, the two block-id constants, and
FLA's ``exp``/``log`` aliases -> ``tl.exp``/``tl.log``, which the interpreter also accepts),
so the benchmark times vLLM's kernels as the wheel ships them.

Usage (here, where vLLM is installed):  python benchmarks/vllm_gdn_carry.py
Then name ``.carry`` in the device run's ``carry`` and put ``.carry/vllm_gdn`` on sys.path.
"""
from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEST = ROOT / ".carry" / "vllm_gdn" / "vllm_ref"

PLATFORM_STUB = '''"""Stand-in for vllm.platforms.current_platform (only what the copied kernels ask)."""
import os
import torch


class _Platform:
    @staticmethod
    def is_cpu():
        return False

    @staticmethod
    def is_arch_support_pdl():  # = vllm/platforms/cuda.py CudaPlatform.is_arch_support_pdl
        if os.environ.get("TRITON_INTERPRET") == "1":
            return False
        try:
            return torch.cuda.get_device_capability(torch.cuda.current_device())[0] >= 9
        except Exception:
            return False


current_platform = _Platform()
'''


def _rewrite(src: str) -> str:
    src = src.replace("from vllm.platforms import current_platform", "from ._platform import current_platform")
    src = src.replace("from vllm.triton_utils import tl, triton", "import triton\nimport triton.language as tl")
    src = src.replace("from vllm.v1.attention.backends.utils import NULL_BLOCK_ID, PAD_SLOT_ID",
                      "PAD_SLOT_ID = -1\nNULL_BLOCK_ID = 0")
    src = src.replace("from .op import exp, log", "")
    src = re.sub(r"(?<![\w.])exp\(", "tl.exp(", src)
    src = re.sub(r"(?<![\w.])log\(", "tl.log(", src)
    assert "from vllm" not in src and "import vllm" not in src, "unhandled vLLM import"
    return src


def main() -> int:
    import vllm

    base = pathlib.Path(vllm.__file__).parent
    files = {
        "causal_conv1d.py": base / "model_executor/layers/mamba/ops/causal_conv1d.py",
        "fused_recurrent.py": base / "third_party/flash_linear_attention/ops/fused_recurrent.py",
        "fused_sigmoid_gating.py": base / "third_party/flash_linear_attention/ops/fused_sigmoid_gating.py",
    }
    DEST.mkdir(parents=True, exist_ok=True)
    (DEST / "__init__.py").write_text(f'"""vLLM {vllm.__version__} GDN kernels (copied by benchmarks/vllm_gdn_carry.py)."""\n'
                                      f'VLLM_VERSION = "{vllm.__version__}"\n')
    (DEST / "_platform.py").write_text(PLATFORM_STUB)
    for name, path in files.items():
        src = path.read_text()
        # the CPU swap at the end of causal_conv1d.py never applies on the GPU; drop it
        src = src.split("\nif current_platform.is_cpu():")[0] + "\n"
        (DEST / name).write_text(_rewrite(src))
        print(f"{path} -> {DEST / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
