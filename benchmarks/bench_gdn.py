"""GDN spec-decode kernels: ours (``vllm_platform_ext.ops.gdn.triton_ops``) against vLLM's own
Triton kernels (copied from the installed wheel by ``vllm_gdn_carry.py`` into ``.carry``).

Modes (GPU; torch + Triton only, no vLLM needed):

* ``--xcheck``: vLLM's kernels against our float64 reference on rows without padding: evidence
  that the op contract is vLLM's math (spec conv offset, accepted-slot SSM read, l2norm eps,
  softplus threshold).
* ``--bench``: CUDA-graph medians (``triton.testing.do_bench_cudagraph``) over batch 1/8/64 and
  k = 1/3/5 drafts, Qwen3-Next-80B per-GPU shapes (H=16, HV=32, K=V=128, conv dim 8192, width 4,
  bf16 activations, fp32 SSM state, conv pool in vLLM's SD layout). Rows carry k+1 tokens and
  random accepted counts. Also: the cost of the state recovery (reading the accepted slot,
  fused) against the same step with every row at accepted = 1, and against a separate copy of
  the accepted state into column 0 (PR #40738's approach).
* ``--sanitize``: one pass of every op over cases with padding/null rows (for compute-sanitizer).

Writes JSON and a Markdown table to ``--out`` (default: stdout only).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import eager_ms, graph_ms, run_header, write_result  # noqa: E402

from vllm_platform_ext.testing import gdn_cases as GC  # noqa: E402
from vllm_platform_ext.testing import gdn_harness as GH  # noqa: E402
from vllm_platform_ext.ops.gdn import triton_ops as X  # noqa: E402

H, HV, K, V, W = 16, 32, 128, 128, 4
DEV = os.environ.get("GDN_BENCH_DEVICE", "cuda")  # "cpu" + TRITON_INTERPRET=1: smoke test of --xcheck/--sanitize
CONV_DIM = 2 * H * K + HV * V


def _vllm():
    import vllm_adapter

    return vllm_adapter


def _vllm_version() -> str | None:
    """Version of the vLLM whose GDN kernels were carried (vllm_gdn_carry.py), if they are here."""
    try:
        return _vllm().VLLM_VERSION
    except Exception:  # noqa: BLE001 - not carried yet: the header says so
        return None


# ------------------------------------------------------------------------------------------- xcheck


def xcheck() -> dict:
    VA = _vllm()
    out = {"vllm_version": VA.VLLM_VERSION, "cases": {}}
    cases = {
        "conv-update-spec": GC.make_conv_update_case(1, num_spec=3, lengths=[4, 1, 3, 2, 4], accepted=[4, 1, 2, 3, 1],
                                                    width=4, dim=256, transposed=True),
        "conv-update-spec-k5": GC.make_conv_update_case(2, num_spec=5, lengths=[6, 1, 6], accepted=[6, 3, 1], width=4,
                                                       dim=64, transposed=True),
        "conv-update-plain": GC.make_conv_update_case(3, num_spec=3, spec=False, lengths=[1, 1, 1], width=4, dim=64),
        "conv-prefill": GC.make_conv_prefill_case(4, lengths=[37, 5, 2, 90], width=4, dim=128, extra_state=3,
                                                 init=[True, False, True, True], transposed=True),
        "rec-spec": GC.make_recurrent_case(5, num_spec=3, lengths=[4, 1, 2, 4], accepted=[1, 4, 2, 3], H=1, HV=2,
                                          K=128, V=128),
        "rec-plain-decode": GC.make_recurrent_case(6, spec=False, lengths=[1, 1], init=[True, True], H=2, HV=4, K=32,
                                                  V=32),
    }
    for name, case in cases.items():
        for dt in (torch.float32, torch.bfloat16):
            try:
                res = GH.run_and_compare(VA.OPS, case, dt, DEV)
                GH.assert_close(res, dt)
                out["cases"][f"{name}|{dt}"] = {"ok": True, "out_err": res["out"]["max_abs"],
                                                 "state_err": res["state"]["max_abs"]}
            except Exception as exc:  # noqa: BLE001
                out["cases"][f"{name}|{dt}"] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    for name in ("rec-spec",):
        for dt in (torch.float32, torch.bfloat16):
            try:
                res = GH.fused_gating_compare(VA.fused_gating_recurrent_gated_delta_rule, cases[name], dt, DEV)
                GH.assert_close(res, dt)
                out["cases"][f"{name}-sigmoid-gating|{dt}"] = {"ok": True, "out_err": res["out"]["max_abs"]}
            except Exception as exc:  # noqa: BLE001
                out["cases"][f"{name}-sigmoid-gating|{dt}"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return out


# -------------------------------------------------------------------------------------------- bench


def _problem(B: int, k: int, seed: int = 0, dev="cuda", dt=torch.bfloat16):
    g = torch.Generator(device="cpu").manual_seed(seed)
    S = k + 1
    T = B * S
    slots = 1 + B * S
    r = lambda *s: torch.randn(*s, generator=g).to(device=dev, dtype=dt)  # noqa: E731
    p = dict(
        x=r(T, CONV_DIM), w=r(CONV_DIM, W) * 0.3, bias=r(CONV_DIM),
        conv=torch.randn(slots, W - 1 + k, CONV_DIM, generator=g).to(device=dev, dtype=dt).transpose(1, 2),
        q=r(T, H, K), k=r(T, H, K), v=r(T, HV, V), a=r(T, HV), b=r(T, HV),
        A_log=r(HV), dt_bias=r(HV),
        ssm=(torch.randn(slots, HV, V, K, generator=g) * 0.1).to(dev),
        qsl=torch.arange(0, T + 1, S, dtype=torch.int32, device=dev),
        table=(torch.arange(B * S, dtype=torch.int32) + 1).reshape(B, S).to(dev),
        acc=torch.randint(1, S + 1, (B,), generator=g).to(device=dev, dtype=torch.int32),
        scale=K ** -0.5, S=S, T=T,
    )
    p["ones"] = torch.ones_like(p["acc"])
    p["g"], p["beta"] = X.gdn_gating(p["A_log"], p["a"], p["b"], p["dt_bias"])
    return p


def _bench(fn) -> float:
    """CUDA-graph median in us (bench_common.graph_ms)."""
    return graph_ms(fn) * 1e3


def bench(batches=(1, 8, 64), ks=(1, 3, 5)) -> dict:
    VA = _vllm()
    rows = []
    for B in batches:
        for k in ks:
            p = _problem(B, k)
            conv_idx = p["table"][:, 0]

            def ours_conv(acc=p["acc"]):
                return X.causal_conv1d_update(p["x"], p["conv"], p["w"], p["bias"], "silu", conv_idx, p["qsl"], acc)

            out_buf = torch.empty_like(p["x"])

            def vllm_conv():
                return VA._cc.causal_conv1d_update(p["x"], p["conv"], p["w"], p["bias"], "silu",
                                                   conv_state_indices=conv_idx, num_accepted_tokens=p["acc"],
                                                   query_start_loc=p["qsl"], max_query_len=p["S"], out=out_buf)

            def ours_rec(acc=p["acc"]):
                return X.recurrent_gated_delta_rule(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], p["ssm"],
                                                    p["qsl"], p["table"], acc)

            def vllm_rec():
                return VA.recurrent_gated_delta_rule(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], p["ssm"],
                                                     p["qsl"], p["table"], p["acc"])

            def ours_fused(acc=p["acc"]):
                return X.fused_gating_recurrent_gated_delta_rule(p["q"], p["k"], p["v"], p["A_log"], p["a"], p["b"],
                                                                 p["dt_bias"], p["scale"], p["ssm"], p["qsl"],
                                                                 p["table"], acc)

            def vllm_fused():
                return VA.fused_gating_recurrent_gated_delta_rule(p["q"], p["k"], p["v"], p["A_log"], p["a"], p["b"],
                                                                  p["dt_bias"], p["scale"], p["ssm"], p["qsl"],
                                                                  p["table"], p["acc"])

            def ours_gating():
                return X.gdn_gating(p["A_log"], p["a"], p["b"], p["dt_bias"])

            def ours_step(acc=p["acc"]):
                ours_conv(acc)
                ours_fused(acc)

            def ours_step_acc1():
                ours_step(p["ones"])

            def vllm_step():
                vllm_conv()
                vllm_fused()

            src = p["table"].gather(1, (p["acc"] - 1).long()[:, None])[:, 0].long()
            dst = conv_idx.long()

            def copy_recovery():  # PR #40738's separate pre-copy of the accepted SSM state into column 0
                p["ssm"].index_copy_(0, dst, p["ssm"].index_select(0, src))

            t = {name: _bench(fn) for name, fn in [
                ("ours_conv", ours_conv), ("vllm_conv", vllm_conv), ("ours_rec", ours_rec), ("vllm_rec", vllm_rec),
                ("ours_fused", ours_fused), ("vllm_fused", vllm_fused), ("ours_gating", ours_gating),
                ("ours_step", ours_step), ("ours_step_acc1", ours_step_acc1), ("vllm_step", vllm_step),
                ("copy_recovery", copy_recovery)]}
            # the recovery's cost: the same step with every row reading column 0 (acc = 1),
            # measured three times each, interleaved, to see the noise
            pair = [(_bench(ours_step), _bench(ours_step_acc1)) for _ in range(3)]
            t["ours_step_med"] = statistics.median(a for a, _ in pair)
            t["ours_step_acc1_med"] = statistics.median(b for _, b in pair)
            t["recovery_pct"] = 100.0 * (t["ours_step_med"] - t["ours_step_acc1_med"]) / t["ours_step_med"]
            t["copy_recovery_pct"] = 100.0 * t["copy_recovery"] / t["ours_step_med"]
            row = {"B": B, "k": k, "T": p["T"], **{n: round(v, 3) for n, v in t.items()}}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del p
            torch.cuda.empty_cache()
    # launch-config sweep of the recurrence (BLOCK_V, num_warps) at two sizes
    sweep = []
    for B, k in ((8, 3), (64, 3)):
        p = _problem(B, k)
        for bv, nw in ((32, 1), (16, 1), (16, 2), (32, 2), (32, 4), (8, 1), (64, 4)):
            cfg = {"BLOCK_V": bv, "num_warps": nw}
            us = _bench(lambda: X.fused_gating_recurrent_gated_delta_rule(
                p["q"], p["k"], p["v"], p["A_log"], p["a"], p["b"], p["dt_bias"], p["scale"], p["ssm"], p["qsl"],
                p["table"], p["acc"], config=cfg))
            sweep.append({"B": B, "k": k, "BLOCK_V": bv, "num_warps": nw, "us": round(us, 3)})
        for bd, nw in ((256, 4), (128, 4), (512, 4), (256, 8), (128, 2)):
            cfg = {"BLOCK_D": bd, "num_warps": nw}
            us = _bench(lambda: X.causal_conv1d_update(p["x"], p["conv"], p["w"], p["bias"], "silu", p["table"][:, 0],
                                                       p["qsl"], p["acc"], config=cfg))
            sweep.append({"B": B, "k": k, "conv_BLOCK_D": bd, "num_warps": nw, "us": round(us, 3)})
        del p
    print(json.dumps(sweep), flush=True)
    # prefill conv, one shape
    g = torch.Generator().manual_seed(1)
    lens = [1024, 1024, 512, 256]
    T = sum(lens)
    x = torch.randn(T, CONV_DIM, generator=g).cuda().bfloat16()
    w = (torch.randn(CONV_DIM, W, generator=g) * 0.3).cuda().bfloat16()
    bias = torch.randn(CONV_DIM, generator=g).cuda().bfloat16()
    conv = torch.randn(9, W - 1 + 3, CONV_DIM, generator=g).cuda().bfloat16().transpose(1, 2)
    qsl = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32).cuda()
    idx = torch.tensor([1, 2, 3, 4], dtype=torch.int32).cuda()
    init = torch.tensor([True, False, True, True]).cuda()
    pre = {
        "ours_prefill": _bench_eager(lambda: X.causal_conv1d_prefill(x, w, bias, conv, qsl, idx, init)),
        "vllm_prefill": _bench_eager(lambda: VA.causal_conv1d_prefill(x, w, bias, conv, qsl, idx, init)),
        "tokens": T,
    }
    print(json.dumps(pre), flush=True)
    eager = {}
    p = _problem(8, 3)
    conv_idx = p["table"][:, 0]
    for flag in ("1", "0"):
        os.environ[X.VALIDATE_ENV] = flag
        eager[f"ours_step_eager_validate{flag}"] = _bench_eager(lambda: (
            X.causal_conv1d_update(p["x"], p["conv"], p["w"], p["bias"], "silu", conv_idx, p["qsl"], p["acc"]),
            X.fused_gating_recurrent_gated_delta_rule(p["q"], p["k"], p["v"], p["A_log"], p["a"], p["b"], p["dt_bias"],
                                                      p["scale"], p["ssm"], p["qsl"], p["table"], p["acc"])))
    os.environ[X.VALIDATE_ENV] = "1"
    eager["vllm_step_eager"] = _bench_eager(lambda: (
        VA._cc.causal_conv1d_update(p["x"], p["conv"], p["w"], p["bias"], "silu", conv_state_indices=conv_idx,
                                    num_accepted_tokens=p["acc"], query_start_loc=p["qsl"], max_query_len=4),
        VA.fused_gating_recurrent_gated_delta_rule(p["q"], p["k"], p["v"], p["A_log"], p["a"], p["b"], p["dt_bias"],
                                                   p["scale"], p["ssm"], p["qsl"], p["table"], p["acc"])))
    print(json.dumps(eager), flush=True)
    return {"rows": rows, "prefill": pre, "eager_B8_k3": eager, "sweep": sweep}


def sweep(batches=(1, 2, 4, 8, 16, 64), ks=(1, 3)) -> list:
    """Recurrence launch shapes (BLOCK_V, num_warps, num_stages) by batch: picks the policy."""
    out = []
    cfgs = [(32, 4, 3), (32, 4, 2), (16, 4, 2), (16, 2, 2), (8, 2, 2), (8, 4, 2), (16, 1, 2), (8, 1, 2),
            (32, 1, 2), (32, 2, 2), (4, 1, 2)]
    for B in batches:
        for k in ks:
            p = _problem(B, k)
            row = {"B": B, "k": k}
            for bv, nw, ns in cfgs:
                cfg = {"BLOCK_V": bv, "num_warps": nw, "num_stages": ns, "SMALL_GRID": 0}
                row[f"{bv}/{nw}/{ns}"] = round(_bench(lambda: X.fused_gating_recurrent_gated_delta_rule(
                    p["q"], p["k"], p["v"], p["A_log"], p["a"], p["b"], p["dt_bias"], p["scale"], p["ssm"], p["qsl"],
                    p["table"], p["acc"], config=cfg)), 3)
            row["default"] = round(_bench(lambda: X.fused_gating_recurrent_gated_delta_rule(
                p["q"], p["k"], p["v"], p["A_log"], p["a"], p["b"], p["dt_bias"], p["scale"], p["ssm"], p["qsl"],
                p["table"], p["acc"])), 3)
            row["vllm_fused"] = round(_bench(lambda: _vllm().fused_gating_recurrent_gated_delta_rule(
                p["q"], p["k"], p["v"], p["A_log"], p["a"], p["b"], p["dt_bias"], p["scale"], p["ssm"], p["qsl"],
                p["table"], p["acc"])), 3)
            print(json.dumps(row), flush=True)
            out.append(row)
            del p
    return out


def _bench_eager(fn) -> float:
    """Eager median in us, host time included (bench_common.eager_ms)."""
    return eager_ms(fn) * 1e3


def markdown(res: dict) -> str:
    lines = ["| B | k | conv upd ours / vLLM (us) | recurrent ours / vLLM | fused gating+rec ours / vLLM "
             "| step ours / vLLM | step ratio | recovery (fused) | separate copy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(
            f"| {r['B']} | {r['k']} | {r['ours_conv']:.1f} / {r['vllm_conv']:.1f} | {r['ours_rec']:.1f} / "
            f"{r['vllm_rec']:.1f} | {r['ours_fused']:.1f} / {r['vllm_fused']:.1f} | {r['ours_step']:.1f} / "
            f"{r['vllm_step']:.1f} | {r['ours_step'] / r['vllm_step']:.2f} | {r['recovery_pct']:+.2f}% | "
            f"{r['copy_recovery']:.1f} us = {r['copy_recovery_pct']:.1f}% |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- sanitize


SAN_DT = torch.bfloat16 if DEV == "cuda" else torch.float32


def sanitize() -> dict:
    done = {}
    cases = GC.standard_cases()
    for name in ("update-mixed-q", "update-null-slots", "update-plain-decode", "prefill-long-rows",
                 "prefill-null-slot", "rec-mixed-q", "rec-null-read-slot", "rec-null-write-column",
                 "rec-plain-prefill", "rec-wide-v", "gating-random-0"):
        res = GH.run_and_compare(X, cases[name], SAN_DT, DEV)
        GH.assert_close(res, SAN_DT)
        done[name] = "ok"
    # CUDA-graph-style padding: tokens beyond query_start_loc[-1], an out-of-range slot with
    # validation off (must be skipped, not read)
    os.environ[X.VALIDATE_ENV] = "0"
    p = _problem(4, 3, dev=DEV, dt=SAN_DT)
    p["qsl"][-1] -= 2
    p["table"][1, 2] = 10 ** 6
    p["acc"][0] = 9  # clamped in the kernel
    X.causal_conv1d_update(p["x"], p["conv"], p["w"], p["bias"], "silu", p["table"][:, 0], p["qsl"], p["acc"])
    X.fused_gating_recurrent_gated_delta_rule(p["q"], p["k"], p["v"], p["A_log"], p["a"], p["b"], p["dt_bias"],
                                              p["scale"], p["ssm"], p["qsl"], p["table"], p["acc"])
    if DEV == "cuda":
        torch.cuda.synchronize()
    os.environ[X.VALIDATE_ENV] = "1"
    done["padding-and-bad-slots-unvalidated"] = "ok"
    return done


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--xcheck", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--ks", default="1,3,5")
    a = ap.parse_args()
    res: dict = {"header": run_header(vllm_kernels=_vllm_version())}
    if a.sanitize:
        res["sanitize"] = sanitize()
        print(json.dumps(res["sanitize"]))
    if a.sweep:
        res["sweep"] = sweep()
    if a.xcheck:
        res["xcheck"] = xcheck()
        print(json.dumps(res["xcheck"], indent=1))
    if a.bench:
        res["bench"] = bench(tuple(int(b) for b in a.batches.split(",")), tuple(int(k) for k in a.ks.split(",")))
        md = markdown(res["bench"])
        print(md)
        res["markdown"] = md
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bench_gdn_sweep.json" if a.sweep and not a.bench else "bench_gdn.json"), "w") as f:
            json.dump(res, f, indent=1)
        if "markdown" in res:
            write_result(os.path.join(a.out, "bench_gdn.md"), "GDN spec-decode kernels: ours vs vLLM's own",
                         res["header"], res["markdown"], res["bench"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
