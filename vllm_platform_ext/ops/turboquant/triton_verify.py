"""Triton K+1 speculative-verify attention over a TurboQuant KV cache.

One program per (request, KV head, KV split[, row chunk]) reads each compressed KV tile once
and serves all ``(K+1) x GQA`` query rows of that request and KV head with tensor-core dots:

* rows ``m = t*G + g`` (query token ``t`` of the request, head ``g`` of the KV group) padded
  to a power of two (>= 16) and masked, so any GQA group (6, ...) and any K+1 (6, ...) work;
* in-chunk causal mask: row ``t`` sees positions ``< seq_len - (K+1) + 1 + t``;
* keys: fp8 bytes widened exactly to fp16 (k8v4), or Lloyd-Max indices -> centroids
  (rounded once to fp16) scored against the fp32-rotated query (rounded once to fp16), with
  the fp16 norm and the norm correction applied per token in fp32;
* values: indices (exact in fp16) times softmax weights pre-multiplied by the per-token
  scale (normalised by the tile's largest scale, so no fp16 underflow), zero points in fp32;
* split-KV with a fixed split count (graph-safe), combined by a second kernel; rows that see
  no position (captured dummy metadata, padded requests) give zeros, never NaN.

Scratch lives in a :class:`VerifyWorkspace` sized ``max_num_seqs x (K+1)`` rows, allocated
outside CUDA-graph capture. Imports only torch and Triton.
"""
from __future__ import annotations

from dataclasses import dataclass

import math
import weakref

import torch
import triton
import triton.language as tl

from vllm_platform_ext.ops.turboquant import ptx
from vllm_platform_ext.ops.turboquant.layout import layout_for

DEFAULT_MAX_KV_SPLITS = 32
_FP8_POS_0, _FP8_POS_1 = tl.constexpr(ptx.FP8_POS[0]), tl.constexpr(ptx.FP8_POS[1])
_NIB_POS_0, _NIB_POS_1 = tl.constexpr(ptx.NIB_POS[0]), tl.constexpr(ptx.NIB_POS[1])
_LOG2E = 1.4426950408889634


