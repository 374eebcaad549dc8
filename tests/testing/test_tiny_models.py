"""The tiny-model kit and the audit's arithmetic (no engine)."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from vllm_platform_ext.testing.audit import BAD_NATS, AuditResult, Reference, passes
from vllm_platform_ext.testing.tiny_models import (
    CONDITIONAL, KINDS, CheckpointError, check_checkpoint, config_dict, hot_token_ids, make_tiny_model,
    qwen3_5_state_dict)


def _sha(path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module", params=KINDS)
def kit(request, tmp_path_factory):
    kind = request.param
    path = make_tiny_model(kind, tmp_path_factory.mktemp(kind) / "m", seed=0)
    return kind, path, Reference(str(path))


def test_checkpoint_is_deterministic(kit, tmp_path):
    kind, path, _ = kit
    again = make_tiny_model(kind, tmp_path / "again", seed=0)
    other = make_tiny_model(kind, tmp_path / "other", seed=1)
    assert _sha(again) == _sha(path)
    assert _sha(other) != _sha(path)


def test_config_and_mtp_tensors(kit):
    kind, path, _ = kit
    cfg = check_checkpoint(path)
    assert cfg["model_type"] == kind
    if kind in CONDITIONAL:  # as vLLM 0.23-0.26 serve Qwen3.5/3.6: the multimodal class, text config nested
        assert cfg["architectures"] == [CONDITIONAL[kind]] and "vision_config" in cfg
        cfg = cfg["text_config"]
        assert cfg["model_type"] == kind + "_text"
    key = "num_nextn_predict_layers" if kind == "qwen3_next" else "mtp_num_hidden_layers"
    assert cfg[key] == 1
    assert cfg["linear_key_head_dim"] in (64, 128) and cfg["linear_value_head_dim"] in (64, 128)
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        dtypes = {f.get_tensor(n).dtype for n in list(names)[:5]}
    assert dtypes == {torch.bfloat16}
    assert {"mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= names
    if kind in ("qwen3_next", "qwen3_5_moe"):  # the MTP layer's experts one per expert, as released
        assert "mtp.layers.0.mlp.experts.3.down_proj.weight" in names
    else:
        assert "mtp.layers.0.mlp.gate_proj.weight" in names
    if kind == "qwen3_5_moe":  # the decoder's routed experts fused, as Qwen3.6-35B-A3B's checkpoint
        assert {"model.language_model.layers.0.mlp.experts.gate_up_proj",
                "model.language_model.layers.0.mlp.shared_expert_gate.weight"} <= names


def test_missing_tensor_is_named(kit, tmp_path):
    kind, path, _ = kit
    from safetensors.torch import load_file, save_file

    sd = load_file(str(path / "model.safetensors"))
    del sd["mtp.fc.weight"]
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(sd, str(bad / "model.safetensors"))
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (bad / f).write_bytes((path / f).read_bytes())
    with pytest.raises(CheckpointError, match=r"mtp\.fc\.weight"):
        check_checkpoint(bad)


def test_transformers_loads_every_weight(kit):
    from transformers import AutoModelForCausalLM

    _, path, _ = kit
    _, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["mismatched_keys"]


def test_tokenizer_round_trip_offline(kit):
    from transformers import AutoTokenizer

    _, path, _ = kit
    tok = AutoTokenizer.from_pretrained(str(path))
    cfg = json.loads((path / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    assert len(tok) == cfg["vocab_size"]
    text = "hello, world\nabc"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.eos_token_id == cfg["eos_token_id"] and tok.bos_token_id == cfg["bos_token_id"]
    # every id of the model decodes to exactly one character (no gaps the engine could emit)
    assert all(len(tok.decode([i])) == 1 for i in range(4, cfg["vocab_size"]))


def test_outputs_depend_on_recurrent_state(kit):
    """Same last 4 tokens, different histories: the next tokens differ (not a bigram echo)."""
    _, _, ref = kit
    h = hot_token_ids()
    tail = [h[1], h[6], h[2], h[4]]
    firsts = {tuple(ref.greedy([h[j]] * 8 + [h[(j + 3) % 8]] * 4 + tail, 4, dtype="fp32"))
              for j in range(8)}
    assert len(firsts) >= 3, firsts


def test_outputs_stay_in_hot_alphabet(kit):
    _, _, ref = kit
    h = set(hot_token_ids())
    gen = ref.greedy(sorted(h) * 3, 32, dtype="fp32")
    assert sum(t in h for t in gen) >= 30


def test_audit_regret(kit):
    _, _, ref = kit
    h = hot_token_ids()
    prompt = [h[1], h[2], h[1], h[4], h[7], h[0], h[3]]
    gen = ref.greedy(prompt, 16, dtype="fp32")
    r = ref.audit([prompt], [gen])
    assert r.positions == 16 and r.max_regret < 1e-4 and r.bad_fraction == 0
    # the least likely token at position 5 has a large regret, and only that position is bad
    lp = ref.logprobs(prompt + gen)
    worst = int(lp[len(prompt) + 4].argmin())
    wrong = gen[:5] + [worst] + gen[6:]
    r2 = ref.audit([prompt], [wrong])
    assert r2.regrets[0][5] > BAD_NATS and r2.first_bad() == [5]
    assert r2.bad == 1 + sum(x > BAD_NATS for x in r2.regrets[0][6:])


@pytest.mark.parametrize("kind", sorted(CONDITIONAL))
def test_qwen3_5_tensors_are_transformers_own_names_and_shapes(kind):
    """The Qwen3.5/3.6 weights are written without a transformers model class (so a vLLM line whose
    pinned transformers lacks Qwen3.5 writes them too); their names and shapes are exactly those
    transformers' own model saves, with the released layout's prefix and fused experts."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = config_dict(kind)
    ours = qwen3_5_state_dict(cfg, 0, prefix="model.", fused_experts=False, mtp_layers=0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"}))
    import tempfile
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        theirs = {}
        for f in sorted(__import__("pathlib").Path(tmp).glob("*.safetensors")):
            theirs.update(load_file(str(f)))
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    for name, t in theirs.items():  # the same init family: zero (1 + w) norms, unit gated norm and dt_bias
        if t.dim() == 1 and not name.endswith("A_log"):
            assert torch.equal(ours[name], t), name


def test_qwen3_5_kit_in_the_old_vllm_line_uses_vllms_config_classes(tmp_path):
    """On vLLM 0.23 (its pinned transformers 4.57 has no Qwen3.5) the kit writes the Qwen3.6-style
    MoE checkpoint with vLLM's own config classes: the same tensors as here, a config vLLM 0.23
    reads as Qwen3_5MoeConfig, and transformers here loads every weight of it; from that venv the
    reference runs in this interpreter (VPE_REFERENCE_PYTHON on the GPU machine) and audits it."""
    import os
    import subprocess
    import sys

    from conftest import REPO, old_vllm_python

    py = old_vllm_python()
    if not os.path.exists(py):
        pytest.fail(f"no old-vLLM venv at {py}: run ci/old_vllm_venv.sh (ci/setup.sh test does)")
    code = ("import json, sys; from vllm_platform_ext.testing.tiny_models import make_tiny_model, _config_class\n"
            "import transformers; from vllm.transformers_utils.config import get_config\n"
            "p = make_tiny_model('qwen3_5_moe', sys.argv[1])\n"
            "c = get_config(str(p), trust_remote_code=False)\n"
            "from vllm_platform_ext.testing.audit import reference_audits\n"
            "floor, a = reference_audits(str(p), [[5, 6, 7]], {'x': [[9, 9, 9, 9]]}, 4, python=sys.argv[2])\n"
            "print(json.dumps([transformers.__version__, _config_class('qwen3_5_moe').__module__, type(c).__name__,"
            " c.text_config.num_experts, c.text_config.mtp_num_hidden_layers, floor.positions, a['x'].positions]))")
    proc = subprocess.run([py, "-c", code, str(tmp_path / "old"), sys.executable], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-3000:]
    tf, module, cls, experts, mtp, floor_n, audit_n = json.loads(proc.stdout.strip().splitlines()[-1])
    assert tf.startswith("4.") and module == "vllm.transformers_utils.configs.qwen3_5_moe"
    assert (cls, experts, mtp) == ("Qwen3_5MoeConfig", 4, 1)
    assert (floor_n, audit_n) == (4, 4)  # audited by this interpreter's transformers, as on the GPU machine
    here = make_tiny_model("qwen3_5_moe", tmp_path / "here")
    assert _sha(tmp_path / "old") == _sha(here)
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(str(tmp_path / "old"), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]


def test_pass_rule():
    assert passes(0.03, 0.01) and not passes(0.031, 0.01)
    assert AuditResult([[0.0, 0.6], [0.1]]).bad_fraction == pytest.approx(1 / 3)


def test_an_audit_of_no_position_never_passes():
    """An engine that returned no token was not shown right: no positions is NaN, never a pass."""
    import math

    empty = AuditResult([[], []])
    assert empty.positions == 0 and math.isnan(empty.bad_fraction)
    assert not passes(empty.bad_fraction, 0.0) and not passes(empty.bad_fraction, 0.5, 0.5)
