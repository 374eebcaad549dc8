"""For the per-line children: a line's CUDA wheel on this host cannot pin memory (no CUDA), yet its
modules read ``PIN_MEMORY`` / ``is_pin_memory_available`` for their host-to-device copies. Set False in
every vLLM module loaded so far (each holds its own copy of the value)."""
from __future__ import annotations

import sys


def no_pinned_memory() -> None:
    for mod in [m for name, m in sys.modules.items() if name.startswith("vllm.") and m is not None]:
        if isinstance(getattr(mod, "PIN_MEMORY", None), bool):
            mod.PIN_MEMORY = False
        if callable(getattr(mod, "is_pin_memory_available", None)):
            mod.is_pin_memory_available = lambda: False
