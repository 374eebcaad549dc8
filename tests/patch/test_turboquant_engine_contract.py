"""The engine contract of the TurboQuant verify route, on every vLLM line whose wheel the project
keeps (0.22-0.34, ``compat.lines.LINES``): each line's real TurboQuant backend, a cache of that line's own
shape written by that line's own store kernel (Triton interpreter), the plugin's patched
``forward`` under ``torch.inference_mode()`` with inference tensors -- against float64 attention
over the K/V read back from the cache bytes through the axes each release documents (the child's
``EXPECTED_AXES``, not the plugin's probe) and dequantized in float64.

This is the class of bug the first GPU runs found and CPU CI did not: on 0.23 the route read the
block size as the KV-head count (``num_q_heads 4 is not a multiple of num_kv_heads 64``); the MSE
presets then failed on inference tensors (``Inference tensors do not track version counter``).

Every check this file makes on one line runs in one child process (:func:`line_results`, the
child's ``CONTRACT_JOBS``), each check with fresh impls and its own cache written by the store kernel
again, exactly as it ran alone in its own child: the interpreter start and vLLM's import are shared,
nothing a check reads (2026-12-03: 18 children became 7, CI time).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, line_source
from vllm_platform_ext.compat import schemas
from vllm_platform_ext.patch.turboquant import route_check

CHILD = os.path.join(REPO, "tests", "patch", "tq_engine_contract_child.py")
LINES = sorted(schemas.TABLE_SOURCES)
EXPECTED_LAYOUT = {"BNHC": "(blocks, tokens, heads, slot)", "BHNC": "(blocks, heads, tokens, slot)"}

# The line's store read back through the documented axes: relative error (Frobenius) of the K and the V read
# back against those written -- the preset's quantization and nothing else (bytes read through a wrong axis
# belong to other tokens, independent normals: about 1.4). Measured 2026-12-02 on CPU with the child as it
# runs here (each line's own store kernel under TRITON_INTERPRET=1, e4nv fp8 keys, torch.manual_seed(0),
# 66 tokens x 2 KV heads x head dim 64, dequantized by the float64 reference), the same to 5 digits on
# 0.22-0.26, 0.32 and 0.33 and for every batch shape of the child (the store does not depend on it):
#
#   preset               K        V
#   turboquant_k8v4      0.08742  0.08996   (fp8 keys, 4-bit values)
#   turboquant_4bit_nc   0.09461  0.08996
#   turboquant_k3v4_nc   0.18270  0.08996
#   turboquant_3bit_nc   0.18270  0.19315
#
# Each must stay within 1.2x of its measured value, either way (3-bit where 4 are named, or 4 where 3 are,
# moves it by about 2x: 0.183 against 0.095 and 0.090).
STORE_REL_ERR = {"turboquant_k8v4": (0.08742, 0.08996), "turboquant_4bit_nc": (0.09461, 0.08996),
                 "turboquant_k3v4_nc": (0.18270, 0.08996), "turboquant_3bit_nc": (0.18270, 0.19315)}
STORE_SLACK = 1.2


def store_err_problem(p: dict) -> str | None:
    """Why the preset's read-back K/V errors are off the measured ones, or None."""
    for side, got, want in zip("KV", p["store_rel_err"], STORE_REL_ERR[p["preset"]]):
        if not want / STORE_SLACK <= got <= want * STORE_SLACK:
            return f"{p['preset']} {side}: store relative error {got:.5f}, measured {want:.5f} (x{STORE_SLACK} either way)"
    return None


def _child(key: tuple[int, int], plugin_root: str, args: list[str], extra: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([line_source(key), plugin_root]), VLLM_PLUGINS="",
               TRITON_INTERPRET="1", **extra)
    proc = subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True, env=env, timeout=1800,
                          cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"child printed no result (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def run_child(key: tuple[int, int], plugin_root: str = REPO, op: str = "torch", presets=(), route: str = "",
              output: str = "3d") -> dict:
    """One check in a child of its own (a check run by hand; the tests take :func:`line_results`)."""
    return _child(key, plugin_root, list(presets), dict(CONTRACT_OP=op, CONTRACT_ROUTE=route, CONTRACT_OUTPUT=output))


TRITON_PRESETS = ("turboquant_k8v4", "turboquant_3bit_nc")
CPU_CHECK_TOL = 0.01  # the route check's largest per-row relative difference here (measured: see the test)
TRITON_LINES = ((0, 23), (0, 26))  # token-major and head-major caches
FLAT_LINE = (0, 26)


