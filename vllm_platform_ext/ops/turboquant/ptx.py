"""Inline-PTX dequant snippets shared by the Triton (``triton_verify``) and Gluon
(``gluon_verify``) kernels, all used with ``inline_asm_elementwise(..., pack=2)``. The ``*_POS``
strings decode one position: ``$1`` (and ``$2``) hold two packed source words, ``$0`` receives two
fp16 values, and the kernels splice a constexpr selector between the two halves. The wide ``*W``
strings decode a whole staged word into four f16x2 outputs ``$0..$3`` (source word ``$4``)."""

# One byte position of two int32 words of e4m3 (e4nv) keys -> two fp16, exact (SM >= 8.9):
# ``prmt`` gathers byte e of both words (selector "0x40", "0x51", "0x62", "0x73" for e = 0..3),
# then one ``cvt.rn.f16x2.e4m3x2``.
FP8_POS = ("{ .reg .b32 t; .reg .b16 lo, hi; prmt.b32 t, $1, $2, ",
           "; mov.b32 {lo, hi}, t; cvt.rn.f16x2.e4m3x2 $0, lo; }")

# Two int32 words of e4m3 keys (k-rows 2t, 2t+1 of the operand layout) -> four f16x2, one
# ``cvt.rn.f16x2.e4m3x2`` per halfword, no byte gathering: $0 = bytes 0, 1 of the first word,
# $1 = bytes 2, 3, $2 / $3 the same of the second (SM >= 8.9; the query is ordered to match:
# ``triton_verify.gluon_query_order``).
FP8W = ("{ .reg .b16 a0, a1, b0, b1; mov.b32 {a0, a1}, $4; mov.b32 {b0, b1}, $5; "
        "cvt.rn.f16x2.e4m3x2 $0, a0; cvt.rn.f16x2.e4m3x2 $1, a1; cvt.rn.f16x2.e4m3x2 $2, b0; "
        "cvt.rn.f16x2.e4m3x2 $3, b1; }")

# One nibble position of two int16 words (packed in one register) -> two fp16 ``nibble - 8``,
# exact: a shift by SHIFT ("0", "4", "8", "12"), a ``lop3`` that builds 1024 + nibble (0x6400 is
# 1024.0) and a packed subtraction of 1032 (0x6408).
NIB_POS = ("{ .reg .b32 y, z, off; mov.b32 off, 0x64086408; shr.b32 y, $1, ",
           "; lop3.b32 z, y, 0x000F000F, 0x64006400, 0xEA; sub.f16x2 $0, z, off; }")

# Codebook lookups, one staged index word (two int16 halfwords of 4 index nibbles each, packed in
# one register: ``pack=2``) -> four f16x2 centroid pairs, exact, through byte permutes over the
# fp16 codebook held in registers: L* hold the low bytes of the centroids (4 per register, entry i
# at byte i % 4 of L[i // 4]), H* the high bytes. A halfword's 4 nibbles are one ``prmt`` selector
# (bits 0-2 pick a byte of the 8-byte table, bit 3 set would mean sign replication), so one
# ``prmt`` per byte table gives the low (high) bytes of 4 centroids and two more interleave them
# into 2 f16x2: outputs $0 = (a0, a1), $1 = (a2, a3) for the low halfword's nibbles a0..a3,
# $2 = (b0, b1), $3 = (b2, b3) for the high halfword's. The kernel's query is permuted to match
# (``triton_verify.gluon_query_order``). Operands: $4 the word; each int32 table argument takes two
# registers (``pack=2``), so the tables are $5, $7, $9, ...
_LO_HI = "prmt.b32 {o0}, tl, th, 0x5140; prmt.b32 {o1}, tl, th, 0x7362; "


def _lookup8(sel: str, o0: str, o1: str) -> str:
    return (f"prmt.b32 tl, $5, $7, {sel}; prmt.b32 th, $9, $11, {sel}; " + _LO_HI.format(o0=o0, o1=o1))


# 3-bit indices (8 entries: L0 L1 H0 H1 = $5 $7 $9 $11), staged as nibbles with bit 3 clear:
# 9 instructions per word.
LUT8W = ("{ .reg .b32 hi, tl, th; " + _lookup8("$4", "$0", "$1") + "shr.b32 hi, $4, 16; "
         + _lookup8("hi", "$2", "$3") + "}")


