"""The one line a cell's result names for an engine's failure (testing/engine_errors.py).

The native-abort case is vLLM 0.23.0's own output from window 8 (plugin off, TurboQuant k8v4, MTP k=1,
FULL_AND_PIECEWISE graphs on an H200): a Python error, then C++'s terminate message and 22 stack
frames; the cell's result had named "frame #21: _start + 0x25 ..." as the failure."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_platform_ext.testing import cells
from vllm_platform_ext.testing.engine import EngineRun
from vllm_platform_ext.testing.engine_errors import error_line

RESULT = Path(__file__).resolve().parents[2] / "results/gpu/2026-11-29-0.23.0-full-matrix/2026-11-28-w8-0.23.0-full-shard02.json"
ILLEGAL = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"


def _native_abort_tail() -> str:
    """The kept error of a committed result: the engine's real output (its last 4000 characters)."""
    r = next(r for r in json.loads(RESULT.read_text()) if r["id"] == "qwen3_next-mtp1-k8v4-full_and_piecewise-off")
    return r["error_tail"]


def test_a_native_abort_is_named_by_its_python_error_not_a_stack_frame():
    tail = _native_abort_tail()
    assert tail.strip().splitlines()[-1].startswith("frame #")  # what the old rule (the last line) named
    assert error_line(tail) == ILLEGAL
    status, note = cells.judge(cells.Cell("qwen3_next", "mtp", 1, "turboquant_k8v4", "full_and_piecewise",
                                          plugin=False), EngineRun(mode="mtp", k=1, error=tail), [])
    assert (status, note) == ("upstream-crash", ILLEGAL)


@pytest.mark.parametrize("error,known,want", [
    # a known message wins over a later exception line
    ("AssertionError: Workspace is locked but\nRuntimeError: Engine core initialization failed.",
     ["Workspace is locked"], "AssertionError: Workspace is locked but"),
    # among the lines naming it, the exception line, not a native dump's what() echo after it
    ("torch.AcceleratorError: CUDA error: an illegal memory access\n  what():  CUDA error: an illegal memory access\n"
     "frame #0: c10::Error", ["an illegal memory access"], "torch.AcceleratorError: CUDA error: an illegal memory access"),
    # no exception line names it: the last line that does
    ("engine: an illegal memory access\n  what():  an illegal memory access", ["an illegal memory access"],
     "what():  an illegal memory access"),
    # no known message: the last exception line, not the trailing hint
    ("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: Unknown TurboQuant cache dtype: "
     "'auto'\nSee root cause above.", [], "ValueError: Unknown TurboQuant cache dtype: 'auto'"),
    ("RuntimeError\n", [], "RuntimeError"),
    # no exception line: the last line outside the native dump
    ("engine died\nterminate called after throwing an instance of 'c10::Error'\n  what():  boom\n"
     "frame #0: c10::Error::Error() + 0x9d\nframe #1: _start + 0x25", [], "engine died"),
    # nothing but a native dump: its last line (something is named)
    ("frame #0: a\nframe #1: b", [], "frame #1: b"),
    ("", [], ""),
    # the first 300 characters of a long line
    ("E" * 400, [], "E" * 300),
])
def test_error_line(error, known, want):
    assert error_line(error, known) == want


def test_a_line_of_the_form_name_error_inside_a_sentence_is_not_an_exception_line():
    assert error_line("ValueError: real one\nthe KeyError handler said hello") == "ValueError: real one"


def test_the_table_names_the_device_of_a_started_engine_when_the_first_cell_crashed():
    """A plugin-off shard's first cell can die before its engine names the device (window 8's shard 8
    of 0.26.0 printed "Measured ... on ?")."""
    from dataclasses import asdict

    crashed = cells.CellResult(cell=asdict(cells.Cell(kv="turboquant_k8v4", plugin=False)), id="a",
                               status="upstream-crash", error="ValueError: Unknown TurboQuant cache dtype: 'auto'")
    started = cells.CellResult(cell=asdict(cells.Cell(plugin=False)), id="b", status="upstream-works", bad=0.0,
                               floor=0.0, engine_path={"device": "NVIDIA H200"})
    assert " on NVIDIA H200;" in cells.markdown([crashed, started])
    assert " on ?;" in cells.markdown([crashed])
