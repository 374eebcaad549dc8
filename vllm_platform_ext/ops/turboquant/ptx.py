"""Inline-PTX dequant snippets shared by the Triton (``triton_verify``) and Gluon
(``gluon_verify``) kernels. Each is used with ``inline_asm_elementwise(..., pack=2)``: ``$1``
(and ``$2``) hold two packed source words, ``$0`` receives two fp16 values. The kernels splice a
constexpr selector between the two halves."""

# One byte position of two int32 words of e4m3 (e4nv) keys -> two fp16, exact (SM >= 8.9):
# ``prmt`` gathers byte e of both words (selector "0x40", "0x51", "0x62", "0x73" for e = 0..3),
# then one ``cvt.rn.f16x2.e4m3x2``.
FP8_POS = ("{ .reg .b32 t; .reg .b16 lo, hi; prmt.b32 t, $1, $2, ",
           "; mov.b32 {lo, hi}, t; cvt.rn.f16x2.e4m3x2 $0, lo; }")

# One nibble position of two int16 words (packed in one register) -> two fp16 ``nibble - 8``,
# exact: a shift by SHIFT ("0", "4", "8", "12"), a ``lop3`` that builds 1024 + nibble (0x6400 is
# 1024.0) and a packed subtraction of 1032 (0x6408).
NIB_POS = ("{ .reg .b32 y, z, off; mov.b32 off, 0x64086408; shr.b32 y, $1, ",
           "; lop3.b32 z, y, 0x000F000F, 0x64006400, 0xEA; sub.f16x2 $0, z, off; }")

# Same for 3-bit indices (0..7, stored as nibbles): ``nibble - 4`` (0x6404 is 1028.0).
NIB3_POS = (NIB_POS[0].replace("0x64086408", "0x64046404"), NIB_POS[1])

# Codebook lookup of one nibble position of two int16 words of index nibbles -> two fp16 centroids
# (exact), through byte permutes over the codebook held in registers: L* hold the low bytes of the
# fp16 centroids (4 per register, entry i at byte i % 4 of L[i // 4]), H* the high bytes. Two
# shifts and a ``lop3`` put the two indices in the selector's nibbles 0 and 1, a ``prmt`` per byte
# table picks the bytes, a last ``prmt`` interleaves them into the f16x2 result.
# Operands (``pack=2``): $1 the two words; each int32 table argument takes two registers, so
# the tables are $2, $4, ... Spliced: SHIFT, SHIFT + 12.
# 3-bit indices (8 entries: L0 L1 H0 H1 = $2 $4 $6 $8): 6 instructions.
LUT8_POS = ("{ .reg .b32 a, b, s, tl, th; shr.b32 a, $1, ", "; shr.b32 b, $1, ",
            "; lop3.b32 s, a, b, 0xF, 0xE4; prmt.b32 tl, $2, $4, s; prmt.b32 th, $6, $8, s; "
            "prmt.b32 $0, tl, th, 0x5140; }")
# 4-bit indices (16 entries: L0..L3 = $2..$8, H0..H3 = $10..$16): entries 0-7 and 8-15 are looked
# up separately (selector nibble bit 3 set means sign replication, so the upper half is indexed
# with bit 3 flipped) and merged per byte by a mask built from bit 3 of each index: 13 instructions.
LUT16_POS = ("{ .reg .b32 a, b, s, s8, s4, m, t0, t1, u0, u1, tl, th; shr.b32 a, $1, ", "; shr.b32 b, $1, ",
             "; lop3.b32 s, a, b, 0xF, 0xE4; prmt.b32 t0, $2, $4, s; prmt.b32 u0, $10, $12, s; "
             "xor.b32 s8, s, 0x88; prmt.b32 t1, $6, $8, s8; prmt.b32 u1, $14, $16, s8; "
             "shl.b32 s4, s, 4; prmt.b32 m, s4, s, 0xC8; lop3.b32 tl, t1, t0, m, 0xE4; "
             "lop3.b32 th, u1, u0, m, 0xE4; prmt.b32 $0, tl, th, 0x5140; }")

# 4-bit indices of a symmetric codebook (c[15-i] == -c[i]), staged folded: nibble bit 3 is the sign
# (1: entries 8-15, positive), bits 0-2 the magnitude index k (entry 8+k, or 7-k negated). Lookup
# in the 8 magnitudes (entries 8..15: L0 L1 H0 H1 = $2 $4 $6 $8) as LUT8_POS with the sign bits
# masked out of the selector, then the fp16 sign set from the index's bit 3: 9 instructions.
LUT8S_POS = ("{ .reg .b32 a, b, s, tl, th, t; shr.b32 a, $1, ", "; shr.b32 b, $1, ",
             "; lop3.b32 s, a, b, 0xF, 0xE4; and.b32 s, s, 0x77; prmt.b32 tl, $2, $4, s; "
             "prmt.b32 th, $6, $8, s; prmt.b32 tl, tl, th, 0x5140; shl.b32 t, a, 12; "
             "lop3.b32 $0, tl, t, 0x80008000, 0xF2; }")

# Packed fp16 square-accumulate of two values: $0 = $1 * $1 + $2 (norm correction's sum of squares).
SQ_ACC = "fma.rn.f16x2 $0, $1, $1, $2;"
