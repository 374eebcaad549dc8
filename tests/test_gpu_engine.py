"""The real vLLM engine on a GPU, one test per cell of a suite (``verify/cells.py``).

Run by the GPU harness (``ci/gpu/run.sh``) on the GPU machine; CPU CI deselects it (``gpu``).
The suite's engines run once, side by side, in a session fixture; each test then judges its
cell. With the plugin a cell must start, stay at the float32 audit's plain-decoding floor and,
when speculative, have drafts accepted. A plugin-off cell records upstream's behaviour for the
table; its test checks only that the outcome was recorded. Environment: ``VPE_CELLS_SUITE`` (core), ``VPE_CELLS_SHARD``
(1/1), ``VPE_CELLS_PARALLEL`` (4), ``VPE_CELLS_OUT`` (gpu-results).
"""
import os
import tempfile
from pathlib import Path

import pytest

from vllm_platform_ext.verify import cells

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_engine]

SUITE = os.environ.get("VPE_CELLS_SUITE", "core")
SHARD = os.environ.get("VPE_CELLS_SHARD", "1/1")
PARALLEL = int(os.environ.get("VPE_CELLS_PARALLEL", "4"))
CELLS = cells.select(SUITE, SHARD)


@pytest.fixture(scope="session")
def results():
    with tempfile.TemporaryDirectory(prefix="vpe-cells-") as tmp:
        res = cells.run_cells(CELLS, Path(tmp), cells.settings_for(SUITE, PARALLEL), PARALLEL,
                              dims="cpu" if SUITE == "cpu" else "gpu")
    jp, mp = cells.write_results(res, Path(os.environ.get("VPE_CELLS_OUT", "gpu-results")))
    print(f"\n{mp.read_text()}\nresults: {jp}")
    return {r.id: r for r in res}


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_cell(results, cell):
    r = results[cell.id]
    if r.status == "unsupported":  # the line's own transformers pin lacks the model family
        pytest.skip(r.error)
    if not cell.plugin:  # upstream's behaviour is a fact for the table: only that it was recorded
        assert r.status in ("upstream-works", "upstream-wrong", "upstream-crash"), r
        return
    assert r.status == "pass", f"{cell.id}: {r.status}: {r.error}"