# 4-bit indices of a symmetric codebook (c[15-i] == -c[i]), staged folded: nibble bit 3 is the sign
# (1: entries 8-15, positive), bits 0-2 the magnitude index k (entry 8+k, or 7-k negated). Lookup in
# the 8 magnitudes (entries 8..15: L0 L1 H0 H1 = $5 $7 $9 $11) with the sign bits masked out of the
# selectors; the sign goes into the high bytes: a ``prmt`` in sign-replicate mode turns bit 3 of
# nibble k into byte k (0xFF: positive; bytes of $4 << 4 carry the even nibbles' bit 3 in their
# top bit, bytes of $4 the odd nibbles'), and a ``lop3`` sets the fp16 sign bit where it is 0x00:
# 15 instructions per word.
def _signed8(sel: str, sgn_sel: str, o0: str, o1: str) -> str:
    return (f"prmt.b32 tl, $5, $7, {sel}; prmt.b32 th, $9, $11, {sel}; prmt.b32 sg, x4, $4, {sgn_sel}; "
            "lop3.b32 th, th, sg, 0x80808080, 0xF2; " + _LO_HI.format(o0=o0, o1=o1))


LUT8SW = ("{ .reg .b32 m, x4, hi, tl, th, sg; and.b32 m, $4, 0x77777777; shl.b32 x4, $4, 4; "
          + _signed8("m", "0xD9C8", "$0", "$1") + "shr.b32 hi, m, 16; " + _signed8("hi", "0xFBEA", "$2", "$3") + "}")


# 4-bit indices (16 entries: L0..L3 = $5 $7 $9 $11, H0..H3 = $13 $15 $17 $19): entries 0-7 and 8-15
# are looked up separately with bit 3 masked out of the selectors and merged per byte by the mask
# that the sign-replicate ``prmt`` makes of each index's bit 3: 21 instructions per word.
def _lookup16(sel: str, sgn_sel: str, o0: str, o1: str) -> str:
    return (f"prmt.b32 t0, $5, $7, {sel}; prmt.b32 t1, $9, $11, {sel}; prmt.b32 u0, $13, $15, {sel}; "
            f"prmt.b32 u1, $17, $19, {sel}; prmt.b32 sg, x4, $4, {sgn_sel}; "
            "lop3.b32 tl, t1, t0, sg, 0xE4; lop3.b32 th, u1, u0, sg, 0xE4; " + _LO_HI.format(o0=o0, o1=o1))


LUT16W = ("{ .reg .b32 m, x4, hi, t0, t1, u0, u1, tl, th, sg; and.b32 m, $4, 0x77777777; shl.b32 x4, $4, 4; "
          + _lookup16("m", "0xD9C8", "$0", "$1") + "shr.b32 hi, m, 16; " + _lookup16("hi", "0xFBEA", "$2", "$3") + "}")


# Value nibbles, one register of two int16 words (token k low, token k+1 high) -> four f16x2 of
# ``nibble - HALF`` (nibble position e in $e), exact: a ``lop3`` builds 1024 + nibble (0x6400 is
# 1024.0) for positions 0 and 2, 1024 + 16 * nibble for positions 1 and 3 (no shift), then a packed
# subtraction of 1024 + HALF, or a packed fma by 1/16 (0x2C00) minus 64 + HALF; one shift by 8 serves
# positions 2 and 3: 9 instructions per 8 values (``NIB_POS``: 12).
def _nib_wide(half: int) -> str:
    off = 0x6400 + half
    fofs = {8: 0xD480, 4: 0xD440}[half]  # -(64 + HALF) in fp16
    pair = lambda src, o0, o1: (  # noqa: E731
        f"lop3.b32 z, {src}, 0x000F000F, 0x64006400, 0xEA; sub.f16x2 {o0}, z, off; "
        f"lop3.b32 z, {src}, 0x00F000F0, 0x64006400, 0xEA; fma.rn.f16x2 {o1}, z, sc, fo; ")
    return ("{ .reg .b32 y, z, off, sc, fo; "
            f"mov.b32 off, 0x{off:04X}{off:04X}; mov.b32 sc, 0x2C002C00; mov.b32 fo, 0x{fofs:04X}{fofs:04X}; "
            + pair("$4", "$0", "$1") + "shr.b32 y, $4, 8; " + pair("y", "$2", "$3") + "}")


NIB4W = _nib_wide(8)
NIB3W = _nib_wide(4)

# Packed fp16 square-accumulate of two values: $0 = $1 * $1 + $2 (norm correction's sum of squares).
SQ_ACC = "fma.rn.f16x2 $0, $1, $1, $2;"