def line_checks(key: tuple[int, int]) -> dict:
    """The checks the tests below make on line ``key``: name -> the child's job (op, route, output, presets)."""
    jobs = {"verify": dict(op="torch", route="", output="3d", presets=list(_verify_presets(key)))}
    if key in TRITON_LINES:
        jobs["triton"] = dict(op="triton", route="", output="3d", presets=list(TRITON_PRESETS), check=True)
    jobs["upstream_rows"] = dict(op="torch", route="upstream_rows", output="3d", presets=list(dict(_decode_cases())[key]))
    if key == FLAT_LINE:
        for route in ("", "upstream_rows"):
            jobs[f"flat-{route or 'kernel'}"] = dict(op="torch", route=route, output="2d", presets=["turboquant_k8v4"])
    return jobs


@functools.lru_cache(maxsize=None)
def child_module():
    """The child script as a module (its EXPECTED_AXES and PRESETS), imported once from its folder."""
    sys.path.insert(0, os.path.dirname(CHILD))
    try:
        import tq_engine_contract_child
    finally:
        sys.path.pop(0)
    return tq_engine_contract_child


ALL_PRESET_LINES = ((0, 23), (0, 26))  # vLLM-metax's two cache layouts; and the newest line (below)


def _verify_presets(key: tuple[int, int]) -> tuple[str, ...]:
    """The presets of the verify check on line ``key``: every preset on 0.23, 0.26 (vLLM-metax's token- and
    head-major caches) and the newest kept line; one in turn on each other line, so every line runs the route
    on its own cache and every preset runs on several lines. Every preset on all 15 lines was ~1,250 s of CI's
    test time on 2 shared cores (2026-12-07: 30-266 s a line)."""
    PRESETS = child_module().PRESETS
    if key in ALL_PRESET_LINES or key == max(LINES):
        return tuple(PRESETS)
    others = [k for k in LINES if k not in ALL_PRESET_LINES and k != max(LINES)]
    return (PRESETS[others.index(key) % len(PRESETS)],)


def test_every_preset_runs_on_several_lines():
    runs = {pr: [k for k in LINES if pr in _verify_presets(k)] for pr in _verify_presets(max(LINES))}
    assert all(len(v) >= 4 for v in runs.values()), runs


@functools.lru_cache(maxsize=None)
def line_results(key: tuple[int, int]) -> dict:
    """Every check of :func:`line_checks` on line ``key`` in one child, run once per test process:
    name -> that check's result, as a child of its own would print it."""
    jobs = line_checks(key)
    res = _child(key, REPO, [], dict(CONTRACT_JOBS=json.dumps(list(jobs.values()))))
    if "jobs" not in res:  # the child failed before its first check: each test shows the error
        return {name: res for name in jobs}
    return dict(zip(jobs, res["jobs"]))


@pytest.mark.parametrize("key", LINES, ids=[".".join(map(str, k)) for k in LINES])
def test_verify_route_in_the_lines_own_cache(key):
    EXPECTED_AXES, PRESETS = child_module().EXPECTED_AXES, child_module().PRESETS
    res = line_results(key)["verify"]
    assert "error" not in res, f"{res.get('error')}\n{res.get('trace')}"
    assert res["vllm"].startswith(f"{key[0]}.{key[1]}.") and res["vllm_file"].startswith(line_source(key))
    assert res["skip_if"] is None
    assert res["probed"].startswith(EXPECTED_LAYOUT[EXPECTED_AXES[key]]), res["probed"]
    presets = _verify_presets(key)
    assert set(presets) <= set(PRESETS)
    assert [p["preset"] for p in res["presets"]] == [p for p in presets for _ in (0, 1, 2)]
    assert [p.get("route") for p in res["presets"]] == ["k+1", "rows", "decode"] * len(presets)
    for p in res["presets"]:
        assert "error" not in p, f"{p['preset']}: {p['error']}\n{p.get('trace')}"
        assert p["inference_tensors"], p
        # the line's store and the documented axes agree: the read-back K/V are the written ones
        # up to the preset's quantization (STORE_REL_ERR)
        assert store_err_problem(p) is None, (store_err_problem(p), p)
        assert p["max_abs_err"] < 1e-4, p
        assert p["rows_past_end_untouched"], p


