"""The GPU cells' verdict (``testing/cell_judge.py``) with the engine and the reference stubbed: the
suites' positions, both thresholds recorded so a reader can recompute the verdict, the split rule
where it applies (and not where the float32 margin is not the engine's), and an engine that
returned fewer tokens than the floor."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from vllm_platform_ext.testing import cell_judge, cell_suites, cells
from vllm_platform_ext.testing.audit import AuditResult
from vllm_platform_ext.testing.bounds import Criterion, limit
from vllm_platform_ext.testing.engine import EngineRun
from vllm_platform_ext.testing.prompts import LENGTHS, default_prompts

P, N = len(LENGTHS), cell_suites.MAX_TOKENS


def _regrets(*spots, base=0.0):
    """P prompts of N positions at ``base``, with (prompt, position, regret) ``spots``."""
    r = [[base] * N for _ in range(P)]
    for p, i, x in spots:
        r[p][i] = x
    return r


def _run_cells(monkeypatch, tmp_path, todo, regrets, tokens=None, floor=None):
    def engine(model, prompts, configs, settings, env, timeout, log_path=None):
        (cfg,) = configs
        cell = next(c for c in todo if c.engine_config() == cfg and (not c.plugin) == ("VLLM_PLUGINS" in env))
        return [EngineRun(mode=cfg.mode, k=cfg.k, tokens=(tokens or {}).get(cell.id, [[5] * N] * P),
                          num_draft_tokens=6, num_accepted_tokens=2)]

    monkeypatch.setenv("VPE_KIT", "random")  # stub engines: no per-position acceptance counts
    monkeypatch.setattr(cells, "make_tiny_model", lambda kind, out, dims, target="random": out)
    monkeypatch.setattr(cells, "run_in_subprocess", engine)
    monkeypatch.setattr(cell_judge, "reference_audits", lambda path, prompts, gen, mt, python=None, logprobs=None: (
        AuditResult(floor or _regrets()), {k: AuditResult(regrets.get(k, _regrets())) for k in gen}))
    return {r.id: r for r in cells.run_cells(todo, tmp_path, cells.settings_for("core", 1), parallel=1)}


def test_gpu_suites_audit_896_positions_inside_the_context():
    s = cells.settings_for("full", 16)
    assert s.max_tokens == N == 128 and P * s.max_tokens == 896
    assert max(LENGTHS) + s.max_tokens + 3 <= s.max_model_len  # the longest prompt, its tokens, k = 3 drafts
    assert len(default_prompts()) == P


def test_both_thresholds_are_recorded_and_recompute_the_verdict(monkeypatch, tmp_path):
    """A plain cell with 2 positions past 0.5 nats and 30 near-ties past 0.1 against a floor of 10 such:
    its record holds each criterion's parts; the verdict recomputed from them with bounds.limit is the
    cell's (0.1 fails: 32 > limit(10)), and a criterion rebuilt from the record is the judge's."""
    base = cells.Cell("qwen3_next", "base", 0, "auto")
    spots = [(0, i, 0.2) for i in range(30)] + [(1, 0, 0.9), (1, 1, 0.9)]
    floor = _regrets(*[(3, i, 0.3) for i in range(10)])
    (r,) = _run_cells(monkeypatch, tmp_path, [base], {base.id: _regrets(*spots)}, floor=floor).values()
    assert r.status == "fail" and (r.bad_count, r.floor_bf16, r.floor_plain, r.positions) == (2, 0, None, 896)
    assert r.limit == limit(0, 896) and r.bad == 2 / 896
    strict = Criterion(**r.criteria[1])
    assert (strict.nats, strict.count, strict.floor_bf16) == (0.1, 32, 10) and not strict.ok
    assert all((c["count"] <= limit(max(c["floor_bf16"], c["floor_plain"] or 0), c["positions"], c["alpha"])) == ok
               for c, ok in zip(r.criteria, (True, False)))
    assert r.error == f"32 of 896 positions > 0.1 nats, limit {limit(10, 896)} (bf16 floor 10)"
    assert cells.CellResult(**asdict(r)) == r  # the JSON record reads back whole


def test_split_rule_fails_a_bf16_speculative_cell_and_spares_turboquant(monkeypatch, tmp_path):
    """One wrong token (regret 1.5 where plain decoding's has 0) at a prompt's first difference from
    plain decoding: 1 bad position is under the count's limit, and the split rule fails the bf16-KV cell;
    the same on TurboQuant k8v4 passes (the reference knows no quantization), and so does a near-tie split."""
    todo = [cells.Cell("qwen3_next", m, k, kv) for kv in ("auto", "turboquant_k8v4") for m, k in (("base", 0), ("mtp", 3))]
    todo.append(cells.Cell("qwen3_next", "ngram", 3, "auto"))
    plain = [[5] * N for _ in range(P)]
    split = [list(t) for t in plain]
    split[4][17] = 6
    toks = {c.id: split for c in todo if c.mode != "base"}
    regrets = {c.id: _regrets((4, 17, 1.5)) for c in todo if c.mode == "mtp"}
    regrets["qwen3_next-ngram3-auto-full_and_piecewise-on"] = _regrets((4, 17, 0.2))
    got = _run_cells(monkeypatch, tmp_path, todo, regrets, toks)
    bf16 = got["qwen3_next-mtp3-auto-full_and_piecewise-on"]
    assert bf16.status == "fail" and bf16.bad_count == 1 <= bf16.limit
    assert bf16.error == ("tokens part from plain decoding with the speculative token worse by > 0.5 nats in float32 "
                          "at 1 prompt(s): prompt 5 at 17 (1.50 vs 0.00)")
    assert bf16.identity[4] == {"pos": 17, "gap": 1.5, "spec_regret": 1.5, "plain_regret": 0.0}
    assert got["qwen3_next-mtp3-k8v4-full_and_piecewise-on"].status == "pass"
    assert got["qwen3_next-ngram3-auto-full_and_piecewise-on"].status == "pass"


@pytest.mark.parametrize("model,kv,why", [
    ("qwen3_5_moe", "auto", "expert routing flips"),
    ("qwen3_next", "turboquant_3bit_nc", "knows no quantization"),
    ("qwen3_next", "fp8", "knows no quantization"),
    ("my_model", "auto", "not a kit model"),
])
def test_split_rule_skips_where_the_float32_margin_is_not_the_engines(model, kv, why):
    from vllm_platform_ext.testing.identity import split_problem, split_rule_skip

    wrong = [{"pos": 3, "gap": 2.0, "spec_regret": 2.0, "plain_regret": 0.0}]
    assert why in split_rule_skip(model, kv) and split_problem(wrong, model, kv) is None
    assert split_rule_skip("qwen3_5", "auto") is None and split_problem(wrong, "qwen3_5", "auto")
    plain_worse = [{"pos": 3, "gap": 2.0, "spec_regret": 0.0, "plain_regret": 2.0}, None, {"pos": 1}]
    assert split_problem(plain_worse, "qwen3_5", "auto") is None  # plain decoding the worse: not the verify path's


def test_an_engine_that_returned_fewer_tokens_fails_naming_it(monkeypatch, tmp_path):
    base = cells.Cell("qwen3_next", "base", 0, "auto")
    short = [[0.0] * (N - 1)] + [[0.0] * N] * (P - 1)
    (r,) = _run_cells(monkeypatch, tmp_path, [base], {base.id: short}).values()
    assert r.status == "fail" and r.criteria == [] and r.limit is None
    assert "returned 895 positions where the bf16 floor has 896" in r.error


def test_a_batch_floor_family_without_its_spread_run_is_unchecked(monkeypatch):
    """A replay of a run cut short (the spread run had not finished): the MoE family's plugin cell
    fails as unchecked, never passes without the check; its plugin-off cell and other families are
    judged as usual."""
    todo = [cells.Cell("qwen3_5_moe", "mtp", 3), cells.Cell("qwen3_5_moe", "mtp", 3, plugin=False),
            cells.Cell("qwen3_next", "mtp", 3)]
    runs = {c: EngineRun(mode="mtp", k=3, tokens=[[5] * N] * P, num_draft_tokens=6, num_accepted_tokens=2) for c in todo}
    monkeypatch.setattr(cell_judge, "reference_audits", lambda path, prompts, gen, mt, python=None, logprobs=None: (
        AuditResult(_regrets()), {k: AuditResult(_regrets()) for k in gen}))
    got = {r.id: r for r in cell_judge.audit_cells(todo, {"qwen3_5_moe": "/m", "qwen3_next": "/n"}, {}, runs, {},
                                                    default_prompts(), N, log=lambda *_: None)}
    on = got["qwen3_5_moe-mtp3-auto-full_and_piecewise-on"]
    assert on.status == "fail" and "the spread run) did not run" in on.error
    assert got["qwen3_5_moe-mtp3-auto-full_and_piecewise-off"].status == "upstream-works"
    assert got["qwen3_next-mtp3-auto-full_and_piecewise-on"].status == "pass"


def test_planted_bad_drafts_are_judged_on_one_accepted_draft():
    """The bad-draft suite's plant rejects a third of the draft slots, so the recall kit's MTP k=3 rule cannot
    hold there (GPU, 0.26.0: accepted per position [305, 131, 0], 0/896 bad); its cells need one accepted
    draft, every other recall cell the whole rule."""
    cell = cell_suites.Cell("qwen3_5", "mtp", 3, "turboquant_k8v4")
    run = EngineRun(mode="mtp", k=3, num_drafts=459, num_draft_tokens=1377, num_accepted_tokens=436,
                    accepted_per_pos=[305, 131, 0])
    planted = cells.judging_kit("recall", {"PYTHONPATH": "x", "VPE_TEST_PLANT": "bad-draft-ids"})
    assert planted != "recall" and cells.judging_kit("recall", None) == "recall"
    assert cells.judging_kit("recall", {"VPE_TEST_PLANT": "other"}) == "recall"
    assert cell_judge.accept_problem(cell, run, planted) is None
    assert "position 3" in cell_judge.accept_problem(cell, run, "recall")
