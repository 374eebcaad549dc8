"""The committed `full` matrices (results/gpu/<date>-<line>-full-matrix/*-<line>-full-shardNN.json, as the GPU machine wrote them) are
what docs/results.md states: each line's shards together are the suite's 181 cells, each once, each shard the cells
`cells.select` gives it; every plugin cell passed the float32 audit; every plugin-off cell is an upstream result
that agrees with the harness's known outcomes (`cells.unlike_known_upstream`), and the counts docs/results.md gives."""
import collections
import json
import re
from pathlib import Path

import pytest

from conftest import REPO
from vllm_platform_ext.testing import cells
from vllm_platform_ext.testing.audit import MARGIN, passes

RESULTS = Path(REPO) / "results/gpu"
# line -> (plugin cells passing, upstream alone: crash, works, wrong), as docs/results.md and docs/gpu_harness.md say
STATED = {"0.23.0": (93, 32, 35, 21), "0.26.0": (93, 68, 15, 5)}


def _shards(line):
    out = {}
    for f in sorted(RESULTS.rglob(f"*-{line}-full-shard*.json"), key=lambda p: p.name):
        i = int(re.search(r"shard(\d+)\.json$", f.name).group(1))
        assert i not in out, f"shard {i} of {line} twice: {f.name}"
        out[i] = [cells.CellResult(**r) for r in json.loads(f.read_text())]
    return out


@pytest.mark.parametrize("line", sorted(STATED))
def test_full_matrix_is_the_whole_suite_once(line):
    shards = _shards(line)
    assert sorted(shards) == list(range(1, 13)), f"{line}: shards {sorted(shards)} of 12"
    for i, res in shards.items():
        assert [r.id for r in res] == [c.id for c in cells.select("full", f"{i}/12")], f"{line} shard {i}"
        assert {r.versions["vllm"] for r in res} == {line}
    ids = [r.id for res in shards.values() for r in res]
    assert len(ids) == len(set(ids)) == len(cells.suite_cells("full")) == 181


@pytest.mark.parametrize("line", sorted(STATED))
def test_full_matrix_verdicts(line):
    res = [r for rs in _shards(line).values() for r in rs]
    on = [r for r in res if r.cell["plugin"]]
    off = [r for r in res if not r.cell["plugin"]]
    assert [r.id for r in on if r.status != "pass"] == []
    for r in on:  # a pass is the audit's verdict, judged again here from the numbers: not a label
        assert r.positions > 0 and passes(r.bad, r.floor, MARGIN), r.id
        assert r.cell["mode"] == "base" or r.accepted > 0, f"{r.id}: no draft accepted"
    unlike = [cells.unlike_known_upstream(cells.Cell(**r.cell), r) for r in off]
    assert [why for why in unlike if why] == []
    count = collections.Counter(r.status for r in off)
    assert set(count) <= {"upstream-crash", "upstream-works", "upstream-wrong"}
    assert (len(on), count["upstream-crash"], count["upstream-works"], count["upstream-wrong"]) == STATED[line]
    for r in off:  # "wrong" and "works" are the audit's too; a crash has no tokens to audit
        if r.status != "upstream-crash":
            assert passes(r.bad, r.floor, MARGIN) == (r.status == "upstream-works"), r.id
