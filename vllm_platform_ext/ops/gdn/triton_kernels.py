"""Triton kernels of the GDN ops (:mod:`.triton_ops` checks the arguments, picks the launch
configuration and launches them): causal conv1d prefill and spec-decode update, the gating, and the
gated delta rule recurrence with the SSM state read from the accepted slot. Imports only Triton.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _zero_tokens(o_ptr, t_lo, t_hi, so_t, cols, col_mask, BC: tl.constexpr):
    zero = tl.zeros([BC], dtype=tl.float32)
    for t in range(t_lo, t_hi):
        tl.store(o_ptr + t * so_t + cols, zero.to(o_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def _conv_prefill_kernel(
    x_ptr, w_ptr, b_ptr, s_ptr, qsl_ptr, idx_ptr, init_ptr, o_ptr,
    T, N, dim, num_slots, null_id,
    sx_t, sx_d, sw_d, sw_j, ss_n, ss_d, ss_c, so_t, so_d, si,
    WIDTH: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, BW: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_c = tl.program_id(1)
    i_d = tl.program_id(2)
    d = i_d * BD + tl.arange(0, BD)
    md = d < dim
    bos = tl.load(qsl_ptr + i_n).to(tl.int64)
    eos = tl.load(qsl_ptr + i_n + 1).to(tl.int64)
    if i_c == 0:  # tokens outside every row (CUDA-graph padding) get zeros
        if i_n == 0:
            _zero_tokens(o_ptr, 0, bos, so_t, d * so_d, md, BD)
        if i_n == N - 1:
            _zero_tokens(o_ptr, eos, T, so_t, d * so_d, md, BD)
    n = eos - bos
    t0 = i_c * BT
    if t0 >= n:
        return
    t = t0 + tl.arange(0, BT)
    mt = t < n
    o_ptrs = o_ptr + (bos + t)[:, None] * so_t + (d * so_d)[None, :]
    mo = mt[:, None] & md[None, :]
    slot = tl.load(idx_ptr + i_n * si).to(tl.int64)
    if (slot == null_id) | (slot < 0) | (slot >= num_slots):
        tl.store(o_ptrs, tl.zeros([BT, BD], dtype=tl.float32).to(o_ptr.dtype.element_ty), mask=mo)
        return
    has_init = tl.load(init_ptr + i_n)
    lim = tl.where(has_init != 0, WIDTH - 1, 0)  # window columns read from the state
    s_base = s_ptr + slot * ss_n + (d * ss_d)[None, :]
    if HAS_BIAS:
        bias = tl.load(b_ptr + d, mask=md, other=0.0).to(tl.float32)
        acc = tl.zeros([BT, BD], dtype=tl.float32) + bias[None, :]
    else:
        acc = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(WIDTH):
        c = t + j  # index into [window, x_row]
        ms = (c < lim) & mt
        sv = tl.load(s_base + c[:, None] * ss_c, mask=ms[:, None] & md[None, :], other=0.0)
        mx = (c >= WIDTH - 1) & mt
        xv = tl.load(x_ptr + (bos + c - (WIDTH - 1))[:, None] * sx_t + (d * sx_d)[None, :],
                     mask=mx[:, None] & md[None, :], other=0.0)
        wj = tl.load(w_ptr + d * sw_d + j * sw_j, mask=md, other=0.0).to(tl.float32)
        acc += (sv.to(tl.float32) + xv.to(tl.float32)) * wj[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=mo)
    if i_c == 0:
        # write-back: the last width-1 columns of [window, x_row]. Only chunk 0 reads the
        # state (t + j < width-1 needs t < width-1 <= BT), so it alone may overwrite it.
        cc = tl.arange(0, BW)
        mc = cc < WIDTH - 1
        p = n + cc
        m_s = (p < lim) & mc
        m_x = (p >= WIDTH - 1) & mc
        w_sv = tl.load(s_base + p[:, None] * ss_c, mask=m_s[:, None] & md[None, :], other=0.0)
        w_xv = tl.load(x_ptr + (bos + p - (WIDTH - 1))[:, None] * sx_t + (d * sx_d)[None, :],
                       mask=m_x[:, None] & md[None, :], other=0.0)
        new = tl.where(m_x[:, None], w_xv.to(s_ptr.dtype.element_ty), w_sv)
        tl.debug_barrier()
        tl.store(s_base + cc[:, None] * ss_c, new, mask=mc[:, None] & md[None, :])


@triton.jit
def _conv_update_kernel(
    x_ptr, w_ptr, b_ptr, s_ptr, qsl_ptr, idx_ptr, acc_ptr, o_ptr,
    T, N, dim, num_slots, null_id, state_len,
    sx_t, sx_d, sw_d, sw_j, ss_n, ss_d, ss_c, so_t, so_d, si,
    WIDTH: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, SPEC: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_d = tl.program_id(1)
    d = i_d * BD + tl.arange(0, BD)
    md = d < dim
    bos = tl.load(qsl_ptr + i_n).to(tl.int64)
    eos = tl.load(qsl_ptr + i_n + 1).to(tl.int64)
    if i_n == 0:
        _zero_tokens(o_ptr, 0, bos, so_t, d * so_d, md, BD)
    if i_n == N - 1:
        _zero_tokens(o_ptr, eos, T, so_t, d * so_d, md, BD)
    n = eos - bos
    if n <= 0:
        return
    # never past the state line, whatever the metadata (the host check reports it)
    n = tl.minimum(n, state_len - WIDTH + 2)
    t = tl.arange(0, BT)
    mt = t < n
    o_ptrs = o_ptr + (bos + t)[:, None] * so_t + (d * so_d)[None, :]
    mo = mt[:, None] & md[None, :]
    slot = tl.load(idx_ptr + i_n * si).to(tl.int64)
    if (slot == null_id) | (slot < 0) | (slot >= num_slots):
        tl.store(o_ptrs, tl.zeros([BT, BD], dtype=tl.float32).to(o_ptr.dtype.element_ty), mask=mo)
        return
    if SPEC:
        off = tl.load(acc_ptr + i_n).to(tl.int64) - 1
        off = tl.minimum(tl.maximum(off, 0), state_len - WIDTH + 1)
    else:
        off = 0
    s_base = s_ptr + slot * ss_n + (d * ss_d)[None, :]
    # new state columns [0, width-2+n) = [window[1:], x_row]: load before anything is stored
    cc = tl.arange(0, BC)
    mc = cc < WIDTH - 2 + n
    p = cc + 1
    m_s = (p < WIDTH - 1) & mc
    m_x = (p >= WIDTH - 1) & mc
    sv = tl.load(s_base + (off + p)[:, None] * ss_c, mask=m_s[:, None] & md[None, :], other=0.0)
    xv = tl.load(x_ptr + (bos + p - (WIDTH - 1))[:, None] * sx_t + (d * sx_d)[None, :],
                 mask=m_x[:, None] & md[None, :], other=0.0)
    new = tl.where(m_x[:, None], xv.to(s_ptr.dtype.element_ty), sv)
    if HAS_BIAS:
        bias = tl.load(b_ptr + d, mask=md, other=0.0).to(tl.float32)
        acc = tl.zeros([BT, BD], dtype=tl.float32) + bias[None, :]
    else:
        acc = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(WIDTH):
        c = t + j
        ms = (c < WIDTH - 1) & mt
        sv_j = tl.load(s_base + (off + c)[:, None] * ss_c, mask=ms[:, None] & md[None, :], other=0.0)
        mx = (c >= WIDTH - 1) & mt
        xv_j = tl.load(x_ptr + (bos + c - (WIDTH - 1))[:, None] * sx_t + (d * sx_d)[None, :],
                       mask=mx[:, None] & md[None, :], other=0.0)
        wj = tl.load(w_ptr + d * sw_d + j * sw_j, mask=md, other=0.0).to(tl.float32)
        acc += (sv_j.to(tl.float32) + xv_j.to(tl.float32)) * wj[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.debug_barrier()  # every read of the state line happens before it is overwritten
    tl.store(s_base + cc[:, None] * ss_c, new, mask=mc[:, None] & md[None, :])
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=mo)


@triton.jit
def _gating_kernel(A_ptr, a_ptr, b_ptr, dt_ptr, g_ptr, beta_ptr, numel, HV, sa_t, sb_t, threshold,
                   BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < numel
    t = i // HV
    h = i % HV
    a = tl.load(a_ptr + t * sa_t + h, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + t * sb_t + h, mask=m, other=0.0).to(tl.float32)
    A = tl.load(A_ptr + h, mask=m, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + h, mask=m, other=0.0).to(tl.float32)
    z = a + dt
    sp = tl.where(z > threshold, z, tl.log(1.0 + tl.exp(tl.minimum(z, threshold))))
    tl.store(g_ptr + i, -tl.exp(A) * sp, mask=m)
    tl.store(beta_ptr + i, 1.0 / (1.0 + tl.exp(-b)), mask=m)


@triton.jit
def _recurrent_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_ptr, a_ptr, b_ptr, dt_ptr,
    o_ptr, h_ptr, qsl_ptr, idx_ptr, acc_ptr, init_ptr,
    scale, threshold, T, N, num_slots, null_id, S,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sb_t, so_t, so_h,
    sh_n, si_n, si_c,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    SPEC: tl.constexpr, HAS_INIT: tl.constexpr, L2NORM: tl.constexpr, FUSED_GATING: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_k < K
    mv = o_v < V
    mh = mv[:, None] & mk[None, :]
    o_base = o_ptr + i_hv * so_h + o_v
    bos = tl.load(qsl_ptr + i_n).to(tl.int64)
    eos = tl.load(qsl_ptr + i_n + 1).to(tl.int64)
    if i_n == 0:
        _zero_tokens(o_base, 0, bos, so_t, 0, mv, BV)
    if i_n == N - 1:
        _zero_tokens(o_base, eos, T, so_t, 0, mv, BV)
    n = eos - bos
    if n <= 0:
        return
    if SPEC:
        n = tl.minimum(n, S)
        acc = tl.load(acc_ptr + i_n).to(tl.int64)
        acc = tl.minimum(tl.maximum(acc, 1), S)
        src = tl.load(idx_ptr + i_n * si_n + (acc - 1) * si_c).to(tl.int64)
    else:
        src = tl.load(idx_ptr + i_n * si_n).to(tl.int64)
    if (src == null_id) | (src < 0) | (src >= num_slots):
        _zero_tokens(o_base, bos, bos + n, so_t, 0, mv, BV)
        return
    # a slot's (HV, V, K) block is contiguous; offsets are rebuilt at each use (keeping a
    # [BV, BK] offset tile live across the token loop costs as many registers as the state)
    b_h = tl.zeros([BV, BK], dtype=tl.float32)
    if HAS_INIT:
        use_init = tl.load(init_ptr + i_n)
    else:
        use_init = 1
    if use_init != 0:
        b_h = tl.load(h_ptr + (src * sh_n + i_hv * (V * K)) + o_v[:, None] * K + o_k[None, :], mask=mh, other=0.0).to(tl.float32)
    if FUSED_GATING:
        A = tl.load(A_ptr + i_hv).to(tl.float32)
        dtb = tl.load(dt_ptr + i_hv).to(tl.float32)
    for i in range(0, n):
        tok = bos + i
        b_q = tl.load(q_ptr + tok * sq_t + i_h * sq_h + o_k, mask=mk, other=0.0).to(tl.float32)
        b_k = tl.load(k_ptr + tok * sk_t + i_h * sk_h + o_k, mask=mk, other=0.0).to(tl.float32)
        b_v = tl.load(v_ptr + tok * sv_t + i_hv * sv_h + o_v, mask=mv, other=0.0).to(tl.float32)
        if FUSED_GATING:
            z = tl.load(a_ptr + tok * sg_t + i_hv).to(tl.float32) + dtb
            sp = tl.where(z > threshold, z, tl.log(1.0 + tl.exp(tl.minimum(z, threshold))))
            b_g = -tl.exp(A) * sp
            b_beta = 1.0 / (1.0 + tl.exp(-tl.load(b_ptr + tok * sb_t + i_hv).to(tl.float32)))
        else:
            b_g = tl.load(g_ptr + tok * sg_t + i_hv).to(tl.float32)
            b_beta = tl.load(beta_ptr + tok * sb_t + i_hv).to(tl.float32)
        if L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        b_h = b_h * tl.exp(b_g)
        b_u = (b_v - tl.sum(b_h * b_k[None, :], 1)) * b_beta
        b_h = b_h + b_u[:, None] * b_k[None, :]
        b_o = tl.sum(b_h * b_q[None, :], 1)
        tl.store(o_base + tok * so_t, b_o.to(o_ptr.dtype.element_ty), mask=mv)
        if SPEC:
            dst = tl.load(idx_ptr + i_n * si_n + i * si_c).to(tl.int64)
            if (dst != null_id) & (dst >= 0) & (dst < num_slots):
                tl.store(h_ptr + (dst * sh_n + i_hv * (V * K)) + o_v[:, None] * K + o_k[None, :], b_h.to(h_ptr.dtype.element_ty), mask=mh)
    if not SPEC:
        tl.store(h_ptr + (src * sh_n + i_hv * (V * K)) + o_v[:, None] * K + o_k[None, :], b_h.to(h_ptr.dtype.element_ty), mask=mh)
