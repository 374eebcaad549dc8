"""Float64 reference of the GDN ops, written with plain Python loops.

This module is the judge of every GDN implementation of the plugin (``torch_ops`` on the CPU,
``triton_ops`` under the Triton interpreter and on the GPU). It follows the op contract of
``vllm_platform_ext.ops.gdn`` word for word and shares no code with the implementations: no
``F.conv1d``, no einsum, no vectorised recurrence, just scalar-indexed loops over float64
values. It is slow on purpose; keep the shapes small.

The functions take the same arguments as the ops. They compute in float64 and write the
updated states back into the state tensors given (pass float64 copies to keep the full
precision); outputs are returned as float64 tensors.

Random cases with the edge cases the tests need are built in :mod:`.cases`; :mod:`.harness`
runs an implementation and this reference on one case and returns error figures (the CPU and GPU
tests and the interpreter helper all use them).
"""
from __future__ import annotations

import math

import torch

# ---------------------------------------------------------------------------------------------
# the reference ops
# ---------------------------------------------------------------------------------------------


def _f64_list(t: torch.Tensor) -> list:
    return t.detach().to("cpu", torch.float64).tolist()


def _ints(t: torch.Tensor | None) -> list | None:
    return None if t is None else t.detach().to("cpu", torch.int64).tolist()


def _silu(y: float) -> float:
    return y / (1.0 + math.exp(-y)) if y > -700 else 0.0


def _act(y: float, activation) -> float:
    if activation in ("silu", "swish", True):
        return _silu(y)
    if activation in (None, False, "none", "identity"):
        return y
    raise ValueError(f"unsupported activation {activation!r}")


def _conv_tokens(P: list[list[float]], xs: list[list[float]], w: list[list[float]], bias, activation):
    """P: dim x (width-1) window; xs: q x dim inputs. Returns q x dim outputs."""
    dim, width = len(w), len(w[0])
    out = []
    for t in range(len(xs)):
        row = []
        for d in range(dim):
            acc = 0.0 if bias is None else bias[d]
            for j in range(width):
                c = t + j  # index into [P, x_row] (length width-1+q)
                val = P[d][c] if c < width - 1 else xs[c - (width - 1)][d]
                acc += w[d][j] * val
            row.append(_act(acc, activation))
        out.append(row)
    return out


def causal_conv1d_prefill(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                          activation="silu", null_block_id=0):
    T, dim = x.shape
    width = weight.shape[1]
    X, W = _f64_list(x), _f64_list(weight)
    B = None if bias is None else _f64_list(bias)
    qsl, slots = _ints(query_start_loc), _ints(cache_indices)
    init = [bool(v) for v in has_initial_state.tolist()]
    out = torch.zeros(T, dim, dtype=torch.float64)
    for i, slot in enumerate(slots):
        s, e = qsl[i], qsl[i + 1]
        if slot == null_block_id or e == s:
            continue
        st = _f64_list(conv_states[slot])  # dim x state_len
        P = [[st[d][c] if init[i] else 0.0 for c in range(width - 1)] for d in range(dim)]
        xs = X[s:e]
        y = _conv_tokens(P, xs, W, B, activation)
        out[s:e] = torch.tensor(y, dtype=torch.float64).reshape(e - s, dim)
        q = e - s
        for d in range(dim):
            full = P[d] + [xs[t][d] for t in range(q)]
            for c in range(width - 1):
                conv_states[slot, d, c] = full[len(full) - (width - 1) + c]
    return out


