"""vllm-platform-ext: a vLLM hardware plugin for Qwen3.5/3.6 hybrid models with speculative
decoding on MetaX (MACA), NVIDIA and the CPU.

vLLM finds it through two entry points:

* ``vllm.platform_plugins`` -> :func:`register`: the MetaX platform class path where a MetaX
  runtime is present, else ``None``. Imports no vLLM module.
* ``vllm.general_plugins`` -> ``vllm_platform_ext.general_plugin:bootstrap``, i.e.
  :func:`vllm_platform_ext.bootstrap.run`, in every vLLM process (:mod:`.bootstrap`).

The layout: ``docs/architecture.md``.
"""
from __future__ import annotations

from vllm_platform_ext import bootstrap
from vllm_platform_ext.version import __version__

__all__ = ["PLATFORM_CLASS", "__version__", "bootstrap", "register"]

PLATFORM_CLASS = "vllm_platform_ext.platform.MacaPlatform"


def register() -> str | None:
    from vllm_platform_ext import detect

    return PLATFORM_CLASS if detect.probe().platform == "maca" else None
