"""The Gluon kernel's codebook lookups (``ptx.LUT8_POS`` / ``LUT16_POS``) and nibble decodes
(``ptx.NIB_POS`` / ``NIB3_POS``), executed on the CPU by a small interpreter of the PTX
instructions they use (``prmt`` with its sign-replicate mode, ``lop3``, shifts, packed fp16
subtraction), over every index pair, against the codebook itself and the float index values.
The tables are built by ``triton_verify.codebook_bytes``, as the kernel receives them.
The GPU tests check the same strings end to end; this pins the selector logic down without one."""
from __future__ import annotations

import re
import struct

import pytest
import torch

from vllm_platform_ext.ops.turboquant import layout as L
from vllm_platform_ext.ops.turboquant import ptx


def _prmt(a: int, b: int, sel: int) -> int:
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    out = 0
    for i in range(4):
        n = (sel >> (4 * i)) & 0xF
        byte = (src >> (8 * (n & 7))) & 0xFF
        if n & 8:  # sign-replicate mode
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for i in range(32):
        x, y, z = (a >> i) & 1, (b >> i) & 1, (c >> i) & 1
        out |= ((lut >> ((x << 2) | (y << 1) | z)) & 1) << i  # a: 0xF0, b: 0xCC, c: 0xAA
    return out


def _f16x2(v: int) -> tuple[float, float]:
    return struct.unpack("<2e", struct.pack("<I", v & 0xFFFFFFFF))


def _sub_f16x2(a: int, b: int) -> int:
    x, y = _f16x2(a), _f16x2(b)
    return struct.unpack("<I", struct.pack("<2e", x[0] - y[0], x[1] - y[1]))[0]


def run_ptx(asm: str, operands: list[int]) -> int:
    """Execute ``{ .reg ...; instr; ... }`` with ``$0`` as the result and ``$1..`` the operands."""
    regs = {f"${i + 1}": v & 0xFFFFFFFF for i, v in enumerate(operands)}

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0) & 0xFFFFFFFF

    body = asm.strip().strip("{}")
    for ins in (x.strip() for x in body.split(";")):
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        a = [x.strip() for x in args.split(",")]
        if op == "mov.b32":
            r = val(a[1])
        elif op == "shr.b32":
            r = val(a[1]) >> val(a[2])
        elif op == "shl.b32":
            r = (val(a[1]) << val(a[2])) & 0xFFFFFFFF
        elif op == "and.b32":
            r = val(a[1]) & val(a[2])
        elif op == "xor.b32":
            r = val(a[1]) ^ val(a[2])
        elif op == "lop3.b32":
            r = _lop3(val(a[1]), val(a[2]), val(a[3]), val(a[4]))
        elif op == "prmt.b32":
            r = _prmt(val(a[1]), val(a[2]), val(a[3]))
        elif op == "sub.f16x2":
            r = _sub_f16x2(val(a[1]), val(a[2]))
        else:
            raise AssertionError(f"instruction {op} not emulated")
        regs[a[0]] = r & 0xFFFFFFFF
    return regs["$0"]


def _splice(parts, shift: int) -> str:
    return parts[0] + str(shift) + parts[1] + str(shift + 12) + parts[2]


@pytest.mark.parametrize("bits", [3, 4])
def test_codebook_lookup_every_index_pair(bits):
    from vllm_platform_ext.ops.turboquant.triton_verify import codebook_bytes

    cent = L.lloyd_max_centroids(256, bits)
    c16 = cent.to(torch.float16)
    tabs = [int(t) & 0xFFFFFFFF for t in codebook_bytes(cent)]
    n = 2**bits
    assert len(tabs) == 2 * n // 4
    parts = ptx.LUT8_POS if bits == 3 else ptx.LUT16_POS
    # operand order as the kernel passes them: every int32 table takes two registers
    ops_tabs = [t for t in tabs for _ in range(2)]
    for e in range(4):  # nibble position e of two halfwords (token k low, token k+1 high)
        asm = _splice(parts, 4 * e)
        for ia in range(n):
            for ib in range(n):
                noise = 0x9 if bits == 4 else 0x5  # other nibbles hold unrelated indices
                ha = sum(((ia if j == e else noise) << (4 * j)) for j in range(4))
                hb = sum(((ib if j == e else (noise ^ 3)) << (4 * j)) for j in range(4))
                out = run_ptx(asm, [ha | (hb << 16)] + ops_tabs)
                lo, hi = _f16x2(out)
                assert lo == float(c16[ia]) and hi == float(c16[ib]), (bits, e, ia, ib, lo, hi)


def test_folded_symmetric_lookup_every_index_pair():
    """4-bit keys of a symmetric codebook: indices folded as the kernel stages them (i < 8 -> 7 - i,
    bit 3 kept as the sign), looked up in the 8 positive entries (``ptx.LUT8S_POS``)."""
    from vllm_platform_ext.ops.turboquant.triton_verify import _symmetric_codebook, codebook_bytes

    cent = L.lloyd_max_centroids(256, 4)
    assert _symmetric_codebook(cent)
    assert not _symmetric_codebook(cent + 1e-3)
    bent = cent.clone()
    assert _symmetric_codebook(bent)
    bent[0] += 1e-2  # changed in place: re-checked (tensor version), no stale answer
    assert not _symmetric_codebook(bent)
    from vllm_platform_ext.ops.turboquant.triton_verify import _CODEBOOKS, _codebook_tables

    lut, fold = _codebook_tables(cent, 4, True)
    assert fold and lut.numel() == 4 and _codebook_tables(cent, 4, True)[0] is lut  # built once
    full, fold = _codebook_tables(cent, 4, False)
    assert not fold and full.numel() == 8 and _codebook_tables(cent, 4, False)[0] is full
    key = id(bent)
    del bent
    assert key not in _CODEBOOKS  # the entry dies with its tensor
    c16 = cent.to(torch.float16)
    tabs = [int(t) & 0xFFFFFFFF for t in codebook_bytes(cent[8:])]
    ops_tabs = [t for t in tabs for _ in range(2)]

    def fold(word: int) -> int:  # the staging fold of gluon_verify._field_words, on 8 nibbles
        return (word ^ ((((~word) >> 3) & 0x11111111) * 7)) & 0xFFFFFFFF

    for e in range(4):
        asm = _splice(ptx.LUT8S_POS, 4 * e)
        for ia in range(16):
            for ib in range(16):
                ha = sum(((ia if j == e else 0xB) << (4 * j)) for j in range(4))
                hb = sum(((ib if j == e else 0x6) << (4 * j)) for j in range(4))
                out = run_ptx(asm, [fold(ha | (hb << 16))] + ops_tabs)
                lo, hi = _f16x2(out)
                assert lo == float(c16[ia]) and hi == float(c16[ib]), (e, ia, ib, lo, hi)


@pytest.mark.parametrize("bits", [3, 4])
def test_nibble_values_centred(bits):
    parts = ptx.NIB_POS if bits == 4 else ptx.NIB3_POS
    half = 2 ** (bits - 1)
    for shift in (0, 4, 8, 12):
        asm = parts[0] + str(shift) + parts[1]
        for ia in range(2**bits):
            for ib in range(2**bits):
                x = (ia << shift) | 0x0000 | ((ib << shift) << 16) | (0x5 << ((shift + 4) % 16))
                lo, hi = _f16x2(run_ptx(asm, [x]))
                assert (lo, hi) == (ia - half, ib - half)


def test_square_accumulate_string():
    assert re.fullmatch(r"fma\.rn\.f16x2 \$0, \$1, \$1, \$2;", ptx.SQ_ACC)
