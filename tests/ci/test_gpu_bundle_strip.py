"""What ci/gpu/bundle.py strips from the vLLM wheel must be what the line never loads in the suite's settings.

Window 11 (2026-12-07, results/gpu/2026-12-07-ct-kit-full-graphs): the 0.26.0 bundle rebuilt with FlashAttention 2
stripped ("Hopper takes FA3") ran every TurboQuant engine into "'_vllm_fa2_C' object has no attribute 'varlen_fwd'"
at its first prefill: each GPU line the bundle serves overrides flash_attn_version to 2 for a TurboQuant KV cache
(vllm/engine/arg_utils.py). Checked here on each locked line's own wheel (the compat tables' copy)."""
from __future__ import annotations

import zipfile

import pytest

from conftest import load_tool, table_wheel

bundle = load_tool("ci/gpu/bundle.py")
FA2 = "vllm/vllm_flash_attn/_vllm_fa2_C"
LOCKED = sorted({tuple(int(x) for x in entry["vllm"]["version"].split(".")[:2]) for entry in bundle.read_lock().values()})


def _forces_fa2(arg_utils: str) -> bool:
    return "not yet compatible with FlashAttention >= 3" in arg_utils and "flash_attn_version = 2" in arg_utils


@pytest.mark.parametrize("key", LOCKED, ids=lambda k: f"{k[0]}.{k[1]}")
def test_turboquant_lines_keep_flash_attention_2(key):
    with zipfile.ZipFile(table_wheel(key)) as z:
        arg_utils = z.read("vllm/engine/arg_utils.py").decode()
        fa2 = [n for n in z.namelist() if n.startswith(FA2)]
    assert _forces_fa2(arg_utils), f"{key}: TurboQuant no longer forces FA2 here: FA2 may be stripped again"
    assert fa2, f"{key}: the wheel has no {FA2}*"
    stripped = [n for n in fa2 if any(n.startswith(p) for p in bundle.STRIP)]
    assert not stripped, f"{key}: bundle.STRIP removes {stripped}, which TurboQuant's prefill calls"
    assert FA2 in bundle.KEPT and "flash_attn_version" in bundle.KEPT[FA2]


def test_every_strip_prefix_has_a_reason_and_none_is_kept():
    assert bundle.STRIP and all(isinstance(r, str) and r for r in bundle.STRIP.values())
    assert not set(bundle.STRIP) & set(bundle.KEPT)
