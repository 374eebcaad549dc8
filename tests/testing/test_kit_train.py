"""The recall kit (testing/kit_train.py): committed weights that are what the manifest says, a target
that recalls the cycle its context shows (a random one does not), and an MTP layer that follows it."""
from __future__ import annotations

import json
import random

import pytest

from vllm_platform_ext.testing import kit_train, recall_weights
from vllm_platform_ext.testing.tiny_models import CPU_KINDS, make_tiny_model

RECALL_KINDS = [k for k in CPU_KINDS if f"{k}-cpu" in recall_weights.manifest()]


def test_every_cpu_kind_has_committed_recall_weights():
    assert RECALL_KINDS == list(CPU_KINDS), f"recall weights committed for {RECALL_KINDS} of {CPU_KINDS}"


@pytest.mark.parametrize("kind", RECALL_KINDS)
def test_recall_checkpoint_is_the_committed_weights(kind, tmp_path):
    from safetensors.torch import load_file

    path = make_tiny_model(kind, tmp_path / kind, target="recall")
    written = load_file(str(path / "model.safetensors"))
    assert recall_weights.tensors_digest(written) == recall_weights.manifest()[f"{kind}-cpu"]["sha256"]
    random_names = set(load_file(str(make_tiny_model(kind, tmp_path / "r", target="random") / "model.safetensors")))
    assert set(written) == random_names  # the same tensors vLLM loads, MTP layer included


@pytest.mark.parametrize("kind", RECALL_KINDS)
def test_recall_target_recalls_and_a_random_one_does_not(kind, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    acc = {}
    for target in ("recall", "random"):
        m = AutoModelForCausalLM.from_pretrained(str(make_tiny_model(kind, tmp_path / target, target=target)),
                                                 dtype=torch.float32).eval()
        acc[target] = kit_train.recall_accuracy(m, seed=7, n=16, length=96)
    assert acc["recall"] >= 0.95, acc
    assert acc["random"] <= 0.5, acc  # the cycle is in the context, not in the weights


def test_recall_sequence_marks_only_determined_tokens():
    r = random.Random(3)
    for _ in range(50):
        ids, mask = kit_train.recall_sequence(r, 40)
        assert len(ids) == len(mask) == 40
        for i, m in enumerate(mask):
            if m:  # the token one period back is the same letter, and that period was shown whole
                assert any(ids[i] == ids[i - p] and len(set(ids[i - p:i])) == p for p in range(3, 9) if i >= p)
        assert sum(mask) >= 40 - 8 - 2 * 8  # noise and the first period only are not determined


@pytest.mark.parametrize("kind", RECALL_KINDS)
def test_distilled_mtp_beats_the_random_one(kind):
    fig = recall_weights.manifest()[f"{kind}-cpu"]["mtp"]
    chain, rand = fig["held_chain_accuracy"], fig["held_chain_accuracy_random"]
    # teacher-forced chain accuracy of drafts 1..3 on held-out continuations (kit_train.build)
    assert 1 + sum(chain) >= 2.5 and all(a > b for a, b in zip(chain, rand)), fig


def test_recall_refuses_other_recipes_and_tampered_weights(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="one committed checkpoint per kind"):
        make_tiny_model(CPU_KINDS[0], tmp_path / "a", target="recall", seed=1)
    with pytest.raises(ValueError, match="target 'trained' not in"):
        make_tiny_model(CPU_KINDS[0], tmp_path / "b", target="trained")
    with pytest.raises(ValueError, match="no committed recall weights for qwen3_5_text-huge"):
        recall_weights.load_weights("qwen3_5_text", "huge")
    entry = dict(recall_weights.manifest()[f"{CPU_KINDS[0]}-cpu"], sha256="0" * 64)
    fake = tmp_path / "manifest.json"
    fake.write_text(json.dumps({f"{CPU_KINDS[0]}-cpu": entry}))
    monkeypatch.setattr(recall_weights, "MANIFEST", fake)
    with pytest.raises(ValueError, match="differs from the manifest"):
        recall_weights.load_weights(CPU_KINDS[0], "cpu")
