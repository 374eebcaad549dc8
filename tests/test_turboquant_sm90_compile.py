"""The TurboQuant verify kernel compiles for sm_90 on this CPU-only machine (Triton's bundled
ptxas): the inline-PTX dequant paths (fp8 ``cvt.rn.f16x2.e4m3x2``, nibble ``lop3`` + packed
subtraction) assemble, and the SASS holds the instructions they are meant to become. The GPU
tests check their numbers; this catches a broken asm string in CI, where no GPU runs it."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))


@pytest.fixture(scope="module")
def aot():
    pytest.importorskip("triton")
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("this Triton build ships no ptxas")
    import aot_loop  # noqa: F401  (tools/)
    import aot_sass

    return aot_sass


@pytest.mark.parametrize(
    "preset,over,expect,absent",
    [
        ("turboquant_k8v4", {"FP8_ASM": True, "NIB_ASM": True, "BLOCK_N": 128}, ["F2FP.F16.E4M3.UNPACK_B", "HADD2"], []),
        ("turboquant_k8v4", {"FP8_ASM": True, "NIB_ASM": True, "ASM_SPLIT": True, "BLOCK_N": 64, "K1": 1, "BLOCK_M": 16},
         ["F2FP.F16.E4M3.UNPACK_B", "HADD2"], []),
        ("turboquant_k8v4", {"FP8_ASM": False, "NIB_ASM": False}, [], ["F2FP.F16.E4M3.UNPACK_B"]),
        ("turboquant_4bit_nc", {"NIB_ASM": True}, ["HADD2"], []),
        ("turboquant_3bit_nc", {"PREFETCH": True, "BLOCK_N": 32}, ["HMMA"], []),
    ],
)
def test_compiles_for_sm90(aot, preset, over, expect, absent):
    k = aot.compile_v2(aot.consts_for(preset, **over), 4, 2)
    ops, sass, res = aot.stats(k)
    assert sum(ops.values()) > 500, "no SASS came out"
    assert "HMMA" in ops, "the dots must run on tensor cores"
    for ins in expect:
        assert ins in sass, f"{preset} {over}: expected {ins} in the SASS"
    for ins in absent:
        assert ins not in sass, f"{preset} {over}: {ins} should not appear"
