"""The engine contract of the TurboQuant verify route, on every vLLM line whose wheel the project
keeps (0.22-0.26, 0.32, 0.33): each line's real TurboQuant backend, a cache of that line's own
shape written by that line's own store kernel (Triton interpreter), the plugin's patched
``forward`` under ``torch.inference_mode()`` with inference tensors -- against float64 attention
over the K/V read back from the cache bytes through the axes each release documents (the child's
``EXPECTED_AXES``, not the plugin's probe) and dequantized in float64.

This is the class of bug the first GPU runs found and CPU CI did not: on 0.23 the route read the
block size as the KV-head count (``num_q_heads 4 is not a multiple of num_kv_heads 64``); the MSE
presets then failed on inference tensors (``Inference tensors do not track version counter``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, line_source
from vllm_platform_ext.compat import schemas

CHILD = os.path.join(REPO, "tests", "patch", "tq_engine_contract_child.py")
LINES = sorted(schemas.TABLE_SOURCES)
EXPECTED_LAYOUT = {"BNHC": "(blocks, tokens, heads, slot)", "BHNC": "(blocks, heads, tokens, slot)"}


def run_child(key: tuple[int, int], plugin_root: str = REPO, op: str = "torch", presets=(), route: str = "",
              output: str = "3d") -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([line_source(key), plugin_root]), VLLM_PLUGINS="",
               TRITON_INTERPRET="1", CONTRACT_OP=op, CONTRACT_ROUTE=route, CONTRACT_OUTPUT=output)
    proc = subprocess.run([sys.executable, CHILD, *presets], capture_output=True, text=True, env=env, timeout=900,
                          cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"child printed no result (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("key", LINES, ids=[".".join(map(str, k)) for k in LINES])
def test_verify_route_in_the_lines_own_cache(key):
    sys.path.insert(0, os.path.dirname(CHILD))
    try:
        from tq_engine_contract_child import EXPECTED_AXES, PRESETS
    finally:
        sys.path.pop(0)
    res = run_child(key)
    assert "error" not in res, f"{res.get('error')}\n{res.get('trace')}"
    assert res["vllm"].startswith(f"{key[0]}.{key[1]}.") and res["vllm_file"].startswith(line_source(key))
    assert res["skip_if"] is None
    assert res["probed"].startswith(EXPECTED_LAYOUT[EXPECTED_AXES[key]]), res["probed"]
    assert [p["preset"] for p in res["presets"]] == [p for p in PRESETS for _ in (0, 1, 2)]
    assert [p.get("route") for p in res["presets"]] == ["k+1", "rows", "decode"] * len(PRESETS)
    for p in res["presets"]:
        assert "error" not in p, f"{p['preset']}: {p['error']}\n{p.get('trace')}"
        assert p["inference_tensors"], p
        # the line's store and the documented axes agree: the read-back K/V are the written ones
        # up to the preset's quantization (fp8 keys ~0.09, 3-bit ~0.19 relative)
        assert max(p["store_rel_err"]) < 0.25, p
        assert p["max_abs_err"] < 1e-4, p
        assert p["rows_past_end_untouched"], p


@pytest.mark.parametrize("key", [(0, 23), (0, 26)], ids=["0.23", "0.26"])
def test_triton_kernel_in_the_lines_own_cache(key):
    """The same contract through the Triton verify kernel (the entry MACA and pre-Gluon GPUs take),
    run by the interpreter on the line's token-major (0.23) and head-major (0.26) cache."""
    res = run_child(key, op="triton", presets=("turboquant_k8v4", "turboquant_3bit_nc"))
    assert "error" not in res, f"{res.get('error')}\n{res.get('trace')}"
    assert res["op"].endswith("triton_verify:turboquant_verify_attention")
    for p in res["presets"]:
        assert "error" not in p, f"{p['preset']}: {p['error']}\n{p.get('trace')}"
        assert max(p["store_rel_err"]) < 0.25 and p["inference_tensors"], p
        assert p["max_abs_err"] < 2e-3, p  # fp16 operands in the kernel's dots
        assert p["rows_past_end_untouched"], p


@pytest.mark.parametrize("key", [(0, 23), (0, 26)], ids=["0.23", "0.26"])
def test_synthetic_row_route_runs_the_lines_decode_kernel(key):
    """Benchmark configuration R (``VLLM_PLATFORM_EXT_TQ_VERIFY_ROUTE=upstream_rows``, vLLM PR
    #40914's routing): a uniform K+1 batch goes through the line's own single-token decode kernel
    (Triton interpreter) on B x (K+1) synthetic rows -- one call, every row -- and matches float64
    causal attention like the K+1 kernel; the mixed batch keeps the plugin's one-row-per-token op.
    On 0.26 (head-major cache) the kernel must get the probed op view, not vLLM's tensor: handed
    the raw cache, the interpreter crashed (block size read as the head count)."""
    res = run_child(key, presets=("turboquant_k8v4", "turboquant_4bit_nc"), route="upstream_rows")
    assert "error" not in res, f"{res.get('error')}\n{res.get('trace')}"
    assert len(res["presets"]) == 4
    for p in res["presets"]:
        assert "error" not in p, f"{p['preset']}: {p['error']}\n{p.get('trace')}"
        uniform = p["route"] == "k+1"
        assert p["upstream_rows_calls"] == (1 if uniform else 0), p
        assert p["max_abs_err"] < 1e-4, p
        assert p["rows_past_end_untouched"], p


@pytest.mark.parametrize("route", ["", "upstream_rows"], ids=["kernel", "upstream_rows"])
def test_a_flat_output_view_too(route):
    """vLLM's layer hands a ``[tokens, heads, head_size]`` output view (the other tests); a backend
    called with a flat ``[tokens, heads x head_size]`` one gets the same rows (0.26, k8v4)."""
    res = run_child((0, 26), presets=("turboquant_k8v4",), route=route, output="2d")
    assert "error" not in res, f"{res.get('error')}\n{res.get('trace')}"
    for p in res["presets"]:
        assert "error" not in p and p["max_abs_err"] < 1e-4 and p["rows_past_end_untouched"], p