@triton.jit
def _unpack_bits(KV, base, n_ok, OFF: tl.constexpr, BITS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                 GATHER: tl.constexpr):
    """``[BLOCK_N, D]`` int32 indices of the 3/4-bit field at byte ``OFF`` of each slot.

    GATHER: per-element byte loads (two for 3-bit), no register shuffles; else one load per
    packed byte then join/reshape.
    """
    d = tl.arange(0, D)
    if GATHER:
        if BITS == 4:
            byte = tl.load(KV + base[:, None] + OFF + (d // 2)[None, :], mask=n_ok[:, None], other=0).to(tl.int32)
            return (byte >> ((d % 2) * 4)[None, :]) & 15
        else:
            p = KV + base[:, None] + OFF + ((d * 3) // 8)[None, :]
            lo = tl.load(p, mask=n_ok[:, None], other=0).to(tl.int32)
            hi = tl.load(p + 1, mask=n_ok[:, None], other=0).to(tl.int32)
            return ((lo | (hi << 8)) >> ((d * 3) % 8)[None, :]) & 7
    else:
        if BITS == 4:
            j = tl.arange(0, D // 2)
            byte = tl.load(KV + base[:, None] + OFF + j[None, :], mask=n_ok[:, None], other=0).to(tl.int32)
            return tl.reshape(tl.join(byte & 15, byte >> 4), [BLOCK_N, D])
        else:
            j = tl.arange(0, D // 8)
            p = KV + base[:, None] + OFF + j[None, :] * 3
            b0 = tl.load(p, mask=n_ok[:, None], other=0).to(tl.int32)
            b1 = tl.load(p + 1, mask=n_ok[:, None], other=0).to(tl.int32)
            b2 = tl.load(p + 2, mask=n_ok[:, None], other=0).to(tl.int32)
            word = b0 | (b1 << 8) | (b2 << 16)
            sh = tl.arange(0, 8) * 3
            return tl.reshape((word[:, :, None] >> sh[None, None, :]) & 7, [BLOCK_N, D])


@triton.jit
def _load_fp16(KV, addr, n_ok):
    lo = tl.load(KV + addr, mask=n_ok, other=0).to(tl.uint16)
    hi = tl.load(KV + addr + 1, mask=n_ok, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _tq_verify_stage1(
    Q, KV, BT, SEQ, CENT, MID,
    stride_qn, stride_qh,
    stride_cb, stride_cp, stride_ch,
    stride_bt,
    stride_mr, stride_mh, stride_ms,
    qk_scale,  # softmax scale * log2(e)
    K1, NUM_SPLITS,  # runtime ints: one compile serves every K+1 and split count
    G: tl.constexpr, BLOCK_M: tl.constexpr, M_CHUNKS: tl.constexpr,
    D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    KEY_FP8: tl.constexpr, FP8_E4B15: tl.constexpr, KEY_BITS: tl.constexpr, MSE_BYTES: tl.constexpr,
    NORM_CORRECTION: tl.constexpr, VAL_BITS: tl.constexpr, KPS: tl.constexpr, VAL_DATA_BYTES: tl.constexpr,
    GATHER: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1) // M_CHUNKS
    mc = tl.program_id(1) % M_CHUNKS
    sid = tl.program_id(2)

    seq_len = tl.load(SEQ + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = sid * split_len
    end = tl.minimum(start + split_len, seq_len)

    m_offs = mc * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = m_offs < K1 * G
    t = m_offs // G
    g = m_offs % G
    d = tl.arange(0, D)
    q_row = (b * K1 + t).to(tl.int64) * stride_qn + (kvh * G + g).to(tl.int64) * stride_qh
    q = tl.load(Q + q_row[:, None] + d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float16)
    lim = seq_len - K1 + 1 + t  # positions visible to each row

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    head_off = kvh.to(tl.int64) * stride_ch
    rows_off = tl.arange(0, BLOCK_N).to(tl.int64) * stride_cp

    for start_n in range(start, end, BLOCK_N):
        n = start_n + tl.arange(0, BLOCK_N)
        n_ok = n < end
        if PAGE % BLOCK_N == 0:  # tiles are BLOCK_N-aligned: one page per tile, one block id
            blk = tl.load(bt_row + start_n // PAGE).to(tl.int64)
            base = (blk * stride_cb + head_off + (start_n % PAGE) * stride_cp) + rows_off
        else:
            blk = tl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(tl.int64)
            base = blk * stride_cb + (n % PAGE).to(tl.int64) * stride_cp + head_off

        # ---- scores [BLOCK_M, BLOCK_N] ----
        if KEY_FP8:
            kb = tl.load(KV + base[:, None] + d[None, :], mask=n_ok[:, None], other=0)
            if FP8_E4B15:
                kf = kb.to(tl.float8e4b15, bitcast=True).to(tl.float16)
            else:
                kf = kb.to(tl.float8e4nv, bitcast=True).to(tl.float16)
            s = tl.dot(q, tl.trans(kf))
        else:
            kidx = _unpack_bits(KV, base, n_ok, 0, KEY_BITS, D, BLOCK_N, GATHER)
            c = tl.load(CENT + kidx)
            k_mul = _load_fp16(KV, base + MSE_BYTES, n_ok)
            if NORM_CORRECTION:
                k_mul = k_mul / tl.sqrt(tl.sum(c * c, axis=1) + 1e-16)
            s = tl.dot(q, tl.trans(c.to(tl.float16))) * k_mul[None, :]
        s = s * qk_scale
        visible = n_ok[None, :] & (n[None, :] < lim[:, None])
        s = tl.where(visible, s, float("-inf"))

        # ---- online softmax (base 2) ----
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        # ---- values ----
        vidx = _unpack_bits(KV, base, n_ok, KPS, VAL_BITS, D, BLOCK_N, GATHER).to(tl.float16)
        v_scale = _load_fp16(KV, base + KPS + VAL_DATA_BYTES, n_ok)
        v_zero = _load_fp16(KV, base + KPS + VAL_DATA_BYTES + 2, n_ok)
        s_max = tl.maximum(tl.max(v_scale, axis=0), 1e-30)
        w = (p * (v_scale / s_max)[None, :]).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(w, vidx) * s_max + tl.sum(p * v_zero[None, :], axis=1)[:, None]
        m_i = m_new

    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    mid = MID + (b * K1 + t).to(tl.int64) * stride_mr + (kvh * G + g).to(tl.int64) * stride_mh + sid * stride_ms
    tl.store(mid[:, None] + d[None, :], out, mask=row_ok[:, None])
    tl.store(mid + D, lse2, mask=row_ok)


@triton.jit
def _tq_verify_stage2(
    MID, OUT,
    stride_mr, stride_mh, stride_ms,
    stride_on, stride_oh,
    NUM_SPLITS,
    D: tl.constexpr,
    SPLIT4: tl.constexpr = False,
    S_POW2: tl.constexpr = 1,
    UNROLL: tl.constexpr = 8,
):
    """Merges the split-KV partials (every split writes one; an empty split, or a row that sees none
    of its positions, has log-sum-exp -inf). Up to 16 splits (S_POW2 <= 16): one split after the
    other with a running maximum. More: the log-sum-exps of all splits (S_POW2 >= NUM_SPLITS) are
    read at once for the common maximum, the sum and the last split a row sees, then the outputs up
    to it UNROLL splits at a time: no load waits for an earlier split, so the merge costs a few memory
    round trips instead of one or two per split, and the empty splits past a short request's end
    (the one-request plan's) are not read. Outputs of splits with weight 0 are not used. SPLIT4:
    partial column ``e * D/4 + j`` holds element ``4j + e`` (stage 1 stores each sub-tile
    contiguously)."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, D)
    if SPLIT4:
        col = (d % 4) * (D // 4) + d // 4
    else:
        col = d
    base = MID + r.to(tl.int64) * stride_mr + h.to(tl.int64) * stride_mh
    acc = tl.zeros([D], tl.float32)
    if S_POW2 <= 16:
        m = float("-inf")
        l = 0.0
        for s in range(NUM_SPLITS):
            lse = tl.load(base + s * stride_ms + D)
            if lse > float("-inf"):
                o = tl.load(base + s * stride_ms + col)
                m_new = tl.maximum(m, lse)
                a = tl.exp2(m - m_new)
                w = tl.exp2(lse - m_new)
                acc = acc * a + o * w
                l = l * a + w
                m = m_new
    else:
        sp = tl.arange(0, S_POW2)
        lse_all = tl.load(base + sp * stride_ms + D, mask=sp < NUM_SPLITS, other=float("-inf"))
        m = tl.max(lse_all, axis=0)
        m = tl.where(m == float("-inf"), 0.0, m)
        l = tl.sum(tl.exp2(lse_all - m), axis=0)
        last = tl.max(tl.where(lse_all > float("-inf"), sp + 1, 0), axis=0)
        for s0 in range(0, last, UNROLL):
            for j in tl.static_range(UNROLL):
                sj = tl.full([1], j, tl.int32) + s0  # ([1]: a tensor under the interpreter too)
                ok = sj < last
                lse = tl.load(base + sj * stride_ms + D, mask=ok, other=float("-inf"))
                o = tl.load(base + sj * stride_ms + col, mask=(d >= 0) & ok, other=0.0)
                w = tl.exp2(lse - m)
                acc += tl.where(w > 0.0, o * w, 0.0)
    res = acc / tl.where(l > 0.0, l, 1.0)
    tl.store(OUT + r.to(tl.int64) * stride_on + h.to(tl.int64) * stride_oh + d, res.to(OUT.dtype.element_ty))


# --------------------------------------------------------------------------------------
# v2: word loads, register field extraction, no int->float conversions on the tile
# --------------------------------------------------------------------------------------
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
    if KEY_FP8 and FP8_ASM and ASM_SPLIT:  # one byte position at a time, next to its dot
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
        vt = _idx_f16(_unpack_3bit(cva, cvb, cvc, D, BLOCK_N), 7) - 1028.0
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
            v0 = _idx_f16(cva, 15) - 1032.0
            v1 = _idx_f16(cva >> 4, 15) - 1032.0
            v2 = _idx_f16(cva >> 8, 15) - 1032.0
            v3 = _idx_f16(cva >> 12, 15) - 1032.0
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

# --------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------
@dataclass
class VerifyWorkspace:
    """Split-KV partials ``float32[rows, Hq, splits, D+1]``; rows = max_num_seqs x (K+1).

    Allocate it before CUDA-graph capture and pass it on every call: the captured graph then
    keeps pointing at the same memory.
    """

    mid: torch.Tensor

    @classmethod
    def allocate(
        cls,
        max_num_seqs: int,
        max_query_len: int,
        num_q_heads: int,
        head_dim: int,
        max_kv_splits: int | None = None,
        device: torch.device | str = "cuda",
    ) -> "VerifyWorkspace":
        """``max_kv_splits`` None: DEFAULT_MAX_KV_SPLITS, or more when ``max_num_seqs`` is so small
        that one request's rows would not hold SMALL_BATCH_MAX_SPLITS partials (the split plan of
        single requests, :func:`gluon_split_plan`; fewer rows than allocated may use more splits)."""
        from vllm_platform_ext.ops.turboquant.routing import workspace_rows

        rows = workspace_rows(max_num_seqs, max_query_len - 1)
        if max_kv_splits is None:
            per_seq = triton.cdiv(SMALL_BATCH_MAX_SPLITS, max(1, max_num_seqs))
            max_kv_splits = max(DEFAULT_MAX_KV_SPLITS, per_seq)
        mid = torch.empty(rows, num_q_heads, max_kv_splits, head_dim + 1, dtype=torch.float32, device=device)
        return cls(mid)

    @property
    def rows(self) -> int:
        return self.mid.shape[0]

    @property
    def max_kv_splits(self) -> int:
        return self.mid.shape[2]


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def default_num_kv_splits(num_reqs: int, num_kv_heads: int, m_chunks: int, device: torch.device, max_splits: int) -> int:
    """Enough programs for ~2 waves; depends only on shapes (stable under CUDA graphs)."""
    progs = max(1, num_reqs * num_kv_heads * m_chunks)
    want = triton.cdiv(2 * _num_sms(device), progs)
    return int(max(1, min(max_splits, want)))


# Defaults from the H200 sweep in benchmarks/bench_turboquant.py --tune (B=64, K=3, 32K, 24/4 heads);
# any of them can be overridden per call.
LAUNCH_DEFAULTS = {
    "fp8": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 3, "GATHER": False},
    "mse": {"BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "GATHER": False},
}


def v2_num_kv_splits(num_reqs: int, num_kv_heads: int, m_chunks: int, device: torch.device, max_splits: int,
                     waves: int | None = None) -> int:
    """Split count for the word-load kernel: ~``waves`` (default V2_SPLIT_WAVES) programs per SM
    (more programs in flight hide the dependent block-table -> cache load latency); depends only
    on shapes."""
    progs = max(1, num_reqs * num_kv_heads * m_chunks)
    want = triton.cdiv((waves or V2_SPLIT_WAVES) * _num_sms(device), progs)
    return int(max(1, min(max_splits, want)))


# v2 kernel (word loads): per key type
USE_V2 = True
LAST_KERNEL = ""  # stage-1 kernel of the last call: "gluon_k8v4", "gluon_mse", "v2" or "v1" (tests, profiling)
LAST_SPLITS = (0, 1)  # (split count, fewest tiles per split) of the last call (tests, profiling)
V2_SPLIT_WAVES = 4
V2_LAUNCH_DEFAULTS = {
    # Per preset, measured best on an H200 (B=64, K=3, 32K context, 24/4 heads, vLLM's page layout;
    # benchmarks/profile_turboquant.py sweep, numbers in benchmarks/RESULTS_turboquant.md).
    # FP8_ASM / NIB_ASM: PTX dequant (cvt.rn.f16x2.e4m3x2 for fp8 keys on SM >= 8.9, lop3 for 4-bit
    # value nibbles); elsewhere (interpreter, SM < 8.9 fp8 keys) the portable shift/mask path runs.
    # PREFETCH: register double buffer of the next tile (helps 3-bit keys only).
    # MAX_BLOCK_M: more query rows run as row chunks of this size (chunks of one request and KV head
    # are launched next to each other and share the KV tiles through L2); WARPS_M64: num_warps
    # when BLOCK_M is 64.
    "turboquant_k8v4": {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "PREFETCH": False, "FP8_ASM": True,
                        "NIB_ASM": True, "MAX_BLOCK_M": 32},
    "turboquant_4bit_nc": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "PREFETCH": False, "NIB_ASM": True,
                           "MAX_BLOCK_M": 64},
    "turboquant_k3v4_nc": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "PREFETCH": False, "NIB_ASM": True,
                           "MAX_BLOCK_M": 64, "WARPS_M64": 8},
    "turboquant_3bit_nc": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "PREFETCH": True, "MAX_BLOCK_M": 32},
}


# Shape rules on top of V2_LAUNCH_DEFAULTS, first match wins. They look at shapes only (number of
# requests, K+1, KV heads, row chunks), never at sequence lengths, so a CUDA graph captured with
# dummy lengths keeps the right choice. "programs" = requests x KV heads x row chunks.
# Measured on an H200 (benchmarks/profile_turboquant.py grid, benchmarks/runs/2026-11-22-turboquant-tuning/SWEEP_turboquant.txt):
#  - plain decode with >= 128 programs: BLOCK_N 64, one dot's operand converted at a time
#    (ASM_SPLIT) and at most 168 registers (3 programs per SM): 1.09-1.13x at B = 32/64, 4K and 32K;
#  - small verify batches (<= 32 programs and K+1 <= 4, or <= 8 programs): BLOCK_N 64 with 3 stages:
#    1.13-1.49x at 4K context and for one request; B = 8 at 32K loses 5-7% (K+1 = 2..4; K = 5 is
#    left out: 0.82x at 32K). The split count cannot see the context length (CUDA graphs).
V2_SHAPE_RULES = {
    "turboquant_k8v4": [
        {"k1": (1, 1), "programs": (128, None), "set": {"BLOCK_N": 64, "ASM_SPLIT": True, "maxnreg": 168}},
        {"k1": (2, 4), "programs": (1, 32), "set": {"BLOCK_N": 64, "num_stages": 3}},
        {"k1": (5, None), "programs": (1, 8), "set": {"BLOCK_N": 64, "num_stages": 3}},
    ],
}


# Explicit-layout (Gluon) kernel, gluon_verify.py: where Triton has Gluon, every preset takes it instead
# of the v2 kernel (k8v4 on SM >= 8.9, which converts fp8 in hardware; the MSE presets on SM >= 8.0).
# Measured on an H200 (benchmarks/profile_turboquant.py grid benchmarks/runs/2026-11-22-turboquant-tuning/turboquant_grid_*.json, log in
# benchmarks/runs/2026-11-22-turboquant-tuning/SWEEP_turboquant.txt): one stage and at most 168 registers (3 programs per SM) is the fastest setting
# almost everywhere (k8v4 B = 64, K = 3, 32K, 24/4: 1.83 ms vs 2.09 ms with two stages, 2.44 ms for v2).
# WM x WN: warps along the rows (16 each, at most BLOCK_M/16) x along the positions. MAX_BLOCK_M: query
# rows per program (more go to row chunks). SPLIT_FIT: split-KV count from gluon_num_kv_splits (whole
# waves of 3 programs per SM: 1.05-1.2x over ~4 programs per SM on 12 of 13 grid cases).
# MSE presets: tiles staged through registers (one shared buffer), PREFETCH reads the next tile's
# block-table entries while this tile is staged (1.02-1.06x), FOLD looks 4-bit keys up in the
# symmetric codebook's positive half (1.13x at 4bit_nc B = 64, K = 3, 32K).
USE_GLUON = True
GLUON_LAUNCH_DEFAULTS = {
    "turboquant_k8v4": {"BLOCK_N": 64, "num_stages": 1, "WM": 1, "WN": 4, "maxnreg": 168, "MAX_BLOCK_M": 32,
                        "SPLIT_FIT": True, "TRANSPOSED_ROWS": 8},
    "turboquant_4bit_nc": {"BLOCK_N": 64, "num_stages": 1, "WM": 1, "WN": 4, "maxnreg": 168, "MAX_BLOCK_M": 32,
                           "PREFETCH": True, "FOLD": True, "SPLIT_FIT": True, "TRANSPOSED_ROWS": 8},
    "turboquant_k3v4_nc": {"BLOCK_N": 64, "num_stages": 1, "WM": 1, "WN": 4, "maxnreg": 168, "MAX_BLOCK_M": 32,
                           "PREFETCH": True, "FOLD": True, "SPLIT_FIT": True, "TRANSPOSED_ROWS": 8},
    "turboquant_3bit_nc": {"BLOCK_N": 64, "num_stages": 1, "WM": 1, "WN": 4, "maxnreg": 168, "MAX_BLOCK_M": 32,
                           "PREFETCH": True, "FOLD": True, "SPLIT_FIT": True, "TRANSPOSED_ROWS": 8},
}
# First match wins; shapes only (see V2_SHAPE_RULES). Programs counted with 32-row chunks.
#  - <= 8 programs (one request): two stages, no register cap: 1.08x over the default (B = 1, K = 3);
#  - K+1 >= 5 (36+ rows): all rows in one 64-row program instead of two 32-row chunks (each chunk
#    re-reads the tile), two stages: 1.10x at B = 64, 1.20x at B = 8 (32K), equal at B = 8 (4K).
#  - k8v4 K+1 = 1-4 over > 8 programs: block-table entries read one issue ahead (PREFETCH): plain decode
#    1.02-1.04x (B = 32/64, 24/4 and 16/2); K+1 = 2 1.02-1.06x, K+1 = 3-4 on the warpgroup-MMA form
#    1.03-1.05x (24/4 B = 64 32K K = 3 1.61 -> 1.54 ms; 16/2 K+1 = 4, then still on the row-major
#    kernel, 0.99x, within spread); K+1 >= 5 0.98-1.00x: off there (log S2, S3; session 6 measured the
#    row-major kernel at K = 3 0.99-1.00x).
#  - MSE presets (one shared buffer, so no stage changes): <= 8 programs: no register cap, 1.10x
#    (3bit_nc B = 1, K = 3, 32K); K+1 >= 5: one 64-row program, no cap, 1.12-1.18x (3bit_nc, 4bit_nc
#    B = 64 and B = 8 at 32K, k3v4_nc B = 8 at 4K).
#  - plain decode over >= 256 programs: register cap 80 for k8v4 (6 programs per SM); over >= 128: 128
#    for MSE (4 per SM). The split-KV programs then fit one wave instead of ~2 at 3 per SM: k8v4 24/4 B = 64 4K
#    1.05-1.06x, 32K 1.01x; 4bit_nc B = 32/64 1.04-1.07x, 3bit_nc B = 64 1.03-1.04x, k3v4_nc 1.05x. With fewer
#    programs the lower cap is slower (0.93-0.98x: k8v4 B = 32 and 16/2 B = 64, MSE B = 8).
#  - TRANSPOSED_ROWS: rows per (request, KV head) up to which the transposed kernel runs (rows as the
#    MMA's N in groups of 8): by default plain decode with GQA <= 8 (1.00-1.08x k8v4, 1.08-1.11x MSE);
#    K+1 = 6 with GQA 6 (36 rows as 32 + 8, not 64) over >= 256 programs too, no cap: 1.21x k8v4
#    (two stages), 1.28x 4bit_nc / 3bit_nc (B = 64, 32K); equal or slower at B = 8 (4K), and for 12,
#    16, 24 and 48 rows (0.66-0.95x: per-row softmax reductions across 8 lanes cost more than the
#    saved MMAs).
#  - k8v4 K+1 >= 5 over > 8 programs on Hopper (WGMMA, SM 9.0 only): the transposed kernel on
#    warpgroup MMAs for up to WG_ROWS = 48 rows (36 as 32 + 8, 48 as 32 + 16; 49-64 rows would spill),
#    two stages, no cap, one chunk of MMAs in flight (WG_DEPTH 1): 1.06-1.09x over the mma.sync
#    kernels at 24/4 (B = 64 32K, B = 32 4K), 1.11-1.13x at 16/2 B = 64, 1.22x at 24/4 B = 8 4K; with
#    these settings K+1 = 4 (24 / 32 rows) was 0.94-0.98x (it has its own, next), MSE presets at K+1 = 6
#    1.00-1.03x: off there (log Q1, Q2).
#  - k8v4 K+1 = 3-4 over > 8 programs on Hopper: the warpgroup-MMA form for up to 32 rows (24/4
#    heads: 16 + 8; 16/2 heads at K+1 = 4: one group of 32), one stage, the 168-register cap, no
#    chunk in flight (WG_DEPTH 0): 1.04-1.09x over the row-major kernel at 24 rows (24/4 B = 64 32K
#    K+1 = 4 1.78 -> 1.64 ms, K+1 = 3 1.09x; B = 8 1.05-1.07x; log R2), 1.02-1.09x at 32 rows (16/2
#    B = 64 32K 0.874 -> 0.801 ms, with PREFETCH; it lost before the row sums were folded, 0.73-0.87x:
#    log S8); 24 rows as one group of 32 0.94-0.96x; K+1 = 2 (12-16 rows) is 1-3% faster on the
#    row-major kernel (log R2).
_K5_WGMMA = {"WGMMA": True, "WG_ROWS": 48, "WG_DEPTH": 1}
_MSE_RULES = [
    {"k1": (1, None), "programs": (1, 8), "set": {"maxnreg": None}},
    {"k1": (1, 1), "programs": (128, None), "set": {"maxnreg": 128}},
    {"k1": (5, None), "programs": (256, None), "set": {"MAX_BLOCK_M": 64, "maxnreg": None, "TRANSPOSED_ROWS": 40}},
    {"k1": (5, None), "programs": (1, None), "set": {"MAX_BLOCK_M": 64, "maxnreg": None}},
]
GLUON_SHAPE_RULES = {
    "turboquant_k8v4": [
        {"k1": (1, None), "programs": (1, 8), "set": {"num_stages": 2, "maxnreg": None}},
        {"k1": (5, None), "programs": (256, None),
         "set": {"MAX_BLOCK_M": 64, "num_stages": 2, "maxnreg": None, "TRANSPOSED_ROWS": 40, **_K5_WGMMA}},
        {"k1": (5, None), "programs": (1, None),
         "set": {"MAX_BLOCK_M": 64, "num_stages": 2, "maxnreg": None, **_K5_WGMMA}},
        {"k1": (3, 4), "programs": (9, None), "set": {"WGMMA": True, "WG_ROWS": 32, "WG_DEPTH": 0, "PREFETCH": True}},
        {"k1": (1, 1), "programs": (256, None), "set": {"PREFETCH": True, "maxnreg": 80}},
        {"k1": (1, 2), "programs": (9, None), "set": {"PREFETCH": True}},
    ],
    "turboquant_4bit_nc": _MSE_RULES,
    "turboquant_k3v4_nc": _MSE_RULES,
    "turboquant_3bit_nc": _MSE_RULES,
}


def gluon_ctas_per_sm(cfg: dict, rows: int = 32, key_fp8: bool = True) -> int:
    """Programs of the Gluon kernel one SM holds at once: the fewest that its register cap (no cap:
    assume 255) and warps allow (168 registers x 4 warps -> 3) and that its shared memory allows
    (``gluon_shared_bytes`` per program, 228 KB per SM, 1 KB reserved per program)."""
    regs = cfg.get("maxnreg") or 255
    warps = cfg["WM"] * cfg["WN"]
    by_regs = 65536 // (regs * 32 * warps)
    by_smem = (228 * 1024) // (gluon_shared_bytes(cfg, rows, key_fp8) + 1024)
    return max(1, min(by_regs, by_smem, 64 // warps))


def gluon_shared_bytes(cfg: dict, rows: int, key_fp8: bool) -> int:
    """Shared memory of one Gluon program (at most 1 KB over what the compiler allocates) holding
    ``rows`` query rows (padded as the kernel pads them): per stage, a tile of key words (64 per
    position for fp8, 32 for index words), 32 value words and the scale/zero word (plus the key
    norm for MSE); the fp16 query [rows, 256] and the softmax weights [rows, BLOCK_N]."""
    bn = cfg["BLOCK_N"]
    stage = bn * ((64 if key_fp8 else 33) + 32 + 1) * 4
    return cfg["num_stages"] * stage + rows * 512 + rows * bn * 2 + 1024


def gluon_num_kv_splits(programs: int, device: torch.device, max_splits: int, ctas_per_sm: int,
                        min_fill: float = 0.85) -> int:
    """Split count that fills whole waves: the smallest s whose programs x s make at least ~one wave
    of the GPU's program slots (SMs x ctas_per_sm) and fill their last wave to ``min_fill``. A split
    count that leaves a last wave mostly empty costs that whole wave (H200, k8v4 plain decode 16/2,
    B = 64, 32K: 5 splits = 1.6 waves 0.895 ms, 3 splits = 0.97 waves 0.750 ms). Shapes only."""
    slots = _num_sms(device) * ctas_per_sm
    for s in range(1, max_splits + 1):
        w = programs * s / slots
        if w >= 0.9 and w / math.ceil(w) >= min_fill:
            return s
    return int(max(1, min(max_splits, triton.cdiv(slots, max(1, programs)))))


# One request: where the programs at the usual split cap (DEFAULT_MAX_KV_SPLITS) fill at most half
# of the SMs (16/2 heads: 2 programs x 32 splits on 132 SMs) and a program holds at most
# SMALL_BATCH_MAX_ROWS rows, up to SMALL_BATCH_MAX_SPLITS splits, but none shorter than
# SMALL_BATCH_MIN_TILES tiles (or than the usual split, when that is shorter): 16K and 32K contexts
# spread over twice the SMs, 4K and 8K keep their splits. H200, 16/2 heads, B = 1, K = 0-3: 32K
# 1.25-1.44x, 16K 1.06-1.21x; 48-row programs (K+1 = 6) and 4 programs (24/4 heads) lose with more
# splits (benchmarks/runs/2026-11-22-turboquant-tuning/SWEEP_turboquant.txt, T1).
SMALL_BATCH_MAX_SPLITS = 64
SMALL_BATCH_MIN_TILES = 4
SMALL_BATCH_MAX_ROWS = 32


def gluon_split_plan(programs: int, device: torch.device, max_splits: int, ctas_per_sm: int, capacity: int,
                     rows: int) -> tuple[int, int]:
    """(split count, fewest tiles per split) of the Gluon kernels for ``programs`` (request, KV head,
    row chunk) programs of ``rows`` query rows each: ``gluon_num_kv_splits`` under ``max_splits``,
    one tile minimum; but where ``programs x DEFAULT_MAX_KV_SPLITS`` programs would fill at most half
    of the SMs and ``rows <= SMALL_BATCH_MAX_ROWS``, SMALL_BATCH_MAX_SPLITS splits (no more than
    ``capacity``, the splits the workspace holds for this call) of at least
    min(SMALL_BATCH_MIN_TILES, the tiles of a DEFAULT_MAX_KV_SPLITS split) tiles each
    (:func:`split_tiles`). Shapes only (stable under CUDA graphs)."""
    if programs * DEFAULT_MAX_KV_SPLITS <= _num_sms(device) // 2 and rows <= SMALL_BATCH_MAX_ROWS:
        splits = max(max_splits, min(SMALL_BATCH_MAX_SPLITS, capacity))
        if splits > DEFAULT_MAX_KV_SPLITS:
            return splits, SMALL_BATCH_MIN_TILES
    return gluon_num_kv_splits(programs, device, max_splits, ctas_per_sm), 1


def split_tiles(seq_len: int, num_splits: int, block_n: int, min_tiles: int = 1) -> int:
    """Tiles per split of a request of ``seq_len`` positions, as the kernels compute it: the length
    cut in ``num_splits`` whole-tile parts; with ``min_tiles`` > 1 no fewer than min(min_tiles, the
    tiles of a DEFAULT_MAX_KV_SPLITS split). Split s holds positions [s, s + 1) x tiles x block_n."""
    tiles = triton.cdiv(triton.cdiv(seq_len, num_splits), block_n)
    if min_tiles > 1:
        tiles = max(tiles, min(min_tiles, triton.cdiv(triton.cdiv(seq_len, DEFAULT_MAX_KV_SPLITS), block_n)))
    return tiles


def workspace_splits(mid: torch.Tensor, rows: int, num_q_heads: int, head_dim: int) -> int:
    """Split partials the workspace ``mid`` holds for a call of ``rows`` query rows: its split
    dimension, or more when it is contiguous and fewer rows leave room (:func:`_workspace_view`)."""
    if mid.is_contiguous() and rows > 0:
        return max(mid.shape[2], mid.numel() // (rows * num_q_heads * (head_dim + 1)))
    return mid.shape[2]


def _workspace_view(mid: torch.Tensor, rows: int, num_q_heads: int, splits: int, head_dim: int) -> torch.Tensor:
    """The workspace as ``[rows, num_q_heads, splits, head_dim + 1]``: itself when it is that large
    in every dimension, else (more splits than it was sized for, fewer rows) the front of its
    contiguous memory seen with those dimensions; a clear error when it cannot hold them."""
    if mid.shape[0] >= rows and mid.shape[1] >= num_q_heads and mid.shape[2] >= splits and mid.shape[3] >= head_dim + 1:
        return mid
    need = rows * num_q_heads * splits * (head_dim + 1)
    if mid.is_contiguous() and mid.shape[0] >= rows and mid.numel() >= need:
        return mid.view(-1)[:need].view(rows, num_q_heads, splits, head_dim + 1)
    raise ValueError(
        f"workspace {tuple(mid.shape)} too small for {rows} rows x {num_q_heads} heads x {splits} splits x "
        f"{head_dim + 1}: size it max_num_seqs x (K+1) rows (routing.workspace_rows)")


def _apply_rules(cfg: dict, rules, num_reqs: int, num_kv_heads: int, k1: int, m_chunks: int) -> dict:
    progs = num_reqs * num_kv_heads * m_chunks

    def within(x, bounds):
        lo, hi = bounds
        return x >= lo and (hi is None or x <= hi)

    for rule in rules:
        if within(k1, rule["k1"]) and within(progs, rule["programs"]):
            cfg.update(rule["set"])
            break
    return cfg


def gluon_launch_config(preset: str, num_reqs: int, num_kv_heads: int, k1: int, m_chunks: int) -> dict | None:
    """Launch settings of the Gluon kernel for this shape, or None when the preset has none."""
    if not USE_GLUON or preset not in GLUON_LAUNCH_DEFAULTS:
        return None
    return _apply_rules(dict(GLUON_LAUNCH_DEFAULTS[preset]), GLUON_SHAPE_RULES.get(preset, ()), num_reqs,
                        num_kv_heads, k1, m_chunks)


def v2_launch_config(preset: str, num_reqs: int, num_kv_heads: int, k1: int, m_chunks: int) -> dict:
    """Launch settings of the word-load kernel for this shape: the preset's table entry with the
    first matching V2_SHAPE_RULES entry applied."""
    return _apply_rules(dict(V2_LAUNCH_DEFAULTS[preset]), V2_SHAPE_RULES.get(preset, ()), num_reqs, num_kv_heads,
                        k1, m_chunks)


def _launch_config(rows: int, key_fp8: bool) -> dict:
    block_m = max(16, min(64, triton.next_power_of_2(rows)))
    return {"BLOCK_M": block_m, **LAUNCH_DEFAULTS["fp8" if key_fp8 else "mse"]}


def _default_e4b15(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9)


def turboquant_verify_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    num_query_per_req: int,
    *,
    preset: str,
    scale: float,
    centroids: torch.Tensor | None = None,
    PiT: torch.Tensor | None = None,
    fp8_e4b15: bool | None = None,
    workspace: VerifyWorkspace | None = None,
    out: torch.Tensor | None = None,
    num_kv_splits: int | None = None,
    BLOCK_M: int | None = None,
    BLOCK_N: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    GATHER: bool | None = None,
    gluon: bool | None = None,
) -> torch.Tensor:
    """Attention of a uniform K+1 batch over a TurboQuant cache.

    query ``[B*(K+1), Hq, D]`` (request ``b`` owns rows ``b*(K+1) .. b*(K+1)+K``, in order);
    kv_cache ``uint8[num_blocks, block_size, Hk, slot]`` (any strides); block_table
    ``int32[>=B, max_blocks]``; seq_lens ``int32[B]`` (context length including the K+1 new
    tokens, which must already be stored). Returns ``[B*(K+1), Hq, D]`` in query dtype
    (written into ``out`` when given). ``num_query_per_req = 1`` is plain decode.
    ``gluon=False`` keeps every preset on the Triton kernel (None: the Gluon kernel where it can run).
    """
    if query.dim() != 3:
        raise ValueError(f"query must be [tokens, num_q_heads, head_dim], got shape {tuple(query.shape)}")
    n, hq, d = query.shape
    lay = layout_for(preset, d)
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"query dtype {query.dtype} unsupported (float16, bfloat16, float32)")
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 4:
        raise ValueError(
            f"kv_cache must be uint8[num_blocks, block_size, num_kv_heads, slot], got {kv_cache.dtype} {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[3] < lay.slot_size:
        raise ValueError(f"kv_cache slot {kv_cache.shape[3]} B < {preset} slot {lay.slot_size} B at head dim {d}")
    hk = kv_cache.shape[2]
    if hq % hk:
        raise ValueError(f"num_q_heads {hq} is not a multiple of num_kv_heads {hk}")
    k1 = int(num_query_per_req)
    b = seq_lens.shape[0]
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be int32[num_reqs], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if k1 < 1 or n != b * k1:
        raise ValueError(f"query rows {n} != num_reqs {b} x num_query_per_req {k1} (batch is not uniform)")
    if block_table.dim() != 2 or block_table.dtype != torch.int32 or block_table.shape[0] < b:
        raise ValueError(f"block_table must be int32[>= {b}, max_blocks], got {block_table.dtype} {tuple(block_table.shape)}")
    if query.stride(2) != 1 or kv_cache.stride(3) != 1 or block_table.stride(1) != 1:
        raise ValueError("query, kv_cache and block_table need a contiguous last dimension")
    dev = query.device
    for name, t in (("kv_cache", kv_cache), ("block_table", block_table), ("seq_lens", seq_lens)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, query on {dev}")

    if lay.key_fp8:
        q_in = query
        cent = kv_cache  # unused by the fp8 path; any pointer will do
    else:
        if PiT is None or centroids is None:
            raise ValueError(f"{preset}: MSE keys need PiT [D, D] and centroids [{2 ** lay.key_bits}]")
        if tuple(PiT.shape) != (d, d):
            raise ValueError(f"PiT must be [{d}, {d}], got {tuple(PiT.shape)}")
        if centroids.numel() != 2**lay.key_bits or centroids.dtype != torch.float32:
            raise ValueError(
                f"{preset}: centroids must be float32[{2 ** lay.key_bits}], got {centroids.dtype} {tuple(centroids.shape)}"
            )
        q_in = query.float() @ PiT.float()
        cent = centroids.contiguous()
    if fp8_e4b15 is None:
        fp8_e4b15 = _default_e4b15(dev)

    rows = k1 * (hq // hk)
    cfg = _launch_config(rows, lay.key_fp8)
    kv16, kv32 = _word_views(kv_cache) if (USE_V2 and d >= 64) else (None, None)
    max_block_m = V2_LAUNCH_DEFAULTS[preset].get("MAX_BLOCK_M", 64) if kv16 is not None else 64
    gcfg = None
    if kv16 is not None and gluon is not False and _gluon_usable(lay, kv32, bool(fp8_e4b15), dev, d):
        gcfg = gluon_launch_config(preset, b, hk, k1, triton.cdiv(rows, min(cfg["BLOCK_M"], 32)))
        if gcfg is not None:  # (a fresh dict:) the caller's tile and stage overrides, resolved once
            gcfg.update(BLOCK_N=BLOCK_N or gcfg["BLOCK_N"], num_stages=num_stages or gcfg["num_stages"])
            max_block_m = gcfg.get("MAX_BLOCK_M", max_block_m)
    block_m = BLOCK_M or min(cfg["BLOCK_M"], max_block_m)
    block_n = BLOCK_N or cfg["BLOCK_N"]
    m_chunks = triton.cdiv(rows, block_m)
    max_splits = workspace.max_kv_splits if workspace is not None else DEFAULT_MAX_KV_SPLITS
    if workspace is not None:
        mid = workspace.mid
        if mid.device != dev or mid.dtype != torch.float32:
            raise ValueError(f"workspace must be float32 on {dev}, got {mid.dtype} on {mid.device}")
    min_tiles = 1  # fewest tiles per split (Gluon kernels; the others always split by 1)
    v2 = v2_launch_config(preset, b, hk, k1, m_chunks) if kv16 is not None else {}
    # up to TRANSPOSED_ROWS rows per (request, KV head): the transposed Gluon kernel (rows as the MMA's N);
    # on Hopper with WGMMA, up to WG_ROWS rows its warpgroup-MMA form (M = the tile's positions: a multiple of 64)
    wg = (gcfg is not None and bool(gcfg.get("WGMMA")) and gcfg["BLOCK_N"] % 64 == 0
          and _wgmma_ok(dev))
    trans_rows = max(gcfg.get("TRANSPOSED_ROWS", 8), gcfg.get("WG_ROWS", 0) if wg else 0) if gcfg is not None else 0
    trans = gcfg is not None and rows <= min(64, trans_rows)
    if gcfg is not None and gcfg.get("SPLIT_FIT") and not gcfg.get("SPLIT_WAVES"):
        prog_rows = sum(transposed_row_groups(rows)) if trans else block_m
        ctas = gluon_ctas_per_sm(gcfg, prog_rows, lay.key_fp8)
        if num_kv_splits:
            splits = num_kv_splits
        else:
            capacity = workspace_splits(mid, n, hq, d) if workspace is not None else SMALL_BATCH_MAX_SPLITS
            splits, min_tiles = gluon_split_plan(b * hk * (1 if trans else m_chunks), dev, max_splits, ctas,
                                                 capacity, prog_rows)
    elif kv16 is not None:
        waves = (gcfg or v2).get("SPLIT_WAVES")
        splits = num_kv_splits or v2_num_kv_splits(b, hk, m_chunks, dev, max_splits, waves)
    else:
        splits = num_kv_splits or default_num_kv_splits(b, hk, m_chunks, dev, max_splits)

    if workspace is None:
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("turboquant_verify_attention: allocate a VerifyWorkspace before CUDA-graph capture")
        mid = torch.empty(n, hq, splits, d + 1, dtype=torch.float32, device=dev)
    else:
        mid = _workspace_view(mid, n, hq, splits, d)
    if out is None:
        out = torch.empty(n, hq, d, dtype=query.dtype, device=dev)
    elif tuple(out.shape) != (n, hq, d) or out.stride(2) != 1:
        raise ValueError(f"out must be [{n}, {hq}, {d}] with a contiguous last dim, got {tuple(out.shape)}")
    if n == 0:
        return out

    if kv16 is not None and gcfg is None:  # the v2 kernel's launch values
        if BLOCK_N:
            v2["BLOCK_N"] = BLOCK_N
        if block_m >= 64 and "WARPS_M64" in v2:
            v2["num_warps"] = v2["WARPS_M64"]
        cent16 = cent.to(torch.float16) if not lay.key_fp8 else kv16
        asm_ok = dev.type == "cuda" and not _interpreting()
        fp8_asm = bool(v2.get("FP8_ASM", False) and asm_ok and lay.key_fp8 and kv32 is not None and not fp8_e4b15
                       and torch.cuda.get_device_capability(dev) >= (8, 9))
        nib_asm = bool(v2.get("NIB_ASM", False) and asm_ok and lay.value_bits == 4)
        key_scale = 1.0 if (not lay.key_fp8 or fp8_e4b15 or fp8_asm) else 256.0
    global LAST_KERNEL
    if gcfg is not None:  # (only set with the word views)
        from vllm_platform_ext.ops.turboquant import gluon_verify as GV

        LAST_KERNEL = ("gluon_wg_" if trans and wg else "gluon_t_" if trans else "gluon_") + (
            "k8v4" if lay.key_fp8 else "mse")
        # the kernels read the query as it is: scaled by softmax scale * log2(e) (keys decoded exactly),
        # converted to fp16 and put in the key decodes' head-dim order (gluon_query_order) in-kernel
        wm = min(gcfg["WM"], block_m // 16)  # warps along the rows (16 each) x along the positions
        wn = gcfg["WN"]
        if lay.key_fp8:
            kv, lut, units = kv32, kv32, 4  # (no codebook: any pointer for LUT)
            key_args = dict(PREFETCH=bool(gcfg.get("PREFETCH", False)))
        else:
            lut, fold = _codebook_tables(cent, lay.key_bits, gcfg.get("FOLD", True))
            kv, units = kv16, 2
            key_args = dict(KEY_BITS=lay.key_bits, VAL_BITS=lay.value_bits, NORM_W=lay.mse_bytes // 2,
                       NORM_CORRECTION=lay.norm_correction, PREFETCH=bool(gcfg.get("PREFETCH", False)), FOLD=fold)
        args = (q_in, kv, block_table, seq_lens, lut, mid,
                q_in.stride(0), q_in.stride(1),
                kv.stride(0), kv.stride(1), kv.stride(2),
                block_table.stride(0),
                mid.stride(0), mid.stride(1), mid.stride(2),
                float(scale) * _LOG2E, k1, splits)
        common = dict(G=hq // hk, PAGE=kv_cache.shape[1], BLOCK_N=gcfg["BLOCK_N"],
                      VAL_W=lay.key_packed_size // units, SZ_W=lay.scale_offset // units,
                      STAGES=gcfg["num_stages"], MIN_TILES=min_tiles, BASE_SPLITS=DEFAULT_MAX_KV_SPLITS, **key_args,
                      **({"maxnreg": gcfg["maxnreg"]} if gcfg.get("maxnreg") else {}))
        if trans:  # every warp along the positions (WG: one warpgroup on Hopper MMAs)
            ra, rb = transposed_row_groups(rows)
            nw = 4 if wg else gcfg["WM"] * wn
            wg_args = dict(WG=True, WG_DEPTH=gcfg.get("WG_DEPTH", 1)) if wg else {}
            GV._tq_verify_t_gluon[(hk, b, splits)](*args, RA=ra, RB=rb, NW=nw, num_warps=nw, **wg_args, **common)
        else:
            GV._tq_verify_gluon[(hk * m_chunks, b, splits)](*args, BLOCK_M=block_m, M_CHUNKS=m_chunks, WM=wm, WN=wn,
                                                            num_warps=wm * wn, **common)
    elif kv16 is not None:
        LAST_KERNEL = "v2"
        _tq_verify_v2[(hk * m_chunks, b, splits)](
            q_in, kv16, kv32 if (lay.key_fp8 and kv32 is not None) else kv16, block_table, seq_lens, cent16, mid,
            q_in.stride(0), q_in.stride(1),
            kv16.stride(0), kv16.stride(1), kv16.stride(2),
            block_table.stride(0),
            mid.stride(0), mid.stride(1), mid.stride(2),
            float(scale) * _LOG2E * key_scale,
            k1, splits,
            G=hq // hk, BLOCK_M=block_m, M_CHUNKS=m_chunks,
            D=d, PAGE=kv_cache.shape[1], BLOCK_N=v2["BLOCK_N"],
            KEY_FP8=lay.key_fp8, KEY_W32=bool(lay.key_fp8 and kv32 is not None), KEY_BITS=lay.key_bits,
            NORM_W=lay.mse_bytes // 2, NORM_CORRECTION=lay.norm_correction, VAL_BITS=lay.value_bits,
            VAL_W=lay.key_packed_size // 2, SZ_W=lay.scale_offset // 2, PREFETCH=bool(v2["PREFETCH"]),
            FP8_ASM=fp8_asm, NIB_ASM=nib_asm, ASM_SPLIT=bool(v2.get("ASM_SPLIT", False)),
            num_warps=num_warps or v2["num_warps"], num_stages=num_stages or v2["num_stages"],
            **({"maxnreg": v2["maxnreg"]} if v2.get("maxnreg") and asm_ok else {}),
        )
    else:
        LAST_KERNEL = "v1"
        _launch_v1(q_in, kv_cache, block_table, seq_lens, cent, mid, scale, k1, splits, hq, hk, block_m, m_chunks,
                   d, block_n, lay, fp8_e4b15, cfg, GATHER, num_warps, num_stages)
    global LAST_SPLITS
    LAST_SPLITS = (splits, min_tiles)
    _tq_verify_stage2[(n, hq)](
        mid, out,
        mid.stride(0), mid.stride(1), mid.stride(2),
        out.stride(0), out.stride(1),
        splits,
        D=d, S_POW2=triton.next_power_of_2(splits),
        SPLIT4=bool(gcfg is not None or (kv16 is not None and lay.value_bits == 4)),  # Gluon: always split
        num_warps=4 if d >= 256 else 2,
    )
    return out


def transposed_row_groups(rows: int) -> tuple[int, int]:
    """Row groups (RA, RB) of the transposed Gluon kernel for ``rows`` query rows per (request, KV
    head): powers of two (RB may be 0) covering ``rows`` rounded up to a multiple of 8, e.g. 6 -> (8, 0),
    24 -> (16, 8), 36 -> (32, 8), 48 -> (32, 16), 56 -> (32, 32)."""
    if not 1 <= rows <= 64:
        raise ValueError(f"the transposed kernel takes 1..64 rows per KV head, got {rows}")
    r8 = 8 * triton.cdiv(rows, 8)
    ra = 1 << (r8.bit_length() - 1)
    rb = r8 - ra
    return ra, (triton.next_power_of_2(rb) if rb else 0)


def gluon_query_order(q: torch.Tensor) -> torch.Tensor:
    """The query [n, heads, 256] with its head dim in the Gluon kernels' order: column
    ``m * 64 + 16 c + r`` (sub-tile m, 16-wide chunk c, MMA k-row r = 2t + i + 8h; the operand
    layout gives a thread the register pairs of k-rows 2t + 8h, 2t + 8h + 1) holds the element that
    the key decodes pair with it, 4 (16c + 2t + 8h + m // 2) + 2 (m % 2) + i, for both key kinds:

    * fp8 keys (``ptx.FP8W``): k-row 2t + 8h + i reads key word 16c + 2t + 8h + i, and sub-tile m
      takes bytes 2 (m % 2), +1 of word 16c + 2t + 8h + m // 2;
    * MSE index words (``ptx.LUT8W`` ...): k-rows 2t + 8h, +1 read staged word w = 8c + t + 4h
      (halfwords 2w, 2w + 1; halfword j holds elements 4j..4j+3), and sub-tile m takes nibbles
      2 (m % 2), +1 of its halfword m // 2.

    In digits, element (c, h, t, m // 2, m % 2, i) goes to column (m // 2, m % 2, c, h, t, i): one
    permuting copy. The kernels build this order themselves while loading the query
    (``gluon_verify._load_query``: column j of sub-tile e reads element 8 (j // 2) + 2 e + j % 2);
    this is its host-side definition, for tests and tools."""
    n, hq, d = q.shape
    if d != 256:
        raise ValueError(f"the Gluon kernels' query order is defined for head dim 256, got {d}")
    return q.reshape(n, hq, 4, 2, 4, 2, 2, 2).permute(0, 1, 5, 6, 2, 3, 4, 7).reshape(n, hq, d)


def _word_views(kv_cache: torch.Tensor):
    """(int16 view, int32 view or None) of the byte cache, or (None, None) when the slots are
    not 2-byte aligned (then the byte-load kernel runs)."""
    if kv_cache.device.type != "cuda" and not _interpreting():
        return None, None
    try:
        kv16 = kv_cache.view(torch.int16)
    except RuntimeError:
        return None, None
    if kv16.data_ptr() % 2:
        return None, None
    try:
        kv32 = kv_cache.view(torch.int32)
        if kv32.data_ptr() % 4:
            kv32 = None
    except RuntimeError:
        kv32 = None
    return kv16, kv32


def describe_kernels() -> list[tuple[str, str, str]]:
    """(preset, stage-1 kernel a head-dim-256 call on this process's GPU takes, why) for doctor.
    Per call the slots' alignment and the fp8 flavour can still send k8v4 to the v2 kernel."""
    has_gluon = _gluon_available()
    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    rows = []
    for preset in V2_LAUNCH_DEFAULTS:
        fp8 = layout_for(preset, 256).key_fp8
        name, need = ("gluon_k8v4", (8, 9)) if fp8 else ("gluon_mse", (8, 0))
        if not (USE_GLUON and preset in GLUON_LAUNCH_DEFAULTS):
            rows.append((preset, "v2", "no Gluon kernel for this preset" if USE_GLUON else "USE_GLUON is off"))
        elif not has_gluon:
            rows.append((preset, "v2", "this Triton has no Gluon"))
        elif cap is None:
            rows.append((preset, f"{name} on SM >= {need[0]}.{need[1]}", "no CUDA device in this process"))
        elif cap < need:
            why = "no hardware fp8 conversion" if fp8 else "no mma.sync / ldmatrix"
            rows.append((preset, "v2", f"SM {cap[0]}.{cap[1]} < {need[0]}.{need[1]}: {why}"))
        else:
            wg = cap == (9, 0) and any(r["set"].get("WGMMA") for r in GLUON_SHAPE_RULES.get(preset, ()))
            rows.append((preset, name, f"Gluon, SM {cap[0]}.{cap[1]}; <= 8 query rows per KV head (and 33-40 "
                                       "over >= 256 programs): transposed (gluon_t)"
                                       + ("; by shape rule (WGMMA): transposed on warpgroup MMAs (gluon_wg)"
                                          if wg else "")
                                       + ("; e4b15 keys or 2-byte-aligned slots: v2" if fp8 else "")))
    return rows


def _gluon_usable(lay, kv32, fp8_e4b15: bool, dev: torch.device, d: int) -> bool:
    """The Gluon kernel can serve this call: head dim 256 on a CUDA GPU with Gluon present, and
    either fp8 (e4nv) keys with 4-byte-aligned slots on SM >= 8.9 (hardware fp8 conversion), or
    MSE keys (2-byte-aligned slots suffice) on SM >= 8.0 (mma.sync, ldmatrix, prmt)."""
    if not (d == 256 and dev.type == "cuda" and _gluon_ok()):
        return False
    cap = torch.cuda.get_device_capability(dev)
    if lay.key_fp8:
        return bool(lay.value_bits == 4 and kv32 is not None and not fp8_e4b15 and cap >= (8, 9))
    return cap >= (8, 0)


_CODEBOOKS: dict = {}  # id(codebook) -> (weakref to it, its version, symmetric?, {fold: byte tables})


def _codebook_entry(centroids: torch.Tensor):
    """Cache entry of one codebook tensor (checked once per tensor and version: a host sync; the
    entry dies with the tensor), or None while a CUDA graph is being captured and the tensor has
    no entry yet."""
    key = id(centroids)
    hit = _CODEBOOKS.get(key)
    if hit is not None and hit[0]() is centroids and hit[1] == centroids._version:
        return hit
    if centroids.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    c16 = centroids.detach().to("cpu", torch.float16)
    entry = (weakref.ref(centroids, lambda _ref, k=key: _CODEBOOKS.pop(k, None)), centroids._version,
             bool(torch.equal(c16, -c16.flip(0))), {})
    _CODEBOOKS[key] = entry
    return entry


def _symmetric_codebook(centroids: torch.Tensor) -> bool:
    """True when the fp16 codebook is exactly symmetric (c[n-1-i] == -c[i]), so 4-bit keys can be
    looked up in its 8 positive entries (ptx.LUT8SW). An unchecked codebook during CUDA-graph
    capture counts as not symmetric (the general 16-entry lookup)."""
    entry = _codebook_entry(centroids)
    return bool(entry and entry[2])


def _codebook_tables(centroids: torch.Tensor, key_bits: int, allow_fold: bool) -> tuple[torch.Tensor, bool]:
    """(byte tables for the Gluon kernel, fold?): 4-bit keys of a symmetric codebook use its positive
    half. Built once per codebook tensor and version; during capture without an entry, per call."""
    entry = _codebook_entry(centroids)
    fold = bool(key_bits == 4 and allow_fold and entry and entry[2])
    if entry is not None and fold in entry[3]:
        return entry[3][fold], fold
    lut = codebook_bytes(centroids[centroids.numel() // 2:] if fold else centroids)
    if entry is not None:
        entry[3][fold] = lut
    return lut, fold


def codebook_bytes(centroids: torch.Tensor) -> torch.Tensor:
    """The fp16 codebook as the Gluon kernel's byte tables: int32[2 * n / 4], first the low bytes
    of entries 0..n-1 (four per word, entry i at byte i % 4), then the high bytes."""
    b = centroids.to(torch.float16).contiguous().view(torch.uint8).view(-1, 2)
    return torch.cat([b[:, 0], b[:, 1]]).contiguous().view(torch.int32)


def _wgmma_ok(dev: torch.device) -> bool:
    """Hopper warpgroup MMAs (``_tq_verify_t_gluon`` with WG): SM 9.0 only, not under the interpreter."""
    return dev.type == "cuda" and not _interpreting() and torch.cuda.get_device_capability(dev) == (9, 0)


def _gluon_available() -> bool:
    """This Triton has Gluon (gluon_verify imports and defines its kernel)."""
    try:
        from vllm_platform_ext.ops.turboquant import gluon_verify as GV
    except Exception:  # noqa: BLE001
        return False
    return GV.AVAILABLE


def _gluon_ok() -> bool:
    """Gluon is here and we are not under the interpreter, which cannot run it."""
    return _gluon_available() and not _interpreting()


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _launch_v1(q_in, kv_cache, block_table, seq_lens, cent, mid, scale, k1, splits, hq, hk, block_m, m_chunks,
               d, block_n, lay, fp8_e4b15, cfg, GATHER, num_warps, num_stages):
    b = seq_lens.shape[0]
    _tq_verify_stage1[(b, hk * m_chunks, splits)](
        q_in, kv_cache, block_table, seq_lens, cent, mid,
        q_in.stride(0), q_in.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        block_table.stride(0),
        mid.stride(0), mid.stride(1), mid.stride(2),
        float(scale) * _LOG2E,
        k1, splits,
        G=hq // hk, BLOCK_M=block_m, M_CHUNKS=m_chunks,
        D=d, PAGE=kv_cache.shape[1], BLOCK_N=block_n,
        KEY_FP8=lay.key_fp8, FP8_E4B15=bool(fp8_e4b15), KEY_BITS=lay.key_bits, MSE_BYTES=lay.mse_bytes,
        NORM_CORRECTION=lay.norm_correction, VAL_BITS=lay.value_bits, KPS=lay.key_packed_size,
        VAL_DATA_BYTES=lay.value_data_bytes,
        GATHER=cfg["GATHER"] if GATHER is None else bool(GATHER),
        num_warps=num_warps or cfg["num_warps"], num_stages=num_stages or cfg["num_stages"],
    )
