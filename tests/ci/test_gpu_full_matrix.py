"""The committed `full` matrices (results/gpu/<date>-<line>-full-matrix/*-<line>-full-shardNN.json, as the GPU machine wrote them) are
what docs/results.md states: each line's shards together are the suite's 181 cells, each once, each shard the cells
`cells.select` gives it; every plugin cell is recorded as passing; every plugin-off cell is an upstream result that
agrees with the harness's known outcomes (`cells.unlike_known_upstream`), and the counts docs/results.md gives.

What backs a shard's numbers is its token sidecar (NAME.tokens.json beside NAME.json, testing/cell_tokens.py): a shard
with one must be consistent with it here, and tests/testing/test_cell_tokens_replay.py replays a sample of its cells
against the float32 reference. The 0.23.0 and 0.26.0 shards committed so far were written before the sidecar: they
carry no generated tokens, so their bad/floor figures are the GPU run's word and nothing here recomputes them
(re-applying audit.passes() to the bad/floor the same run wrote would only check the file against itself)."""
import collections
import json
import re
from pathlib import Path

import pytest

from conftest import REPO
from vllm_platform_ext.testing import cell_tokens, cells

RESULTS = Path(REPO) / "results/gpu"
# line -> (plugin cells passing, upstream alone: crash, works, wrong), as docs/results.md and docs/gpu_harness.md say
STATED = {"0.23.0": (93, 32, 35, 21), "0.26.0": (93, 68, 15, 5)}


def _shards(line):
    out = {}
    for f in sorted(RESULTS.rglob(f"*-{line}-full-shard*.json"), key=lambda p: p.name):
        if f.name.endswith(cell_tokens.SUFFIX):
            continue  # a shard's token sidecar, not a shard
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
    """The recorded statuses and the counts docs/results.md gives. These are the run's labels, compared with
    the docs: whether the tokens earned them is test_full_matrix_tokens's (and the replay's) question."""
    res = [r for rs in _shards(line).values() for r in rs]
    on = [r for r in res if r.cell["plugin"]]
    off = [r for r in res if not r.cell["plugin"]]
    assert [r.id for r in on if r.status != "pass"] == []
    for r in on:
        assert r.cell["mode"] == "base" or r.accepted > 0, f"{r.id}: no draft accepted"
    unlike = [cells.unlike_known_upstream(cells.Cell(**r.cell), r) for r in off]
    assert [why for why in unlike if why] == []
    count = collections.Counter(r.status for r in off)
    assert set(count) <= {"upstream-crash", "upstream-works", "upstream-wrong"}
    assert (len(on), count["upstream-crash"], count["upstream-works"], count["upstream-wrong"]) == STATED[line]


# the lines whose shards were all written before the token sidecar existed: they carry no tokens
TOKENLESS = {"0.23.0", "0.26.0"}


@pytest.mark.parametrize("line", sorted(STATED))
def test_full_matrix_tokens(line):
    """A shard with a token sidecar: every audited cell's tokens are there, as many as its positions (the
    replay of a sample is tests/testing/test_cell_tokens_replay.py's, which globs every sidecar). A line
    without sidecars is one of TOKENLESS, said so, not checked: a shard of a new line must bring its tokens."""
    files = sorted(f for f in RESULTS.rglob(f"*-{line}-full-shard*.json") if not f.name.endswith(cell_tokens.SUFFIX))
    with_tokens = [f for f in files if cell_tokens.sidecar_path(f).is_file()]
    if line in TOKENLESS:
        assert with_tokens == [], f"{line}: shards with tokens now ({[f.name for f in with_tokens]}): drop it from TOKENLESS"
        pytest.skip(f"{line}: its {len(files)} shards carry no generated tokens (written before the token sidecar): "
                    "their bad/floor are the GPU run's word, not checked")
    assert with_tokens == files, f"{line}: shards without tokens: {[f.name for f in files if f not in with_tokens]}"
    for f in files:
        side, res = cell_tokens.load(cell_tokens.sidecar_path(f)), cell_tokens.load_results(f)
        assert cell_tokens.consistency(side, res) == [], f.name
