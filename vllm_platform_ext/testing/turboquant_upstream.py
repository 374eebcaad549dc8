"""Load vLLM's own TurboQuant Triton kernels (store + decode) without importing vLLM.

Used only by tests and benchmarks, to compare against the kernels vLLM ships: on the GPU
machine there is no vLLM, and on a CPU host vLLM's ``triton_utils`` disables Triton, so the
three upstream files are rewritten (their ``vllm.*`` imports only) into a private package
in a temporary folder and imported from there. The kernel bodies are untouched.

``src_dir`` holds ``triton_turboquant_store.py``, ``triton_turboquant_decode.py`` and
``triton_decode_attention.py`` as found in ``vllm/v1/attention/ops`` of the wheel; by default
they are read from the installed vLLM (located without importing it).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import tempfile
from types import ModuleType, SimpleNamespace

FILES = ("triton_decode_attention.py", "triton_turboquant_decode.py", "triton_turboquant_store.py")
_PKG = "_vllm_tq_upstream"

_PLATFORM_STUB = '''
import torch


class _Platform:
    def is_rocm(self):
        return False

    def is_cuda_alike(self):
        return torch.cuda.is_available()

    def is_cuda(self):
        return torch.cuda.is_available()


current_platform = _Platform()
'''


def installed_ops_dir() -> str:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("vLLM is not installed; pass src_dir with the copied kernel files")
    return os.path.join(list(spec.submodule_search_locations)[0], "v1", "attention", "ops")


def _rewrite(src: str) -> str:
    src = src.replace("from vllm.triton_utils import tl, triton", "import triton\nimport triton.language as tl")
    src = src.replace("from vllm.platforms import current_platform", f"from {_PKG}._platform import current_platform")
    src = src.replace("from vllm.v1.attention.ops.", f"from {_PKG}.")
    left = re.findall(r"^\s*(?:from|import)\s+vllm\b.*$", src, flags=re.M)
    if left:
        raise ImportError(f"unexpected vLLM imports in upstream kernel file: {left}")
    return src


def load(src_dir: str | None = None) -> SimpleNamespace:
    """Return ``SimpleNamespace(store=<module>, decode=<module>, stage2=<module>)``."""
    if _PKG in sys.modules:
        m = sys.modules
        return SimpleNamespace(
            store=m[f"{_PKG}.triton_turboquant_store"],
            decode=m[f"{_PKG}.triton_turboquant_decode"],
            stage2=m[f"{_PKG}.triton_decode_attention"],
        )
    src_dir = src_dir or installed_ops_dir()
    root = tempfile.mkdtemp(prefix="vllm_tq_upstream_")
    pkg_dir = os.path.join(root, _PKG)
    os.makedirs(pkg_dir)
    with open(os.path.join(pkg_dir, "__init__.py"), "w") as f:
        f.write("")
    with open(os.path.join(pkg_dir, "_platform.py"), "w") as f:
        f.write(_PLATFORM_STUB)
    for name in FILES:
        path = os.path.join(src_dir, name)
        if not os.path.exists(path):
            raise FileNotFoundError(f"upstream TurboQuant kernel file missing: {path}")
        with open(path) as f:
            text = _rewrite(f.read())
        with open(os.path.join(pkg_dir, name), "w") as f:
            f.write(text)
    sys.path.insert(0, root)
    try:
        mods: dict[str, ModuleType] = {
            n[:-3]: importlib.import_module(f"{_PKG}.{n[:-3]}") for n in FILES
        }
    finally:
        sys.path.remove(root)
    return SimpleNamespace(
        store=mods["triton_turboquant_store"],
        decode=mods["triton_turboquant_decode"],
        stage2=mods["triton_decode_attention"],
    )
