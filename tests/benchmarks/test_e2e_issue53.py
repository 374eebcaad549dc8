"""Issue 53 goal 2 in the end-to-end benchmark (benchmarks/e2e_*.py): the line's default scheduling is
what a job runs unless told (async_scheduling left unset), the Qwen3.6-27B dense shape as vLLM reads
it back, C0 (TurboQuant plain decode with the plugin), and issue 53's goals judged on one run's rows
against ratios worked out by hand. The engine runs themselves: tests/benchmarks/test_e2e_report.py
(CPU) and the GPU machine."""
from __future__ import annotations

import argparse
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import e2e_paired as P  # noqa: E402
import e2e_spec_decode as E  # noqa: E402


def _job(**kw):
    setup = E.Setup("C", "mtp", 3, "turboquant_k8v4")
    from dataclasses import asdict

    return {"setup": asdict(setup), "pairs": [[8, 32768]], "max_tokens": 64, "max_num_batched_tokens": 8192,
            "gpu_memory_utilization": 0.85, "dummy": True, **kw}


def test_a_job_runs_the_lines_default_scheduling_unless_told():
    """No ``scheduling`` in the job (an old driver, e2e_paired before issue 53): async scheduling is
    left for vLLM to resolve, not turned off; ``sync`` still turns it off."""
    _, _, extra = E.engine_setup(_job())
    assert "async_scheduling" not in extra and extra["load_format"] == "dummy"
    _, _, extra = E.engine_setup(_job(scheduling="sync"))
    assert extra["async_scheduling"] is False
    with pytest.raises(ValueError, match="default, sync"):
        E.engine_setup(_job(scheduling="fast"))
    a = argparse.Namespace(tp=1, max_tokens=8, max_num_batched_tokens=8192, gpu_memory_utilization=0.5,
                           kv_cache_memory_bytes=0, model="qwen36_a3b")
    assert E.engine_job("m", E.Setup("B", "mtp", 3), [(1, 64)], a)["scheduling"] == "default"


def test_paired_engines_take_the_scheduling_asked(monkeypatch, tmp_path):
    seen = {}

    class Stop(Exception):
        pass

    def fake_run_pair(model, pair, batch, context, a, out):
        seen["job"] = E.engine_job(model, pair[0], [(batch, context)], a)
        raise Stop

    monkeypatch.setattr(P, "run_pair", fake_run_pair)
    monkeypatch.setattr(E, "write_model", lambda kind, layers, path: path)
    for argv, want in (([], "default"), (["--scheduling", "sync"], "sync")):
        with pytest.raises(Stop):
            P.main(["--model", "qwen36_27b", "--configs", "C,B", "--out", str(tmp_path), *argv])
        assert seen["job"]["scheduling"] == want


def test_qwen36_27b_shape_as_vllm_reads_it(tmp_path):
    """The installed vLLM reads the benchmark's 27B config back with Qwen3.6-27B's public numbers
    (hidden 5120, MLP 17408, 24 q / 4 kv heads of 256, GDN 16 key / 48 value heads of 128, vocab 248320)."""
    from vllm.transformers_utils.config import get_config

    (tmp_path / "config.json").write_text(json.dumps(E.qwen36_27b_config(40)))
    cfg = get_config(str(tmp_path), trust_remote_code=False)
    t = cfg.text_config
    assert type(cfg).__name__ == "Qwen3_5Config" and cfg.architectures == ["Qwen3_5ForConditionalGeneration"]
    assert (t.hidden_size, t.intermediate_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == \
        (5120, 17408, 24, 4, 256)
    assert (t.linear_num_key_heads, t.linear_num_value_heads, t.linear_key_head_dim, t.linear_value_head_dim,
            t.linear_conv_kernel_dim, t.vocab_size) == (16, 48, 128, 128, 4, 248320)
    assert t.num_hidden_layers == 40 and t.layer_types.count("full_attention") == 10
    assert t.mtp_num_hidden_layers == 1 and t.max_position_embeddings >= 56320 + 1024
    with pytest.raises(SystemExit, match="multiple of 4"):
        E.qwen36_27b_config(42)


def test_c0_is_turboquant_plain_decode_with_the_plugin():
    ((c0,),) = E.setups(["C0"], "full_and_piecewise")
    assert (c0.mode, c0.k, c0.kv, c0.plugin) == ("base", 0, "turboquant_k8v4", True)


def _r(config, batch, context, verify_ms=None, plain_ms=None, error=None):
    row = {"config": config, "batch": batch, "context": context, "verify_ms": verify_ms, "plain_ms": plain_ms,
           "async": True}
    return row | ({"error": error} if error else {})


def _g(table, goal, batch, context):
    (hit,) = [g for g in table if g["goal"].startswith(goal) and (g["batch"], g["context"]) == (batch, context)]
    return hit


def test_issue_53_goals_by_hand():
    rows = [_r("C", 8, 32768, 8.4), _r("B", 8, 32768, 10.0),      # 0.84 <= 0.85
            _r("C", 32, 32768, 7.6), _r("B", 32, 32768, 10.0),    # 0.76 > 0.75
            _r("C", 1, 4096, 5.0), _r("B", 1, 4096, error="boom"),  # B failed: not measured
            _r("C0", 1, 56320, plain_ms=9.9), _r("A", 1, 56320, plain_ms=10.0),
            _r("C0", 8, 56320, plain_ms=13.1), _r("A", 8, 56320, plain_ms=10.0)]
    t = E.goals53(rows)
    g = _g(t, "C / B", 8, 32768)
    assert g["measured"] == pytest.approx(0.84) and g["met"] is True and g["target"] == "<= 0.85"
    g = _g(t, "C / B", 32, 32768)
    assert g["measured"] == pytest.approx(0.76) and g["met"] is False
    assert _g(t, "C / B", 1, 4096)["met"] is None
    assert _g(t, "C0 / A", 1, 56320)["measured"] == pytest.approx(0.99) and _g(t, "C0 / A", 1, 56320)["met"]
    assert _g(t, "C0 / A", 8, 56320)["met"] is False
    assert len(t) == 5  # no 55K row below 55K contexts
    assert E.resolved_async(rows) == "on" and E.resolved_async([]) == "?"
    assert E.resolved_async([_r("A", 1, 1) | {"async": False}, _r("B", 1, 1)]) == "off, on"
