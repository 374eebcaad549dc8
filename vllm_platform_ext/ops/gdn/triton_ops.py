"""Gated DeltaNet ops in Triton: the CUDA and MACA implementations of the GDN dispatch entries.

Same signatures and semantics as ``torch_ops`` (the op contract in ``ops/gdn/__init__.py``);
judged by ``reference``. The kernels are in ``triton_kernels``. Imports torch and Triton only (no vLLM), so the kernels run on a
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

# one error type and one set of SSM cache dtypes for every GDN implementation
from vllm_platform_ext.ops.gdn.torch_ops import SSM_STATE_DTYPES, GDNInputError
from vllm_platform_ext.ops.gdn.triton_kernels import (
    _conv_prefill_kernel,
    _conv_update_kernel,
    _gating_kernel,
    _recurrent_kernel,
)


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
    # different shape (measured in results/bench/gdn-kernels.md)
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
