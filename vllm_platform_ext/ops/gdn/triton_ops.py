"""Gated DeltaNet ops in Triton: the CUDA and MACA implementations of the GDN dispatch entries.

Same signatures and semantics as ``torch_ops`` (the op contract in ``ops/gdn/__init__.py``);
judged by ``reference``. Imports torch and Triton only (no vLLM), so the kernels run on a
machine that has no vLLM, and under ``TRITON_INTERPRET=1`` on CPU tensors (fp32/fp16 there:
the interpreter's bf16 arithmetic is broken upstream). The SSM state is read and written in
the cache's dtype (float32, bfloat16 or float16) and carried in float32 through a row's tokens.

Spec-decode state handling:

* ``causal_conv1d_update`` reads each row's window at column offset ``num_accepted-1`` of its
  conv-state line and leaves ``[window[1:], x_row]`` in columns ``[0, width-2+q)``, in one
  kernel (the ``IS_SPEC_DECODING`` offset of upstream's update kernel).
* ``recurrent_gated_delta_rule`` with 2-D ``state_indices`` reads the initial SSM state straight
  from column ``num_accepted-1`` (the "state recovery from the accepted slot", fused: no copy
  into column 0 first) and writes the state after token ``t`` into column ``t``. Zero-draft
  decode rows (one token) are ordinary spec rows with ``q = 1``.

Metadata values (accepted counts, slot numbers, row lengths) are checked on the host before
the launch, which costs one device-to-host copy; the check is skipped while a CUDA graph is
being captured (values are not known then) and when ``VLLM_PLATFORM_EXT_GDN_VALIDATE=0``.
Without the check the kernels still never touch memory outside the pools: offsets are clamped
and rows with an out-of-range slot are treated as padding.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl

# one error type and one set of SSM cache dtypes for every GDN implementation
from vllm_platform_ext.ops.gdn.torch_ops import SSM_STATE_DTYPES, GDNInputError


VALIDATE_ENV = "VLLM_PLATFORM_EXT_GDN_VALIDATE"
MAX_WIDTH = 8
MAX_HEAD_DIM = 256

# ---------------------------------------------------------------------------------------------
# launch configuration
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _platform() -> str:
    try:
        from vllm_platform_ext import detect

        if detect.probe().platform == "maca":
            return "maca"
    except Exception:  # pragma: no cover - probe never raises by contract
        pass
    return "cuda"


@functools.lru_cache(maxsize=None)
def _table_config(op: str, platform: str) -> tuple:
    from vllm_platform_ext.ops.gdn import OPS

    for impl in OPS:
        if impl.op == op and impl.platform == platform:
            return tuple(impl.config.items())
    raise KeyError(f"no {platform} config for {op}")


def default_config(op: str, platform: str | None = None) -> dict[str, Any]:
    """The launch config of ``op`` (``"gdn.<name>"``) declared in the GDN ``OPS`` table."""
    return dict(_table_config(op, platform or _platform()))


def _cfg(op: str, config: dict | None) -> dict[str, Any]:
    cfg = default_config(op)
    if config:
        cfg.update(config)
    return cfg


# ---------------------------------------------------------------------------------------------
# host-side checks
# ---------------------------------------------------------------------------------------------


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise GDNInputError(msg)


def _check_index(name: str, t, ndims: tuple[int, ...], device) -> None:
    _check(isinstance(t, torch.Tensor), f"{name} must be a tensor, got {type(t).__name__}")
    _check(t.dtype in (torch.int32, torch.int64), f"{name} must be int32 or int64, got {t.dtype}")
    _check(t.dim() in ndims, f"{name} must have {' or '.join(map(str, ndims))} dims, got shape {tuple(t.shape)}")
    _check(t.device == device, f"{name} is on {t.device}, expected {device}")


def _check_float(name: str, t, device) -> None:
    _check(isinstance(t, torch.Tensor), f"{name} must be a tensor, got {type(t).__name__}")
    _check(t.is_floating_point(), f"{name} must be floating point, got {t.dtype}")
    _check(t.device == device, f"{name} is on {t.device}, expected {device}")


def _validating(t: torch.Tensor) -> bool:
    if os.environ.get(VALIDATE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return True


def _host(*ts: torch.Tensor | None) -> list[list[int] | None]:
    """Small int tensors to Python lists with one device-to-host copy."""
    present = [t.reshape(-1).to(torch.int64) for t in ts if t is not None]
    flat = torch.cat(present).cpu().tolist() if present else []
    out, pos = [], 0
    for t in ts:
        if t is None:
            out.append(None)
            continue
        n = t.numel()
        out.append(flat[pos:pos + n])
        pos += n
    return out


def _check_rows(qsl: list[int], n: int, total: int) -> None:
    _check(len(qsl) >= n + 1, f"query_start_loc has {len(qsl)} entries, need {n + 1}")
    q = qsl[: n + 1]
    _check(all(a <= b for a, b in zip(q, q[1:])), f"query_start_loc must be non-decreasing, got {q}")
    _check(q[0] >= 0 and q[-1] <= total, f"query_start_loc {q} exceeds the {total} tokens given")


def _dense(t):
    """Small metadata tensors the kernels index with stride 1 (a copy only for strided views)."""
    return t if t is None or t.is_contiguous() else t.contiguous()


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _act_flag(activation) -> bool:
    if activation in (None, False, "none", "identity"):
        return False
    if activation in (True, "silu", "swish"):
        return True
    raise GDNInputError(f"unsupported activation {activation!r} (expected 'silu' or None)")


def _check_conv(x, weight, bias, conv_states) -> None:
    _check(isinstance(x, torch.Tensor) and x.dim() == 2, f"x must be (tokens, dim), got shape {tuple(getattr(x, 'shape', ()))}")
    dev = x.device
    _check_float("x", x, dev)
    _check_float("weight", weight, dev)
    _check(weight.dim() == 2, f"weight must be (dim, width), got shape {tuple(weight.shape)}")
    _check(weight.shape[0] == x.shape[1], f"weight dim {weight.shape[0]} != x dim {x.shape[1]}")
    _check(2 <= weight.shape[1] <= MAX_WIDTH, f"conv width {weight.shape[1]} outside [2, {MAX_WIDTH}]")
    if bias is not None:
        _check_float("bias", bias, dev)
        _check(tuple(bias.shape) == (x.shape[1],), f"bias must be ({x.shape[1]},), got {tuple(bias.shape)}")
    _check_float("conv_states", conv_states, dev)
    _check(conv_states.dim() == 3 and conv_states.shape[1] == x.shape[1],
           f"conv_states must be (slots, {x.shape[1]}, state_len), got shape {tuple(conv_states.shape)}")
    _check(conv_states.shape[2] >= weight.shape[1] - 1,
           f"conv state_len {conv_states.shape[2]} < width-1 = {weight.shape[1] - 1}")


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# the ops
# ---------------------------------------------------------------------------------------------


def causal_conv1d_prefill(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                          activation="silu", null_block_id=0, *, config: dict | None = None):
    _check_conv(x, weight, bias, conv_states)
    dev = x.device
    _check_index("cache_indices", cache_indices, (1,), dev)
    _check_index("query_start_loc", query_start_loc, (1,), dev)
    n = cache_indices.shape[0]
    _check(isinstance(has_initial_state, torch.Tensor) and has_initial_state.numel() >= n,
           "has_initial_state must have one entry per row")
    _check(has_initial_state.device == dev, f"has_initial_state is on {has_initial_state.device}, expected {dev}")
    silu = _act_flag(activation)
    T, dim = x.shape
    width = weight.shape[1]
    out = torch.empty_like(x)
    if n == 0:
        return out.zero_()
    qsl, slots = _host(query_start_loc, cache_indices)  # the grid needs the longest row anyway
    _check_rows(qsl, n, T)
    for i, s in enumerate(slots[:n]):
        if s != null_block_id and qsl[i + 1] > qsl[i]:
            _check(0 <= s < conv_states.shape[0], f"row {i}: cache index {s} outside [0, {conv_states.shape[0]})")
    max_q = max(b - a for a, b in zip(qsl[:n], qsl[1 : n + 1]))
    cfg = _cfg("gdn.causal_conv1d_prefill", config)
    BT = max(cfg["BLOCK_T"], _next_pow2(width - 1))
    BD = min(cfg["BLOCK_D"], _next_pow2(dim))
    init = _dense(has_initial_state.reshape(-1)[:n])
    init = init.view(torch.uint8) if init.dtype == torch.bool else (init != 0).view(torch.uint8)
    query_start_loc = _dense(query_start_loc)
    grid = (n, max(1, triton.cdiv(max_q, BT)), triton.cdiv(dim, BD))
    _conv_prefill_kernel[grid](
        x, weight, bias if bias is not None else weight, conv_states, query_start_loc, cache_indices, init, out,
        T, n, dim, conv_states.shape[0], null_block_id,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        conv_states.stride(0), conv_states.stride(1), conv_states.stride(2), out.stride(0), out.stride(1),
        cache_indices.stride(0),
        WIDTH=width, BT=BT, BD=BD, BW=_next_pow2(width - 1), HAS_BIAS=bias is not None, SILU=silu,
        num_warps=cfg["num_warps"],
    )
    return out


def causal_conv1d_update(x, conv_states, weight, bias, activation, conv_state_indices, query_start_loc,
                         num_accepted_tokens=None, null_block_id=0, *, config: dict | None = None):
    _check_conv(x, weight, bias, conv_states)
    dev = x.device
    _check_index("conv_state_indices", conv_state_indices, (1,), dev)
    _check_index("query_start_loc", query_start_loc, (1,), dev)
    n = conv_state_indices.shape[0]
    _check(query_start_loc.numel() >= n + 1, f"query_start_loc has {query_start_loc.numel()} entries, need {n + 1}")
    spec = num_accepted_tokens is not None
    if spec:
        _check_index("num_accepted_tokens", num_accepted_tokens, (1,), dev)
        _check(num_accepted_tokens.numel() >= n,
               f"num_accepted_tokens has {num_accepted_tokens.numel()} entries, need {n}")
    silu = _act_flag(activation)
    T, dim = x.shape
    width, state_len = weight.shape[1], conv_states.shape[2]
    if _validating(x):
        qsl, slots, acc = _host(query_start_loc[: n + 1], conv_state_indices,
                                num_accepted_tokens[:n] if spec else None)
        _check_rows(qsl, n, T)
        for i in range(n):
            q = qsl[i + 1] - qsl[i]
            if slots[i] == null_block_id or q == 0:
                continue
            _check(0 <= slots[i] < conv_states.shape[0],
                   f"row {i}: conv state index {slots[i]} outside [0, {conv_states.shape[0]})")
            off = acc[i] - 1 if spec else 0
            _check(0 <= off and off + width - 1 <= state_len,
                   f"row {i}: num_accepted_tokens={off + 1} out of range [1, {state_len - width + 2}] "
                   f"for conv state_len {state_len}")
            _check(width - 2 + q <= state_len,
                   f"row {i}: {q} tokens do not fit a conv state of length {state_len} (width {width})")
    out = torch.empty_like(x)
    if n == 0:
        return out.zero_()
    cfg = _cfg("gdn.causal_conv1d_update", config)
    BT = _next_pow2(max(1, min(T, state_len - width + 2)))
    BD = min(cfg["BLOCK_D"], _next_pow2(dim))
    query_start_loc, num_accepted_tokens = _dense(query_start_loc), _dense(num_accepted_tokens)
    grid = (n, triton.cdiv(dim, BD))
    _conv_update_kernel[grid](
        x, weight, bias if bias is not None else weight, conv_states, query_start_loc, conv_state_indices,
        num_accepted_tokens if spec else conv_state_indices, out,
        T, n, dim, conv_states.shape[0], null_block_id, state_len,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        conv_states.stride(0), conv_states.stride(1), conv_states.stride(2), out.stride(0), out.stride(1),
        conv_state_indices.stride(0),
        WIDTH=width, BT=BT, BD=BD, BC=_next_pow2(width - 2 + BT), HAS_BIAS=bias is not None, SILU=silu,
        SPEC=spec, num_warps=cfg["num_warps"],
    )
    return out


def gdn_gating(A_log, a, b, dt_bias, softplus_threshold=20.0, *, config: dict | None = None):
    _check(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and a.shape == b.shape,
           f"a and b must be (tokens, heads), got {tuple(getattr(a, 'shape', ()))}, {tuple(getattr(b, 'shape', ()))}")
    dev = a.device
    for name, t in (("A_log", A_log), ("a", a), ("b", b), ("dt_bias", dt_bias)):
        _check_float(name, t, dev)
    T, HV = a.shape
    _check(A_log.shape == (HV,) and dt_bias.shape == (HV,), f"A_log and dt_bias must be ({HV},)")
    if a.stride(1) != 1:
        a = a.contiguous()
    if b.stride(1) != 1:
        b = b.contiguous()
    A_log, dt_bias = A_log.contiguous(), dt_bias.contiguous()
    g = torch.empty(T, HV, dtype=torch.float32, device=dev)
    beta = torch.empty(T, HV, dtype=torch.float32, device=dev)
    if T * HV == 0:
        return g, beta
    cfg = _cfg("gdn.gating", config)
    BLOCK = cfg["BLOCK"]
    _gating_kernel[(triton.cdiv(T * HV, BLOCK),)](
        A_log, a, b, dt_bias, g, beta, T * HV, HV, a.stride(0), b.stride(0), float(softplus_threshold),
        BLOCK=BLOCK, num_warps=cfg["num_warps"],
    )
    return g, beta


def _recurrent(q, k, v, gates, scale, ssm_states, query_start_loc, state_indices, num_accepted_tokens,
               has_initial_state, use_qk_l2norm, null_block_id, threshold, config, fused):
    _check(isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 3 and k.shape == q.shape,
           f"q and k must be (tokens, H, K) alike, got {tuple(getattr(q, 'shape', ()))}, {tuple(getattr(k, 'shape', ()))}")
    dev = q.device
    T, H, K = q.shape
    _check(isinstance(v, torch.Tensor) and v.dim() == 3 and v.shape[0] == T,
           f"v must be ({T}, HV, V), got {tuple(getattr(v, 'shape', ()))}")
    HV, V = v.shape[1], v.shape[2]
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(name, t, dev)
    _check(HV % H == 0, f"value heads {HV} must be a multiple of key heads {H}")
    _check(1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM,
           f"head dims K={K}, V={V} unsupported (the Triton kernel takes 1..{MAX_HEAD_DIM})")
    if fused:
        A_log, a, b, dt_bias = gates
        for name, t in (("A_log", A_log), ("a", a), ("b", b), ("dt_bias", dt_bias)):
            _check_float(name, t, dev)
        _check(a.shape == (T, HV) and b.shape == (T, HV), f"a and b must be ({T}, {HV})")
        _check(A_log.shape == (HV,) and dt_bias.shape == (HV,), f"A_log and dt_bias must be ({HV},)")
        g1, g2 = (a if a.stride(1) == 1 else a.contiguous()), (b if b.stride(1) == 1 else b.contiguous())
        A_log, dt_bias = A_log.contiguous(), dt_bias.contiguous()
    else:
        g, beta = gates
        _check_float("g", g, dev)
        _check_float("beta", beta, dev)
        _check(g.shape == (T, HV) and beta.shape == (T, HV),
               f"g and beta must be ({T}, {HV}), got {tuple(g.shape)}, {tuple(beta.shape)}")
        g1, g2 = (g if g.stride(1) == 1 else g.contiguous()), (beta if beta.stride(1) == 1 else beta.contiguous())
    _check(isinstance(ssm_states, torch.Tensor) and ssm_states.dim() == 4 and tuple(ssm_states.shape[1:]) == (HV, V, K),
           f"ssm_states must be (slots, {HV}, {V}, {K}), got {tuple(getattr(ssm_states, 'shape', ()))}")
    _check(ssm_states.dtype in SSM_STATE_DTYPES,
           f"ssm_states must be float32, bfloat16 or float16, got {ssm_states.dtype}")
    _check(ssm_states.device == dev, f"ssm_states is on {ssm_states.device}, expected {dev}")
    _check(ssm_states.stride(3) == 1 and ssm_states.stride(2) == K and ssm_states.stride(1) == V * K,
           f"each slot of ssm_states must be a contiguous (HV, V, K) block, got strides {tuple(ssm_states.stride())}")
    _check_index("state_indices", state_indices, (1, 2), dev)
    _check_index("query_start_loc", query_start_loc, (1,), dev)
    spec = state_indices.dim() == 2
    n = state_indices.shape[0]
    _check(query_start_loc.numel() >= n + 1, f"query_start_loc has {query_start_loc.numel()} entries, need {n + 1}")
    S = state_indices.shape[1] if spec else 1
    if spec:
        _check(num_accepted_tokens is not None, "spec rows (2-D state_indices) need num_accepted_tokens")
        _check_index("num_accepted_tokens", num_accepted_tokens, (1,), dev)
        _check(num_accepted_tokens.numel() >= n,
               f"num_accepted_tokens has {num_accepted_tokens.numel()} entries, need {n}")
        _check(S >= 1, "state_indices has no columns")
    if has_initial_state is not None:
        _check(isinstance(has_initial_state, torch.Tensor) and has_initial_state.numel() >= n,
               "has_initial_state must have one entry per row")
        _check(has_initial_state.device == dev, f"has_initial_state is on {has_initial_state.device}, expected {dev}")
    q = q if q.stride(2) == 1 else q.contiguous()
    k = k if k.stride(2) == 1 else k.contiguous()
    v = v if v.stride(2) == 1 else v.contiguous()
    num_slots = ssm_states.shape[0]
    if _validating(q):
        qsl, idx, acc = _host(query_start_loc[: n + 1], state_indices, num_accepted_tokens[:n] if spec else None)
        _check_rows(qsl, n, T)
        for i in range(n):
            q_i = qsl[i + 1] - qsl[i]
            if q_i == 0:
                continue
            if spec:
                cols = idx[i * S:(i + 1) * S]
                _check(1 <= acc[i] <= S, f"row {i}: num_accepted_tokens={acc[i]} out of range [1, {S}]")
                _check(q_i <= S, f"row {i}: {q_i} tokens but only {S} state slots")
                src = cols[acc[i] - 1]
                used = [src] + cols[:q_i]
            else:
                src = idx[i]
                used = [src]
            if src == null_block_id:
                continue
            for s in used:
                _check(s == null_block_id or 0 <= s < num_slots, f"row {i}: state slot {s} outside [0, {num_slots})")
    out = torch.empty(T, HV, V, dtype=v.dtype, device=dev)
    if n == 0:
        return out.zero_()
    cfg = _cfg("gdn.recurrent_gated_delta_rule", config)
    BK = _next_pow2(K)
    BV = min(cfg["BLOCK_V"], _next_pow2(V))
    num_warps = cfg["num_warps"]
    # few (row, head) pairs: fewer programs than the GPU has room for, so give each one a
    # different shape (measured in benchmarks/RESULTS_gdn.md)
    if cfg.get("SMALL_GRID") and n * HV * triton.cdiv(V, BV) < cfg["SMALL_GRID"]:
        BV = min(cfg["SMALL_BLOCK_V"], _next_pow2(V))
        num_warps = cfg["SMALL_NUM_WARPS"]
    if has_initial_state is not None:
        init = _dense(has_initial_state.reshape(-1)[:n])
        init = init.view(torch.uint8) if init.dtype == torch.bool else (init != 0).view(torch.uint8)
    else:
        init = query_start_loc
    si_n = state_indices.stride(0)
    si_c = state_indices.stride(1) if spec else 0
    query_start_loc, num_accepted_tokens = _dense(query_start_loc), _dense(num_accepted_tokens)
    if fused:
        A_log, _, _, dt_bias = gates
        ptrs = (q, k, v, q, q, A_log, g1, g2, dt_bias)
    else:
        ptrs = (q, k, v, g1, g2, q, q, q, q)
    grid = (triton.cdiv(V, BV), n * HV)
    _recurrent_kernel[grid](
        *ptrs, out, ssm_states, query_start_loc, state_indices,
        num_accepted_tokens if spec else query_start_loc, init,
        float(scale), float(threshold), T, n, num_slots, null_block_id, S,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g1.stride(0), g2.stride(0), out.stride(0), out.stride(1),
        ssm_states.stride(0), si_n, si_c,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, SPEC=spec, HAS_INIT=has_initial_state is not None,
        L2NORM=bool(use_qk_l2norm), FUSED_GATING=fused,
        num_warps=num_warps, num_stages=cfg.get("num_stages", 2),
    )
    return out


def recurrent_gated_delta_rule(q, k, v, g, beta, scale, ssm_states, query_start_loc, state_indices,
                               num_accepted_tokens=None, has_initial_state=None, use_qk_l2norm=True,
                               null_block_id=0, *, config: dict | None = None):
    return _recurrent(q, k, v, (g, beta), scale, ssm_states, query_start_loc, state_indices,
                      num_accepted_tokens, has_initial_state, use_qk_l2norm, null_block_id, 20.0, config,
                      fused=False)


def fused_gating_recurrent_gated_delta_rule(q, k, v, A_log, a, b, dt_bias, scale, ssm_states, query_start_loc,
                                            state_indices, num_accepted_tokens=None, has_initial_state=None,
                                            use_qk_l2norm=True, null_block_id=0, softplus_threshold=20.0, *,
                                            config: dict | None = None):
    """``gdn_gating`` followed by ``recurrent_gated_delta_rule`` in one kernel (what vLLM's
    decode path does with ``fused_sigmoid_gating_delta_rule_update``)."""
    return _recurrent(q, k, v, (A_log, a, b, dt_bias), scale, ssm_states, query_start_loc, state_indices,
                      num_accepted_tokens, has_initial_state, use_qk_l2norm, null_block_id,
                      softplus_threshold, config, fused=True)
