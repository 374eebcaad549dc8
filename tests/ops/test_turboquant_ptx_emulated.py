"""The Gluon kernel's codebook lookups (``ptx.LUT8W`` / ``LUT8SW`` / ``LUT16W``) and nibble decodes
(``ptx.NIB_POS`` / ``NIB4W`` / ``NIB3W``), executed on the CPU by a small interpreter of the PTX
instructions they use (``prmt`` with its sign-replicate mode, ``lop3``, shifts, packed fp16
subtraction and fma), over every index at every nibble position, against the codebook itself and the float index values.
The tables are built by ``codebook.codebook_bytes``, as the kernel receives them.
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


def _fma_f16x2(a: int, b: int, c: int) -> int:
    x, y, z = _f16x2(a), _f16x2(b), _f16x2(c)  # fp16 * fp16 + fp16 is exact in float64, then rounded
    return struct.unpack("<I", struct.pack("<2e", x[0] * y[0] + z[0], x[1] * y[1] + z[1]))[0]


def _e4m3(byte: int) -> float:
    return float(torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float())


def run_ptx(asm: str, operands: list[int], outputs: int = 1):
    """Execute ``{ .reg ...; instr; ... }`` with ``$0..$(outputs-1)`` as the results and the next
    ``$`` numbers the operands; one result as an int, several as a list."""
    regs = {f"${i + outputs}": v & 0xFFFFFFFF for i, v in enumerate(operands)}

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0) & 0xFFFFFFFF

    body = asm.strip().strip("{}")
    for ins in (x.strip() for x in body.split(";")):
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        unpack = re.fullmatch(r"\{(\w+), (\w+)\}, (\S+)", args.strip())
        if op == "mov.b32" and unpack:  # split a register into its halfwords
            regs[unpack[1]], regs[unpack[2]] = val(unpack[3]) & 0xFFFF, val(unpack[3]) >> 16
            continue
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
        elif op == "cvt.rn.f16x2.e4m3x2":  # low byte -> low half
            r = struct.unpack("<I", struct.pack("<2e", _e4m3(val(a[1]) & 0xFF), _e4m3(val(a[1]) >> 8)))[0]
        elif op == "fma.rn.f16x2":
            r = _fma_f16x2(val(a[1]), val(a[2]), val(a[3]))
        else:
            raise AssertionError(f"instruction {op} not emulated")
        regs[a[0]] = r & 0xFFFFFFFF
    res = [regs[f"${i}"] for i in range(outputs)]
    return res[0] if outputs == 1 else res


def _word(nibbles_lo, nibbles_hi) -> int:
    """A staged index word: halfword 0 holds nibbles a0..a3, halfword 1 b0..b3."""
    return sum(v << (4 * j) for j, v in enumerate(list(nibbles_lo) + list(nibbles_hi)))


def _check_wide(asm, tables, encode, centroid, n):
    """Every index at every nibble position of a word (the others unrelated indices): the four
    outputs are (a0, a1), (a2, a3), (b0, b1), (b2, b3)."""
    ops_tabs = [t for t in tables for _ in range(2)]  # as the kernel passes them: two registers each
    for pos in range(8):
        for i in range(n):
            for noise in (0, n - 1, 5 % n):
                idx = [(noise + 3 * j) % n for j in range(8)]
                idx[pos] = i
                outs = run_ptx(asm, [encode(_word(idx[:4], idx[4:]))] + ops_tabs, outputs=4)
                got = [v for o in outs for v in _f16x2(o)]
                want = [centroid(x) for x in idx]
                assert got == want, (pos, i, noise, got, want)


@pytest.mark.parametrize("bits", [3, 4])
def test_codebook_lookup_every_index(bits):
    from vllm_platform_ext.ops.turboquant.codebook import codebook_bytes

    cent = L.lloyd_max_centroids(256, bits)
    c16 = cent.to(torch.float16)
    tabs = [int(t) & 0xFFFFFFFF for t in codebook_bytes(cent)]
    n = 2**bits
    assert len(tabs) == 2 * n // 4
    if bits == 3:
        _check_wide(ptx.LUT8W, tabs, lambda w: w, lambda i: float(c16[i]), n)
    else:  # the general 16-entry lookup (asymmetric codebooks): tables L0..L3 then H0..H3
        _check_wide(ptx.LUT16W, tabs, lambda w: w, lambda i: float(c16[i]), n)
        skew = cent + torch.linspace(0, 0.01, 16)  # not symmetric
        s16 = skew.to(torch.float16)
        tabs = [int(t) & 0xFFFFFFFF for t in codebook_bytes(skew)]
        _check_wide(ptx.LUT16W, tabs, lambda w: w, lambda i: float(s16[i]), n)


def test_folded_symmetric_lookup_every_index():
    """4-bit keys of a symmetric codebook: indices folded as the kernel stages them (i < 8 -> 7 - i,
    bit 3 kept as the sign), looked up in the 8 positive entries (``ptx.LUT8SW``)."""
    from vllm_platform_ext.ops.turboquant.codebook import _symmetric_codebook, codebook_bytes

    cent = L.lloyd_max_centroids(256, 4)
    assert _symmetric_codebook(cent)
    assert not _symmetric_codebook(cent + 1e-3)
    bent = cent.clone()
    assert _symmetric_codebook(bent)
    bent[0] += 1e-2  # changed in place: re-checked (tensor version), no stale answer
    assert not _symmetric_codebook(bent)
    from vllm_platform_ext.ops.turboquant.codebook import _CODEBOOKS, _codebook_tables

    lut, fold = _codebook_tables(cent, 4, True)
    assert fold and lut.numel() == 4 and _codebook_tables(cent, 4, True)[0] is lut  # built once
    full, fold = _codebook_tables(cent, 4, False)
    assert not fold and full.numel() == 8 and _codebook_tables(cent, 4, False)[0] is full
    key = id(bent)
    del bent
    assert key not in _CODEBOOKS  # the entry dies with its tensor
    c16 = cent.to(torch.float16)
    tabs = [int(t) & 0xFFFFFFFF for t in codebook_bytes(cent[8:])]

    def fold(word: int) -> int:  # the staging fold of gluon_verify._field_words, on 8 nibbles
        return (word ^ ((((~word) >> 3) & 0x11111111) * 7)) & 0xFFFFFFFF

    _check_wide(ptx.LUT8SW, tabs, fold, lambda i: float(c16[i]), 16)
    assert all((float(c16[i]) < 0) == (i < 8) for i in range(16))  # the sign set exactly for the lower half


def test_nibble_values_centred():
    """``NIB_POS`` (the Triton kernel's, one position) and the wide ``NIB4W`` / ``NIB3W`` (the Gluon
    kernel's, four positions of two tokens' value halfwords) give ``nibble - HALF`` exactly."""
    for shift in (0, 4, 8, 12):
        asm = ptx.NIB_POS[0] + str(shift) + ptx.NIB_POS[1]
        for ia in range(16):
            for ib in range(16):
                x = (ia << shift) | ((ib << shift) << 16) | (0x5 << ((shift + 4) % 16))
                lo, hi = _f16x2(run_ptx(asm, [x]))
                assert (lo, hi) == (ia - 8, ib - 8)
    for bits, asm in ((4, ptx.NIB4W), (3, ptx.NIB3W)):
        n, half = 2**bits, 2 ** (bits - 1)
        for pos in range(8):  # nibble pos % 4 of halfword pos // 4
            for i in range(n):
                for noise in (0, n - 1):
                    idx = [(noise + 5 * j) % n for j in range(8)]
                    idx[pos] = i
                    outs = run_ptx(asm, [_word(idx[:4], idx[4:])], outputs=4)
                    got = [v for o in outs for v in _f16x2(o)]
                    # output e = (low halfword's nibble e, high halfword's nibble e)
                    want = [float(idx[j + 4 * h] - half) for j in range(4) for h in range(2)]
                    assert got == want, (bits, pos, i, got, want)


def test_fp8_words_to_halves():
    """``ptx.FP8W``: two e4m3 key words -> (bytes 0, 1), (2, 3) of the first, then of the second
    (every finite byte value at every position)."""
    finite = [b for b in range(256) if b & 0x7F != 0x7F]
    for pos in range(8):
        for b in finite:
            by = [(0x38 + 7 * j) & 0x7E for j in range(8)]  # unrelated finite bytes elsewhere
            by[pos] = b
            w0 = sum(v << (8 * j) for j, v in enumerate(by[:4]))
            w1 = sum(v << (8 * j) for j, v in enumerate(by[4:]))
            got = [v for o in run_ptx(ptx.FP8W, [w0, w1], outputs=4) for v in _f16x2(o)]
            assert got == [_e4m3(v) for v in by], (pos, b)


def test_square_accumulate_string():
    assert re.fullmatch(r"fma\.rn\.f16x2 \$0, \$1, \$1, \$2;", ptx.SQ_ACC)


def test_codebook_tables_of_inference_tensors():
    """vLLM builds codebooks under ``torch.inference_mode()``: no version counter (reading
    ``_version`` raised in the engine). The tables are made once, refilled from the live tensor at
    every call (an in-place rewrite is seen), and stay writable outside inference mode."""
    from vllm_platform_ext.ops.turboquant.codebook import _codebook_tables, codebook_bytes, tensor_version

    with torch.inference_mode():
        cent = L.lloyd_max_centroids(128, 4).clone()
        assert cent.is_inference() and tensor_version(cent) is None
        lut, fold = _codebook_tables(cent, 4, True)
        assert fold and torch.equal(lut, codebook_bytes(cent[8:]))
        full, nofold = _codebook_tables(cent, 4, False)
        assert not nofold and torch.equal(full, codebook_bytes(cent))
        cent.mul_(1.5)  # rewritten in place, still symmetric: the next call sees it
        lut2, _ = _codebook_tables(cent, 4, True)
        assert lut2 is lut and torch.equal(lut2, codebook_bytes(cent[8:]))
    assert not lut.is_inference()
    cent3 = L.lloyd_max_centroids(128, 3)  # a plain tensor outside inference mode, 3-bit keys never fold
    with torch.inference_mode():
        t3, f3 = _codebook_tables(cent3, 3, True)
    assert not f3 and torch.equal(t3, codebook_bytes(cent3))
    assert torch.equal(_codebook_tables(cent3, 3, True)[0], t3)
