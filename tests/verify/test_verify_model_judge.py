"""``verify --model``'s verdict rules (verify/model_judge.py) on runs built by hand, and its bad input: no engine.

Each rule is shown both ways: a near-tie split passes and a worse token fails; plain decoding's own spread across
batch compositions raises the floor a split is held to; an acceptance collapse and zero accepted drafts fail; the
engine-drift check fails a speculative run whose log-probabilities leave plain decoding's, unless plain decoding
leaves itself as often across batches.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from vllm_platform_ext.verify import model_check, model_judge, model_ref

SPEC = {"method": "mtp", "num_speculative_tokens": 3}


def _top(tokens, worse_at=None, gap=0.0, shift=0.0):
    """Top log-probabilities per position: the emitted token first (-0.1), 7 (or the other token) ``gap`` below."""
    out = []
    for j, t in enumerate(tokens):
        other = 7 if t != 7 else 8
        lp = -0.1 + (shift if j >= 1 else 0.0)
        out.append([[t, lp], [other, lp - (gap if j == worse_at else 3.0)]])
    return out


def _run(tokens, **kw):
    base = {"tokens": tokens, "logprobs": [_top(t) for t in tokens], "error": "",
            "num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 25, "accepted_per_pos": [9, 8, 8],
            "tokens_per_s": 10.0, "compositions": {}, "composition_logprobs": {}, "patches": {}}
    base.update(kw)
    return base


PLAIN = [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_identical_runs_pass():
    v = model_judge.judge(_run(PLAIN), _run(PLAIN), SPEC)
    assert v["status"] == "PASS", v["reasons"]
    assert [p["split"] for p in v["prompts"]] == [None, None]
    assert v["acceptance"]["mean_length"] == 3.5 and v["acceptance"]["per_position"] == [0.9, 0.8, 0.8]


def test_split_judged_by_the_plain_engines_own_logprobs():
    spec_toks = [[1, 2, 7, 7], [5, 6, 7, 8]]  # parts at position 2 on prompt 1: token 7 instead of 3
    near = _run(PLAIN, logprobs=[_top(PLAIN[0], worse_at=2, gap=0.05), _top(PLAIN[1])])
    v = model_judge.judge(near, _run(spec_toks), SPEC)
    assert v["status"] == "PASS", v["reasons"]
    assert v["prompts"][0]["split"] == {"pos": 2, "worse": 0.05, "by": "plain engine"}
    far = _run(PLAIN, logprobs=[_top(PLAIN[0], worse_at=2, gap=1.5), _top(PLAIN[1])])
    v = model_judge.judge(far, _run(spec_toks), SPEC)
    assert v["status"] == "FAIL" and any("prompt 1 at 2" in r for r in v["reasons"]), v["reasons"]


def test_plain_spread_raises_the_split_floor():
    """Plain decoding that parts from itself in another batch by 2 nats: a 1.5-nat split is its own floor (WARN)."""
    spec_toks = [[1, 2, 7, 7], [5, 6, 7, 8]]
    other = [[1, 2, 3, 4], [5, 6, 7, 7]]  # plain alone parts at 3 on prompt 2 (token 7 for 8)
    plain = _run(PLAIN, logprobs=[_top(PLAIN[0], worse_at=2, gap=1.5), _top(PLAIN[1], worse_at=3, gap=2.0)],
                 compositions={"alone": other}, composition_logprobs={"alone": [_top(t) for t in other]})
    v = model_judge.judge(plain, _run(spec_toks), SPEC)
    assert v["status"] == "WARN", v["reasons"]
    assert v["prompts"][1]["plain_spread"]["composition"] == "alone"
    assert any("not batch-invariant" in r for r in v["reasons"]), v["reasons"]


@pytest.mark.parametrize("per_pos,accepted,status,words", [
    ([1, 0, 0], 1, "FAIL", "acceptance collapse"), ([5, 2, 1], 8, "WARN", "low MTP acceptance"),
    ([0, 0, 0], 0, "FAIL", "no draft accepted")])
def test_acceptance_rules(per_pos, accepted, status, words):
    v = model_judge.judge(_run(PLAIN), _run(PLAIN, accepted_per_pos=per_pos, num_accepted_tokens=accepted), SPEC)
    assert v["status"] == status and any(words in r for r in v["reasons"]), v["reasons"]


def test_no_drafts_fails_and_ngram_has_no_rate_floor():
    v = model_judge.judge(_run(PLAIN), _run(PLAIN, num_drafts=0, num_draft_tokens=0), SPEC)
    assert v["status"] == "FAIL" and "not exercised" in " ".join(v["reasons"])
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    v = model_judge.judge(_run(PLAIN), _run(PLAIN, accepted_per_pos=[1, 0, 0], num_accepted_tokens=1), ngram)
    assert v["status"] == "PASS", v["reasons"]


def test_engine_drift_fails_against_its_batch_floor():
    long = [[t % 50 + 10 for t in range(p, p + 40)] for p in range(3)]
    drifted = _run(long, logprobs=[_top(t, shift=-0.5) for t in long])  # every position 0.5 nats off, same tokens
    v = model_judge.judge(_run(long), drifted, SPEC)
    assert v["status"] == "FAIL" and any("log-probabilities leave" in r for r in v["reasons"]), v["reasons"]
    assert v["engine_drift"]["spec"]["count"] == 3 * 39
    # quantized activations (W8A8, FP8): shown, not judged
    v = model_judge.judge(_run(long), drifted, SPEC, act_quant=True)
    assert v["status"] == "PASS" and any("shown, not judged" in r for r in v["reasons"]), v["reasons"]
    # plain decoding drifting as much from itself in another batch: the floor, no failure
    plain = _run(long, compositions={"pairs": long},
                 composition_logprobs={"pairs": [_top(t, shift=-0.5) for t in long]})
    v = model_judge.judge(plain, drifted, SPEC)
    assert v["status"] == "PASS", v["reasons"]


def test_speculation_slower_than_plain_warns():
    v = model_judge.judge(_run(PLAIN, tokens_per_s=20.0), _run(PLAIN, tokens_per_s=10.0), SPEC)
    assert v["status"] == "WARN" and "slower than plain" in " ".join(v["reasons"])


# ---- bad input (no engine: the checkpoint is read before vLLM is imported) ----

def _main(argv, capsys):
    rc = model_check.main(argv)
    return rc, capsys.readouterr().err


def test_missing_path_and_missing_config(tmp_path, capsys):
    rc, err = _main(["--model", str(tmp_path / "nope")], capsys)
    assert rc == 2 and "no such file or directory" in err, err
    rc, err = _main(["--model", str(tmp_path)], capsys)
    assert rc == 2 and "no config.json" in err, err
    (tmp_path / "config.json").write_text("{}")
    rc, err = _main(["--model", str(tmp_path)], capsys)
    assert rc == 2 and "no *.safetensors" in err, err


def test_spec_checks_name_the_problem():
    cfg = {"model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1}
    with pytest.raises(model_ref.ModelCheckError, match="has no MTP weights"):
        model_ref.check_spec(SPEC, cfg, {"model.norm.weight": ("BF16", (8,))}, "/ckpt")
    with pytest.raises(model_ref.ModelCheckError, match="declares no MTP layer"):
        model_ref.check_spec(SPEC, {"model_type": "x"}, {"mtp.fc.weight": ("BF16", (8, 16))}, "/ckpt")
    with pytest.raises(model_ref.ModelCheckError, match="num_speculative_tokens"):
        model_ref.check_spec({"method": "ngram"}, cfg, {}, "/ckpt")
    model_ref.check_spec(SPEC, cfg, {"mtp.fc.weight": ("BF16", (8, 16))}, "/ckpt")  # fine: no raise


def test_mtp_config_on_a_checkpoint_without_mtp_weights_is_refused(tmp_path):
    """The console script, end to end up to the engine: a kit copy without its mtp.* tensors and an MTP
    speculative config exits 2 naming the missing weights, before any engine starts."""
    from safetensors.torch import load_file, save_file

    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    src = make_tiny_model("qwen3_5_text", tmp_path / "kit", target="recall")
    dst = tmp_path / "no_mtp"
    shutil.copytree(src, dst)
    t = load_file(str(dst / "model.safetensors"))
    save_file({k: v for k, v in t.items() if not k.startswith("mtp.")}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.cli", "verify", "--model", str(dst),
                           "--speculative-config", json.dumps(SPEC)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-2000:]
    assert "has no MTP weights" in proc.stderr and "Initializing a V1 LLM engine" not in proc.stdout + proc.stderr