@pytest.mark.parametrize("key", TRITON_LINES, ids=[".".join(map(str, k)) for k in TRITON_LINES])
def test_triton_kernel_in_the_lines_own_cache(key):
    """The same contract through the Triton verify kernel (the entry MACA and pre-Gluon GPUs take),
    run by the interpreter on the line's token-major (0.23) and head-major (0.26) cache."""
    res = line_results(key)["triton"]
    assert "error" not in res, f"{res.get('error')}\n{res.get('trace')}"
    assert res["op"].endswith("triton_verify:turboquant_verify_attention")
    for p in res["presets"]:
        assert "error" not in p, f"{p['preset']}: {p['error']}\n{p.get('trace')}"
        # VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK=1 (the GPU cells' audit of the route): the route's rows again through
        # the line's own decode kernel, one call, each row's window computed apart from the route's
        kind = {"k+1": "k1", "rows": "rows", "decode": "decode"}[p["route"]]
        chk = p["route_check"]
        assert chk["enabled"] and [chk[f"{k}_calls"] for k in route_check.KINDS] == [
            int(k == kind) for k in route_check.KINDS], chk
        assert chk[f"{kind}_max_rel"] < CPU_CHECK_TOL, (f"{p['preset']} {kind}: the route differs from the line's "
                                                         f"decode kernel by {chk[f'{kind}_max_rel']:.4f}", chk)
        assert store_err_problem(p) is None and p["inference_tensors"], (store_err_problem(p), p)
        assert p["max_abs_err"] < 2e-3, p  # fp16 operands in the kernel's dots
        assert p["rows_past_end_untouched"], p


def _decode_cases() -> list:
    """(line, presets) of the decode-kernel check: k8v4 and 4bit_nc on vLLM-metax's two cache layouts (0.23
    token-major, 0.26 head-major), and on each other line one preset in turn, the other presets first, so every
    line and every preset
    run the line's own kernel and the CI time stays bounded (the interpreter takes 30-55 s a preset here:
    every preset on every line was ~20 min on 2 shared cores, 2026-12-02)."""
    PRESETS = child_module().PRESETS
    metax = ("turboquant_k8v4", "turboquant_4bit_nc")  # the presets vLLM-metax's users run
    turn = [p for p in PRESETS if p not in metax] + list(metax)  # the others first: every preset runs somewhere
    others = [k for k in LINES if k not in ((0, 23), (0, 26))]
    return [(k, metax) for k in LINES if k in ((0, 23), (0, 26))] + [
        (k, (turn[i % len(turn)],)) for i, k in enumerate(others)]


@pytest.mark.parametrize("key,presets", _decode_cases(),
                         ids=[f"{'.'.join(map(str, k))}-{'+'.join(x.removeprefix('turboquant_') for x in p)}"
                              for k, p in _decode_cases()])
def test_synthetic_row_route_runs_the_lines_decode_kernel(key, presets):
    """Benchmark configuration R (``VLLM_PLATFORM_EXT_TQ_VERIFY_ROUTE=upstream_rows``, vLLM PR
    #40914's routing): a uniform K+1 batch goes through the line's own single-token decode kernel
    (Triton interpreter) on B x (K+1) synthetic rows -- one call, every row -- and matches float64
    causal attention like the K+1 kernel; the mixed batch keeps the plugin's one-row-per-token op.
    k8v4 and 4bit_nc on 0.23 and 0.26, one preset in turn on each other line (:func:`_decode_cases`). On 0.26
    (head-major cache) the kernel
    must get the probed op view, not vLLM's tensor: handed the raw cache, the interpreter crashed
    (block size read as the head count). The interpreter runs the kernel's Python with e4nv fp8 keys;
    the compiled kernel, e4b15 keys (pre-Hopper, MetaX) and CUDA graphs run only on a GPU
    (tests/ops/test_turboquant_gpu.py, with the installed line's kernels)."""
    res = line_results(key)["upstream_rows"]
    assert "error" not in res, f"{res.get('error')}\n{res.get('trace')}"
    assert res["vllm"].startswith(f"{key[0]}.{key[1]}.")
    assert [p["preset"] for p in res["presets"]] == [p for p in presets for _ in (0, 1)]
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
    res = line_results(FLAT_LINE)[f"flat-{route or 'kernel'}"]
    assert "error" not in res, f"{res.get('error')}\n{res.get('trace')}"
    for p in res["presets"]:
        assert "error" not in p and p["max_abs_err"] < 1e-4 and p["rows_past_end_untouched"], p
