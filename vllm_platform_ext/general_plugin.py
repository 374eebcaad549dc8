"""vLLM's general-plugin entry point (``vllm.general_plugins = vllm_platform_ext.general_plugin:bootstrap``).

vLLM's loader (``vllm.plugins.load_plugins_by_group``) first imports the module of every
general plugin, then calls each function in entry-point order. That order follows where each
distribution's metadata is found and is not ours to choose: beside vLLM-metax, its
``register_customized`` (v0.22-v0.25) or ``register_out_of_tree`` (master) may be called first,
and it imports vLLM's fusion, spec-decode and quantization modules. So the compat step (missing
``_C`` schemas, ``torch.accelerator`` helpers) runs here, when the loader imports this module,
before any general plugin function; ``bootstrap`` (:func:`vllm_platform_ext.bootstrap.run`) then
runs the other steps when it is called. Nothing else imports this module.
"""
from __future__ import annotations

from vllm_platform_ext.bootstrap import early_compat
from vllm_platform_ext.bootstrap import run as bootstrap

__all__ = ["bootstrap"]

try:
    early_compat()
except Exception:  # recorded in the report; bootstrap() raises it under VLLM_PLATFORM_EXT_STRICT=1
    pass
