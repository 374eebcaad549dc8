"""Triton kernel of the TurboQuant K+1 verify, second generation (``v2``): word loads, fields taken
out of registers, no int -> float conversion on the tile, inline-PTX dequant where the GPU has it
(``FP8_ASM``: cvt.rn.f16x2.e4m3x2 on SM >= 8.9; ``NIB_ASM``: lop3 for 4-bit nibbles, :mod:`.ptx`).
The Gluon kernels (:mod:`.gluon_verify`) replace it where Triton has Gluon; it is the portable path
and the reference the Gluon kernels are tested against. Launched by :mod:`.triton_verify` with the
settings of :mod:`.launch_policy`. Imports only Triton.
"""
from __future__ import annotations

import triton
import triton.language as tl

from vllm_platform_ext.ops.turboquant import ptx

_FP8_POS_0, _FP8_POS_1 = tl.constexpr(ptx.FP8_POS[0]), tl.constexpr(ptx.FP8_POS[1])
_NIB_POS_0, _NIB_POS_1 = tl.constexpr(ptx.NIB_POS[0]), tl.constexpr(ptx.NIB_POS[1])


@triton.jit
def _h16(x):
    """int32 holding a 16-bit pattern in its low half -> that pattern as fp16."""
    return x.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _fp8_as_f16(x):
    """Byte (int32, 0..255) of an e4m3 key -> fp16 with the same sign/exponent/mantissa bits.

    Exact: e4b15 bytes give the value itself, e4nv bytes the value / 256 (folded into the
    score scale). No conversion instruction, only shifts and masks.
    """
    return _h16(((x & 0x80) << 8) | ((x & 0x7F) << 7))


@triton.jit
def _idx_f16(x, MASK: tl.constexpr):
    """Index bits (int32) -> fp16 value 1024 + index, exact (0x6400 is 1024.0)."""
    return _h16((x & MASK) | 0x6400)


@triton.jit
def _fp8x4_f16_asm(w):
    """int32 words of 4 e4m3 (e4nv) key bytes -> 4 fp16 tensors (byte 0..3), exact, through the
    SM 8.9+ ``cvt.rn.f16x2.e4m3x2`` conversion: 2 byte permutes + 4 conversions per 2 words."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 t02, t13;
        .reg .b16 a0, a1, a2, a3;
        prmt.b32 t02, $4, $5, 0x6240;
        prmt.b32 t13, $4, $5, 0x7351;
        mov.b32 {a0, a2}, t02;
        mov.b32 {a1, a3}, t13;
        cvt.rn.f16x2.e4m3x2 $0, a0;
        cvt.rn.f16x2.e4m3x2 $1, a1;
        cvt.rn.f16x2.e4m3x2 $2, a2;
        cvt.rn.f16x2.e4m3x2 $3, a3;
        }
        """,
        constraints="=r,=r,=r,=r,r,r",
        args=[w],
        dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
        is_pure=True,
        pack=2,
    )


@triton.jit
def _nib4_f16_asm(h):
    """int16 words of 4 nibbles -> 4 fp16 tensors ``nibble e - 8`` (e = 0..3), exact: per pair
    of words and nibble position one shift, one ``lop3`` (builds 1024 + nibble) and one packed
    subtraction of 1032 (0x6408)."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 y4, y8, y12, z0, z1, z2, z3, off;
        mov.b32 off, 0x64086408;
        shr.b32 y4, $4, 4;
        shr.b32 y8, $4, 8;
        shr.b32 y12, $4, 12;
        lop3.b32 z0, $4, 0x000F000F, 0x64006400, 0xEA;
        lop3.b32 z1, y4, 0x000F000F, 0x64006400, 0xEA;
        lop3.b32 z2, y8, 0x000F000F, 0x64006400, 0xEA;
        lop3.b32 z3, y12, 0x000F000F, 0x64006400, 0xEA;
        sub.f16x2 $0, z0, off;
        sub.f16x2 $1, z1, off;
        sub.f16x2 $2, z2, off;
        sub.f16x2 $3, z3, off;
        }
        """,
        constraints="=r,=r,=r,=r,r",
        args=[h],
        dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
        is_pure=True,
        pack=2,
    )


