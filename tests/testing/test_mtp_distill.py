"""The MTP distillation of the kit's tiny models, without an engine: deterministic, and the
distilled head's own (torch) drafts follow the target better than the random head's."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vllm_platform_ext.testing import mtp_distill as md  # noqa: E402
from vllm_platform_ext.testing.tiny_models import config_dict, make_tiny_model  # noqa: E402

STEPS, NEW = 60, 48


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    path = make_tiny_model("qwen3_5_text", tmp_path_factory.mktemp("mtp") / "m", seed=0)
    sd = load_file(str(path / "model.safetensors"))
    mtp = {k: v.float() for k, v in sd.items() if k.startswith("mtp.")}
    target = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    train = md.collect(target, md.training_prompts(16, 0), NEW)
    held = md.collect(target, md.training_prompts(8, 999), NEW)
    return path, sd, mtp, train, held


def _head(sd, mtp):
    return md.MTPHead(config_dict("qwen3_5_text"), mtp, sd["model.embed_tokens.weight"], sd["lm_head.weight"])


def test_distill_deterministic_and_better(kit):
    path, sd, mtp, train, held = kit
    a, info = md.distill(str(path), mtp, seed=0, steps=STEPS, batch=8, data=train)
    b, _ = md.distill(str(path), mtp, seed=0, steps=STEPS, batch=8, data=train)
    assert set(a) == set(mtp)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert info["loss_last"] < info["loss_first"]
    bf16 = {k: v.to(torch.bfloat16).float() for k, v in a.items()}  # what the checkpoint holds
    rnd_train, dist_train = md.draft_accuracy(_head(sd, mtp), train), md.draft_accuracy(_head(sd, bf16), train)
    rnd, dist = md.draft_accuracy(_head(sd, mtp), held), md.draft_accuracy(_head(sd, bf16), held)
    print("train random", rnd_train, "distilled", dist_train, "held random", rnd, "distilled", dist)
    assert dist_train[0] >= rnd_train[0] + 0.15, (rnd_train, dist_train)
    assert dist[0] > rnd[0], (rnd, dist)
    assert sum(dist) > sum(rnd), (rnd, dist)


def test_engine_drafts_match_unrolled_when_drafts_are_right(kit):
    """Free-running drafts (the engine's recursion) equal the teacher-forced ones where the
    earlier drafts were the target's tokens: the training forward is the inference forward."""
    path, sd, mtp, train, held = kit
    tok, hid, start = held[0][0], held[0][1], held[0][2]
    head = _head(sd, mtp)
    # make the teacher-forced inputs the head's own drafts: feed its greedy chain as "tokens"
    t = start + 4
    d = md.engine_drafts(head, tok, hid, t, 3)
    forced_tok = tok.clone()
    forced_tok[t + 2:t + 4] = torch.tensor(d[:2])
    with torch.no_grad():
        out = head.unrolled(forced_tok[None, : t + 4], hid[None, : t + 4], 3)
    assert [int(o[0, t].argmax()) for o in out] == d


def test_make_tiny_model_mtp_option_checked(tmp_path):
    with pytest.raises(ValueError, match="mtp"):
        make_tiny_model("qwen3_5_text", tmp_path / "a", mtp="bogus")
    with pytest.raises(ValueError, match="distilled"):
        make_tiny_model("qwen3_5", tmp_path / "b", mtp="distilled")  # no transformers model class
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