def causal_conv1d_update(x, conv_states, weight, bias, activation, conv_state_indices, query_start_loc,
                         num_accepted_tokens=None, null_block_id=0):
    T, dim = x.shape
    width = weight.shape[1]
    state_len = conv_states.shape[2]
    X, W = _f64_list(x), _f64_list(weight)
    B = None if bias is None else _f64_list(bias)
    qsl, slots = _ints(query_start_loc), _ints(conv_state_indices)
    acc = _ints(num_accepted_tokens)
    out = torch.zeros(T, dim, dtype=torch.float64)
    for i, slot in enumerate(slots):
        s, e = qsl[i], qsl[i + 1]
        q = e - s
        if slot == null_block_id or q == 0:
            continue
        o = 0 if acc is None else acc[i] - 1
        if o < 0 or o + width - 1 > state_len:
            raise ValueError(f"row {i}: num_accepted_tokens={o + 1} out of range")
        if width - 2 + q > state_len:
            raise ValueError(f"row {i}: {q} tokens do not fit conv state_len {state_len}")
        st = _f64_list(conv_states[slot])
        P = [[st[d][o + c] for c in range(width - 1)] for d in range(dim)]
        xs = X[s:e]
        y = _conv_tokens(P, xs, W, B, activation)
        out[s:e] = torch.tensor(y, dtype=torch.float64).reshape(q, dim)
        for d in range(dim):
            new = P[d][1:] + [xs[t][d] for t in range(q)]
            for c in range(width - 2 + q):
                conv_states[slot, d, c] = new[c]
    return out


def gdn_gating(A_log, a, b, dt_bias, softplus_threshold=20.0):
    T, HV = a.shape
    Al, av, bv, dt = _f64_list(A_log), _f64_list(a), _f64_list(b), _f64_list(dt_bias)
    g = torch.zeros(T, HV, dtype=torch.float64)
    beta = torch.zeros(T, HV, dtype=torch.float64)
    for t in range(T):
        for h in range(HV):
            z = av[t][h] + dt[h]
            sp = z if z > softplus_threshold else math.log1p(math.exp(z))
            g[t, h] = -math.exp(Al[h]) * sp
            beta[t, h] = 1.0 / (1.0 + math.exp(-bv[t][h]))
    return g, beta


def _l2n(vec: list[float], eps: float = 1e-6) -> list[float]:
    r = 1.0 / math.sqrt(sum(u * u for u in vec) + eps)
    return [u * r for u in vec]


def recurrent_gated_delta_rule(q, k, v, g, beta, scale, ssm_states, query_start_loc, state_indices,
                               num_accepted_tokens=None, has_initial_state=None, use_qk_l2norm=True,
                               null_block_id=0):
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    grp = HV // H
    Q, Kt, Vt, G, Bt = _f64_list(q), _f64_list(k), _f64_list(v), _f64_list(g), _f64_list(beta)
    qsl, idx = _ints(query_start_loc), _ints(state_indices)
    spec = state_indices.dim() == 2
    acc = _ints(num_accepted_tokens)
    init = None if has_initial_state is None else [bool(u) for u in has_initial_state.tolist()]
    out = torch.zeros(T, HV, V, dtype=torch.float64)
    for i in range(len(idx)):
        s, e = qsl[i], qsl[i + 1]
        n = e - s
        if n == 0:
            continue
        if spec:
            cols = idx[i]
            if not 1 <= acc[i] <= len(cols):
                raise ValueError(f"row {i}: num_accepted_tokens={acc[i]} out of range")
            if n > len(cols):
                raise ValueError(f"row {i}: {n} tokens but {len(cols)} slots")
            src = cols[acc[i] - 1]
        else:
            src = idx[i]
        if src == null_block_id:
            continue
        use_init = True if init is None else init[i]
        for hv in range(HV):
            hk = hv // grp
            st = _f64_list(ssm_states[src, hv])  # V x K
            h = [[st[a][b] if use_init else 0.0 for b in range(K)] for a in range(V)]
            for t in range(s, e):
                qt, kt = Q[t][hk], Kt[t][hk]
                if use_qk_l2norm:
                    qt, kt = _l2n(qt), _l2n(kt)
                decay = math.exp(G[t][hv])
                bt = Bt[t][hv]
                for a in range(V):
                    for b in range(K):
                        h[a][b] *= decay
                for a in range(V):
                    hk_dot = sum(h[a][b] * kt[b] for b in range(K))
                    u = bt * (Vt[t][hv][a] - hk_dot)
                    for b in range(K):
                        h[a][b] += u * kt[b]
                for a in range(V):
                    out[t, hv, a] = sum(h[a][b] * scale * qt[b] for b in range(K))
                if spec:
                    dst = cols[t - s]
                    if dst != null_block_id:
                        ssm_states[dst, hv] = torch.tensor(h, dtype=torch.float64)
            if not spec:
                ssm_states[src, hv] = torch.tensor(h, dtype=torch.float64)
    return out
