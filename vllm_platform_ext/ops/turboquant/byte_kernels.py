"""Triton kernels of the TurboQuant K+1 verify, first generation (byte loads), and the split-KV
combine every stage-1 kernel of :mod:`.triton_verify` ends with.

* ``_tq_verify_stage1``: one program per (request, KV head x row chunk, KV split) reads each
  compressed tile once as bytes (fp8 keys widened exactly, 3/4-bit fields unpacked from bytes) and
  serves all ``(K+1) x GQA`` query rows with tensor-core dots. It runs where the word-load kernels
  cannot (slots not 2-byte aligned, head dim < 64, CPU under the interpreter with odd layouts).
* ``_tq_verify_stage2``: log-sum-exp combine of the split partials ``float32[rows, Hq, S, D+1]``.

Imports only Triton.
"""
from __future__ import annotations

import triton
import triton.language as tl


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
    # Triton 3.0 (vLLM-metax v0.23) widens ``uint16 << 8`` to int32: narrow before the 16-bit bitcast
    return (lo | (hi << 8)).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


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
