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
