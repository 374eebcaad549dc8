"""The Triton GDN ops under the Triton interpreter on CPU (fp32 and fp16), against the float64
reference: the same case table, bad-input table and spec-decode sequence as the torch ops.

``TRITON_INTERPRET=1`` must be set before Triton is imported and the main test process imports
Triton normally, so the kernels run in one subprocess: this file run as a script
(``python tests/ops/test_gdn_triton_interp.py --worker``) computes every result and prints JSON;
the tests below read it. bf16 is not tested here (the interpreter's bf16 arithmetic is wrong
upstream); the GPU tests cover it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DTYPES = ("float32", "float16")
SEQ_SEEDS = (0, 1, 2)
FUSED_CASES = ("rec-spec-random-0", "rec-mixed-q", "rec-plain-prefill", "rec-gva", "rec-null-read-slot",
               "rec-plain-decode")


def _worker() -> dict:
    import torch

    from vllm_platform_ext.testing import gdn_cases as GC
    from vllm_platform_ext.testing import gdn_harness as GH
    from vllm_platform_ext.ops.gdn import triton_ops as X

    out: dict = {"cases": {}, "bad": {}, "seq": {}, "fused": {}, "padded": {}, "triton": __import__("triton").__version__}
    for name, case in GC.standard_cases().items():
        for dt in DTYPES:
            key = f"{name}|{dt}"
            try:
                res = GH.run_and_compare(X, case, getattr(torch, dt))
                GH.assert_close(res, getattr(torch, dt))
                out["cases"][key] = {"ok": True, "res": res}
            except Exception as exc:  # noqa: BLE001 - reported per case
                out["cases"][key] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    # another launch shape of the recurrence (wide V blocks, through the small-grid switch)
    import functools
    import types

    big = types.SimpleNamespace(recurrent_gated_delta_rule=functools.partial(
        X.recurrent_gated_delta_rule, config={"SMALL_GRID": 1 << 20, "SMALL_BLOCK_V": 32, "SMALL_NUM_WARPS": 4}))
    for name, case in GC.standard_cases().items():
        if case["op"] != "recurrent_gated_delta_rule":
            continue
        try:
            GH.assert_close(GH.run_and_compare(big, case, torch.float32), torch.float32)
            out["cases"][f"{name}|other-launch-shape"] = {"ok": True, "res": {"op": case["op"], "out_dtype": "torch.float32"}}
        except Exception as exc:  # noqa: BLE001
            out["cases"][f"{name}|other-launch-shape"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    # a 16-bit SSM cache (fp16 here; bf16 on the GPU): read and written in its dtype
    for name, case in GC.standard_cases().items():
        if case["op"] != "recurrent_gated_delta_rule":
            continue
        try:
            GH.assert_close(GH.run_and_compare(X, case, torch.float32, ssm_dtype=torch.float16), torch.float32)
            out["cases"][f"{name}|ssm-fp16"] = {"ok": True}
        except Exception as exc:  # noqa: BLE001
            out["cases"][f"{name}|ssm-fp16"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    for name, (case, word) in GC.bad_input_cases().items():
        kind, msg = GH.expect_error(X, case, torch.float32)
        out["bad"][name] = {"kind": kind, "msg": msg, "word": word}
    big_k = GC.make_recurrent_case(1, num_spec=1, K=300, V=4, lengths=[1])
    kind, msg = GH.expect_error(X, big_k, torch.float32)
    out["bad"]["rec-head-dim-too-large"] = {"kind": kind, "msg": msg, "word": "head dim"}
    for seed in SEQ_SEEDS:
        for dt in DTYPES:
            try:
                out["seq"][f"{seed}|{dt}"] = GH.spec_sequence_check(X, seed, getattr(torch, dt))
            except Exception as exc:  # noqa: BLE001
                out["seq"][f"{seed}|{dt}"] = {"error": f"{type(exc).__name__}: {exc}"}
    for name, pair in GC.padded_row_cases().items():  # zero-token rows carrying garbage indices / counts
        for dt in DTYPES:
            try:
                GH.assert_close(GH.padded_compare(X, pair, getattr(torch, dt)), getattr(torch, dt))
                out["padded"][f"{name}|{dt}"] = {"ok": True}
            except Exception as exc:  # noqa: BLE001
                out["padded"][f"{name}|{dt}"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    cases = GC.standard_cases()
    for name in FUSED_CASES:
        for dt in DTYPES:
            try:
                res = GH.fused_gating_compare(X.fused_gating_recurrent_gated_delta_rule, cases[name], getattr(torch, dt))
                GH.assert_close(res, getattr(torch, dt))
                out["fused"][f"{name}|{dt}"] = {"ok": True}
            except Exception as exc:  # noqa: BLE001
                out["fused"][f"{name}|{dt}"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return out


@pytest.fixture(scope="module")
def interp():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"interpreter worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _case_names():
    from vllm_platform_ext.testing import gdn_cases as GC

    return sorted(GC.standard_cases())


def _bad_names():
    from vllm_platform_ext.testing import gdn_cases as GC

    return sorted(GC.bad_input_cases()) + ["rec-head-dim-too-large"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", _case_names())
def test_triton_interp_matches_reference(interp, name, dtype):
    r = interp["cases"][f"{name}|{dtype}"]
    assert r["ok"], r["error"]
    if r["res"]["op"] != "gdn_gating":
        assert r["res"]["out_dtype"] == f"torch.{dtype}"


def _rec_names():
    from vllm_platform_ext.testing import gdn_cases as GC

    return sorted(n for n, c in GC.standard_cases().items() if c["op"] == "recurrent_gated_delta_rule")


@pytest.mark.parametrize("name", _rec_names())
def test_triton_interp_recurrence_fp16_ssm_cache(interp, name):
    r = interp["cases"][f"{name}|ssm-fp16"]
    assert r["ok"], r["error"]


@pytest.mark.parametrize("name", _rec_names())
def test_triton_interp_recurrence_other_launch_shape(interp, name):
    r = interp["cases"][f"{name}|other-launch-shape"]
    assert r["ok"], r["error"]


@pytest.mark.parametrize("name", _bad_names())
def test_triton_interp_rejects_bad_input(interp, name):
    r = interp["bad"][name]
    assert r["kind"] == "raised", r
    assert r["word"].lower() in r["msg"].lower(), r


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEQ_SEEDS)
def test_triton_interp_spec_sequence_equals_plain_pass(interp, seed, dtype):
    err = interp["seq"][f"{seed}|{dtype}"]
    assert "error" not in err, err
    tol = 2e-5 if dtype == "float32" else 3e-3
    assert err["conv"] <= tol and err["rec"] <= tol, err


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FUSED_CASES)
def test_triton_interp_fused_gating_recurrence(interp, name, dtype):
    r = interp["fused"][f"{name}|{dtype}"]
    assert r["ok"], r.get("error")


def _padded_names():
    from vllm_platform_ext.testing import gdn_cases as GC

    return [f"{n}|{dt}" for n in sorted(GC.padded_row_cases()) for dt in DTYPES]


@pytest.mark.parametrize("name", _padded_names())
def test_triton_interp_ignores_padded_rows_with_garbage_indices(interp, name):
    """As the torch op's test: padded rows with state indices of -1 / 10**6 / the null block and accepted
    counts of 0 / -1 / 10**6 change nothing (outputs and the whole state pool as the reference without them)."""
    r = interp["padded"][name]
    assert r["ok"], r.get("error")


if __name__ == "__main__" and "--worker" in sys.argv:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    sys.path.insert(0, ROOT)
    print(json.dumps(_worker()))