@triton.jit
def _fp8_pos_f16_asm(w, SEL: tl.constexpr):
    """One byte position of int32 words of e4m3 keys -> fp16 (exact), so that a caller converting
    position by position next to each dot keeps one sub-tile live, not four. ``pack=2`` hands the
    asm two words; ``SEL`` is the ``prmt`` selector that gathers byte e of both ("0x40", "0x51",
    "0x62", "0x73" for e = 0..3), then one ``cvt.rn.f16x2.e4m3x2``."""
    return tl.inline_asm_elementwise(
        asm=_FP8_POS_0 + SEL + _FP8_POS_1,
        constraints="=r,r,r", args=[w], dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def _nib_pos_f16_asm(h, SHIFT: tl.constexpr):
    """One nibble position of int16 words -> fp16 ``nibble - 8`` (exact). ``SHIFT`` ("0", "4", "8",
    "12") selects the nibble: a shift, a ``lop3`` that builds 1024 + nibble and a packed
    subtraction of 1032 per two words."""
    return tl.inline_asm_elementwise(
        asm=_NIB_POS_0 + SHIFT + _NIB_POS_1,
        constraints="=r,r", args=[h], dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def _unpack_3bit(h0, h1, h2, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """3 halfwords (int32, sign-extended) per group of 16 -> ``[BLOCK_N, D]`` indices, natural order."""
    x = (h0.to(tl.int64) & 0xFFFF) | ((h1.to(tl.int64) & 0xFFFF) << 16) | ((h2.to(tl.int64) & 0xFFFF) << 32)
    sh = tl.arange(0, 16).to(tl.int64) * 3
    return tl.reshape(((x[:, :, None] >> sh[None, None, :]) & 7).to(tl.int32), [BLOCK_N, D])


@triton.jit
def _ld(ptr, ok, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptr, mask=ok, other=0)
    else:
        return tl.load(ptr)


@triton.jit
def _v2_load(KV16, KV32, bt_row, kv_off, stride_cb, stride_cp, start_n, end,
             PAGE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
             KEY_FP8: tl.constexpr, KEY_W32: tl.constexpr, KEY_BITS: tl.constexpr, NORM_W: tl.constexpr,
             VAL_BITS: tl.constexpr, VAL_W: tl.constexpr, SZ_W: tl.constexpr, MASKED: tl.constexpr):
    """Raw words of one tile: key words ka/kb/kc, value words va/vb/vc (unused ones are [1, 1]
    dummies), and the per-token norm / scale / zero halfwords. MASKED: positions >= ``end`` read
    as zeros (else every position of the tile must be < ``end``: no predicates).

    One 64-bit row pointer per token; the columns are 32-bit offsets from it."""
    n = start_n + tl.arange(0, BLOCK_N)
    n_ok = n < end
    blk = _ld(bt_row + n // PAGE, n_ok, MASKED).to(tl.int64)
    row16 = blk * stride_cb + kv_off + (n % PAGE) * stride_cp  # 16-bit words
    p16 = KV16 + row16
    okc = n_ok[:, None]
    d4 = tl.arange(0, D // 4)
    g3 = tl.arange(0, D // 16) * 3
    dummy = tl.zeros([1, 1], tl.int32)
    if KEY_FP8:
        if KEY_W32:
            ka = _ld((KV32 + row16 // 2)[:, None] + d4[None, :], okc, MASKED)
            kb = dummy
        else:
            kp = p16[:, None] + 2 * d4[None, :]
            ka = _ld(kp, okc, MASKED).to(tl.int32)
            kb = _ld(kp + 1, okc, MASKED).to(tl.int32)
        kc = dummy
        kn = tl.zeros([BLOCK_N], tl.int32)
    else:
        if KEY_BITS == 3:
            kp = p16[:, None] + g3[None, :]
            ka = _ld(kp, okc, MASKED).to(tl.int32)
            kb = _ld(kp + 1, okc, MASKED).to(tl.int32)
            kc = _ld(kp + 2, okc, MASKED).to(tl.int32)
        else:
            ka = _ld(p16[:, None] + d4[None, :], okc, MASKED).to(tl.int32)
            kb = dummy
            kc = dummy
        kn = _ld(p16 + NORM_W, n_ok, MASKED).to(tl.int32)
    if VAL_BITS == 3:
        vp = p16[:, None] + (VAL_W + g3)[None, :]
        va = _ld(vp, okc, MASKED).to(tl.int32)
        vb = _ld(vp + 1, okc, MASKED).to(tl.int32)
        vc = _ld(vp + 2, okc, MASKED).to(tl.int32)
    else:
        va = _ld(p16[:, None] + (VAL_W + d4)[None, :], okc, MASKED).to(tl.int32)
        vb = dummy
        vc = dummy
    vs = _ld(p16 + SZ_W, n_ok, MASKED).to(tl.int32)
    vz = _ld(p16 + (SZ_W + 1), n_ok, MASKED).to(tl.int32)
    return ka, kb, kc, va, vb, vc, kn, vs, vz


@triton.jit
def _v2_tile(cka, ckb, ckc, cva, cvb, cvc, ckn, cvs, cvz,
             q0, q1, q2, q3, CENT16, start_n, end, lim,
             m_i, l_i, c_i, r_i, acc0, acc1, acc2, acc3,
             BLOCK_N: tl.constexpr, D: tl.constexpr,
             KEY_FP8: tl.constexpr, KEY_W32: tl.constexpr, KEY_BITS: tl.constexpr,
             NORM_CORRECTION: tl.constexpr, VAL_BITS: tl.constexpr,
             FP8_ASM: tl.constexpr, NIB_ASM: tl.constexpr, ASM_SPLIT: tl.constexpr, MASKED: tl.constexpr):
    """One tile of the online softmax. The query already carries softmax scale * log2(e).

    Value accumulators are kept in units of ``c_i`` (the previous tile's largest value scale):
    each tile rescales them once (``alpha * c_i / s_max``, one FFMA with the tile's product);
    zero points and the centring offset go to the per-row ``r_i``, in true units. Value indices
    enter the tensor cores centred (``idx - 8``, ``idx - 4`` for 3 bits): with the raw ``1024 +
    idx`` pattern the tile products are ~1000x larger than their signal and the MMA's truncating
    adds bias long contexts (measured: 1e-1 relative at 32K); the tile's product starts from zero.
    """
    # ---- scores ----
    if (KEY_FP8 and FP8_ASM) and ASM_SPLIT:  # one byte position at a time, next to its dot (Triton 3.0: no chained and)
        s = tl.dot(q0, tl.trans(_fp8_pos_f16_asm(cka, "0x40")))
        s = tl.dot(q1, tl.trans(_fp8_pos_f16_asm(cka, "0x51")), s)
        s = tl.dot(q2, tl.trans(_fp8_pos_f16_asm(cka, "0x62")), s)
        s = tl.dot(q3, tl.trans(_fp8_pos_f16_asm(cka, "0x73")), s)
    elif KEY_FP8:
        if FP8_ASM:
            k0, k1, k2, k3 = _fp8x4_f16_asm(cka)
        elif KEY_W32:
            k0 = _fp8_as_f16(cka & 0xFF)
            k1 = _fp8_as_f16((cka >> 8) & 0xFF)
            k2 = _fp8_as_f16((cka >> 16) & 0xFF)
            k3 = _fp8_as_f16((cka >> 24) & 0xFF)
        else:
            k0 = _fp8_as_f16(cka & 0xFF)
            k1 = _fp8_as_f16((cka >> 8) & 0xFF)
            k2 = _fp8_as_f16(ckb & 0xFF)
            k3 = _fp8_as_f16((ckb >> 8) & 0xFF)
        s = tl.dot(q0, tl.trans(k0))
        s = tl.dot(q1, tl.trans(k1), s)
        s = tl.dot(q2, tl.trans(k2), s)
        s = tl.dot(q3, tl.trans(k3), s)
    else:
        k_mul = _h16(ckn).to(tl.float32)
        if KEY_BITS == 3:
            c = tl.load(CENT16 + _unpack_3bit(cka, ckb, ckc, D, BLOCK_N))
            s = tl.dot(q0, tl.trans(c))
            if NORM_CORRECTION:
                gram = tl.dot(c, tl.trans(c))
        else:
            c0 = tl.load(CENT16 + (cka & 15))
            c1 = tl.load(CENT16 + ((cka >> 4) & 15))
            c2 = tl.load(CENT16 + ((cka >> 8) & 15))
            c3 = tl.load(CENT16 + ((cka >> 12) & 15))
            s = tl.dot(q0, tl.trans(c0))
            s = tl.dot(q1, tl.trans(c1), s)
            s = tl.dot(q2, tl.trans(c2), s)
            s = tl.dot(q3, tl.trans(c3), s)
            if NORM_CORRECTION:
                gram = tl.dot(c0, tl.trans(c0))
                gram = tl.dot(c1, tl.trans(c1), gram)
                gram = tl.dot(c2, tl.trans(c2), gram)
                gram = tl.dot(c3, tl.trans(c3), gram)
        if NORM_CORRECTION:  # ||centroid vector||^2 of each token: the Gram diagonal (tensor cores)
            eye = tl.arange(0, BLOCK_N)[:, None] == tl.arange(0, BLOCK_N)[None, :]
            nrm2 = tl.sum(tl.where(eye, gram, 0.0), axis=1)
            k_mul = k_mul / tl.sqrt(nrm2 + 1e-16)
        s = s * k_mul[None, :]
    if MASKED:
        n = start_n + tl.arange(0, BLOCK_N)
        visible = (n < end)[None, :] & (n[None, :] < lim[:, None])
        s = tl.where(visible, s, float("-inf"))

    # ---- online softmax (base 2) ----
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)

    # ---- values: dot(w, idx - HALF), w = p * scale / max scale (fp16) ----
    v_scale = _h16(cvs).to(tl.float32)
    v_zero = _h16(cvz).to(tl.float32)
    s_max = tl.maximum(tl.max(v_scale, axis=0), 6e-8)
    w = (p * (v_scale / s_max)[None, :]).to(tl.float16)
    if VAL_BITS == 3:
        half = 4.0
    else:
        half = 8.0
    r_i = r_i * alpha + tl.sum(p * v_zero[None, :], axis=1) + (half * s_max) * tl.sum(w.to(tl.float32), axis=1)
    f = (alpha * (c_i / s_max))[:, None]
    if VAL_BITS == 3:
        # .to(fp16): Triton 3.0 (vLLM-metax v0.23) promotes fp16 - float literal to fp32
        vt = (_idx_f16(_unpack_3bit(cva, cvb, cvc, D, BLOCK_N), 7) - 1028.0).to(tl.float16)
        acc0 = acc0 * f + tl.dot(w, vt)
    elif NIB_ASM and ASM_SPLIT:
        h = cva.to(tl.int16)
        acc0 = acc0 * f + tl.dot(w, _nib_pos_f16_asm(h, "0"))
        acc1 = acc1 * f + tl.dot(w, _nib_pos_f16_asm(h, "4"))
        acc2 = acc2 * f + tl.dot(w, _nib_pos_f16_asm(h, "8"))
        acc3 = acc3 * f + tl.dot(w, _nib_pos_f16_asm(h, "12"))
    else:
        if NIB_ASM:
            v0, v1, v2, v3 = _nib4_f16_asm(cva.to(tl.int16))
        else:
            v0 = (_idx_f16(cva, 15) - 1032.0).to(tl.float16)  # fp16 on Triton 3.0 too
            v1 = (_idx_f16(cva >> 4, 15) - 1032.0).to(tl.float16)  # fp16 on Triton 3.0 too
            v2 = (_idx_f16(cva >> 8, 15) - 1032.0).to(tl.float16)  # fp16 on Triton 3.0 too
            v3 = (_idx_f16(cva >> 12, 15) - 1032.0).to(tl.float16)  # fp16 on Triton 3.0 too
        acc0 = acc0 * f + tl.dot(w, v0)
        acc1 = acc1 * f + tl.dot(w, v1)
        acc2 = acc2 * f + tl.dot(w, v2)
        acc3 = acc3 * f + tl.dot(w, v3)
    return m_new, l_i, s_max, r_i, acc0, acc1, acc2, acc3


@triton.jit
def _tq_verify_v2(
    Q, KV16, KV32, BT, SEQ, CENT16, MID,
    stride_qn, stride_qh,
    stride_cb, stride_cp, stride_ch,  # in 16-bit words
    stride_bt,
    stride_mr, stride_mh, stride_ms,
    qk_scale,  # softmax scale * log2(e) (* 256 for e4nv fp8 keys decoded by shifts)
    K1, NUM_SPLITS,
    G: tl.constexpr, BLOCK_M: tl.constexpr, M_CHUNKS: tl.constexpr,
    D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    KEY_FP8: tl.constexpr, KEY_W32: tl.constexpr, KEY_BITS: tl.constexpr, NORM_W: tl.constexpr,
    NORM_CORRECTION: tl.constexpr, VAL_BITS: tl.constexpr, VAL_W: tl.constexpr, SZ_W: tl.constexpr,
    PREFETCH: tl.constexpr, FP8_ASM: tl.constexpr = False, NIB_ASM: tl.constexpr = False,
    ASM_SPLIT: tl.constexpr = False,
):
    """Field layout in 16-bit words of a slot: keys at 0 (fp8 bytes, or packed indices and the
    fp16 norm at NORM_W), value indices at VAL_W, fp16 scale/zero at SZ_W/SZ_W+1.

    4-bit fields and fp8 keys are split by their position e in a word: sub-tile e holds head
    dim elements 4j+e, and each is scored / accumulated by its own dot against the matching
    query / output columns (no register shuffles). 3-bit fields unpack to natural order.
    Tiles wholly before the causal region and before the split's end run without any mask.
    """
    # row chunks of one (request, KV head) are neighbours in launch order: they share the KV tiles in L2
    b = tl.program_id(1)
    kvh = tl.program_id(0) // M_CHUNKS
    mc = tl.program_id(0) % M_CHUNKS
    sid = tl.program_id(2)

    seq_len = tl.load(SEQ + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = sid * split_len
    end = tl.minimum(start + split_len, seq_len)
    # tiles [start, full_end) need no mask: every position < end and visible to every row
    n_full = tl.maximum(tl.minimum(end, seq_len - K1 + 1) - start, 0) // BLOCK_N
    full_end = start + n_full * BLOCK_N

    m_offs = mc * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = m_offs < K1 * G
    t = m_offs // G
    g = m_offs % G
    q_row = (b * K1 + t).to(tl.int64) * stride_qn + (kvh * G + g).to(tl.int64) * stride_qh
    lim = seq_len - K1 + 1 + t
    d4 = tl.arange(0, D // 4)
    dn = tl.arange(0, D)
    if KEY_BITS == 3:
        q0 = (tl.load(Q + q_row[:, None] + dn[None, :], mask=row_ok[:, None], other=0.0) * qk_scale).to(tl.float16)
        q1 = q0
        q2 = q0
        q3 = q0
    else:
        qp = Q + q_row[:, None] + 4 * d4[None, :]
        q0 = (tl.load(qp, mask=row_ok[:, None], other=0.0) * qk_scale).to(tl.float16)
        q1 = (tl.load(qp + 1, mask=row_ok[:, None], other=0.0) * qk_scale).to(tl.float16)
        q2 = (tl.load(qp + 2, mask=row_ok[:, None], other=0.0) * qk_scale).to(tl.float16)
        q3 = (tl.load(qp + 3, mask=row_ok[:, None], other=0.0) * qk_scale).to(tl.float16)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    r_i = tl.zeros([BLOCK_M], tl.float32)
    c_i = 1.0
    if VAL_BITS == 3:
        acc0 = tl.zeros([BLOCK_M, D], tl.float32)
    else:
        acc0 = tl.zeros([BLOCK_M, D // 4], tl.float32)
    acc1 = tl.zeros([BLOCK_M, D // 4], tl.float32)
    acc2 = tl.zeros([BLOCK_M, D // 4], tl.float32)
    acc3 = tl.zeros([BLOCK_M, D // 4], tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    kv_off = kvh.to(tl.int64) * stride_ch

    if PREFETCH:  # registers hold the next tile's words while this one is computed (masked loads)
        ka, kb, kc, va, vb, vc, kn, vs, vz = _v2_load(KV16, KV32, bt_row, kv_off, stride_cb, stride_cp, start, end,
                                                      PAGE, BLOCK_N, D, KEY_FP8, KEY_W32, KEY_BITS, NORM_W,
                                                      VAL_BITS, VAL_W, SZ_W, True)
    for start_n in range(start, full_end, BLOCK_N):
        if PREFETCH:
            cka, ckb, ckc, cva, cvb, cvc, ckn, cvs, cvz = ka, kb, kc, va, vb, vc, kn, vs, vz
            ka, kb, kc, va, vb, vc, kn, vs, vz = _v2_load(KV16, KV32, bt_row, kv_off, stride_cb, stride_cp,
                                                          start_n + BLOCK_N, end, PAGE, BLOCK_N, D, KEY_FP8,
                                                          KEY_W32, KEY_BITS, NORM_W, VAL_BITS, VAL_W, SZ_W, True)
        else:
            cka, ckb, ckc, cva, cvb, cvc, ckn, cvs, cvz = _v2_load(KV16, KV32, bt_row, kv_off, stride_cb,
                                                                   stride_cp, start_n, end, PAGE, BLOCK_N, D,
                                                                   KEY_FP8, KEY_W32, KEY_BITS, NORM_W, VAL_BITS,
                                                                   VAL_W, SZ_W, False)
        m_i, l_i, c_i, r_i, acc0, acc1, acc2, acc3 = _v2_tile(
            cka, ckb, ckc, cva, cvb, cvc, ckn, cvs, cvz, q0, q1, q2, q3, CENT16, start_n, end, lim,
            m_i, l_i, c_i, r_i, acc0, acc1, acc2, acc3,
            BLOCK_N, D, KEY_FP8, KEY_W32, KEY_BITS, NORM_CORRECTION, VAL_BITS, FP8_ASM, NIB_ASM, ASM_SPLIT, False)
    for start_n in range(full_end, end, BLOCK_N):  # the causal tail and the split's partial tile
        cka, ckb, ckc, cva, cvb, cvc, ckn, cvs, cvz = _v2_load(KV16, KV32, bt_row, kv_off, stride_cb, stride_cp,
                                                               start_n, end, PAGE, BLOCK_N, D, KEY_FP8, KEY_W32,
                                                               KEY_BITS, NORM_W, VAL_BITS, VAL_W, SZ_W, True)
        m_i, l_i, c_i, r_i, acc0, acc1, acc2, acc3 = _v2_tile(
            cka, ckb, ckc, cva, cvb, cvc, ckn, cvs, cvz, q0, q1, q2, q3, CENT16, start_n, end, lim,
            m_i, l_i, c_i, r_i, acc0, acc1, acc2, acc3,
            BLOCK_N, D, KEY_FP8, KEY_W32, KEY_BITS, NORM_CORRECTION, VAL_BITS, FP8_ASM, NIB_ASM, ASM_SPLIT, True)

    has = l_i > 0.0
    inv = 1.0 / tl.where(has, l_i, 1.0)
    ci = c_i * inv
    ri = r_i * inv
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    mid = MID + (b * K1 + t).to(tl.int64) * stride_mr + (kvh * G + g).to(tl.int64) * stride_mh + sid * stride_ms
    okr = row_ok[:, None]
    if VAL_BITS == 3:
        tl.store(mid[:, None] + dn[None, :], acc0 * ci[:, None] + ri[:, None], mask=okr)
    else:
        mp = mid[:, None] + d4[None, :]  # sub-tile e at columns e*D/4 .. (stage 2: SPLIT4)
        tl.store(mp, acc0 * ci[:, None] + ri[:, None], mask=okr)
        tl.store(mp + D // 4, acc1 * ci[:, None] + ri[:, None], mask=okr)
        tl.store(mp + 2 * (D // 4), acc2 * ci[:, None] + ri[:, None], mask=okr)
        tl.store(mp + 3 * (D // 4), acc3 * ci[:, None] + ri[:, None], mask=okr)
    tl.store(mid + D, lse2, mask=row_ok)
