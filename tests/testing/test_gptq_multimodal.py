"""The GPU GPTQ kit (issue 50): ``gptq_cells build ROOT --kind qwen3_5 --dims gpu`` writes GPTQ checkpoints in the
multimodal form the CUDA lines take MTP on, and vLLM 0.23.0's and 0.26.0's own code (on this CPU host: the line's Python, its
compiled code absent) builds and loads them as its engine would.

vLLM 0.23-0.26 CUDA run Qwen3.5 MTP only on ``Qwen3_5ForConditionalGeneration`` (``SpeculativeConfig`` turns
``qwen3_5`` into ``Qwen3_5MTP``); the text class is refused (last proven here too). Before this change the kit
could not be built in that form at all (AutoRound's multimodal path asks for a processor the kit lacks:
results/gpu/2026-12-03-dummy-run-nan, g26): testing/gptq_multimodal.py quantizes the text form and writes the
multimodal layout back.

What the line's code does here (tests/testing/gptq_line_child.py): its engine config (architecture, the MTP
draft's architecture, the GPTQ config from the checkpoint), the target and the draft built by its
``initialize_model`` with each layer's quant method from its GPTQ config, their weights read by its
``DefaultModelLoader`` and loaded by the models' own ``load_weights`` (vLLM's name mapping). Judged here: every
parameter loaded, and every layer's weights, dequantized (GPTQ v1), equal to the float32 twin's tensors mapped
to vLLM's names by this test (fused layers: shards in checkpoint order) -- the reference the GPU cells audit
against. At the GPU dims every quantized layer takes group 128, so a fused layer (``qkv_proj``,
``gate_up_proj``) whose shards' ``dynamic`` rules vLLM never matches still gets its group.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torch

from conftest import QDEPS, REPO, line_source, load_tool, require_auto_round
from vllm_platform_ext.testing import gptq_cells, gptq_kit
from vllm_platform_ext.testing.gptq_multimodal import MM_PREFIX, text_form

CHILD = os.path.join(REPO, "tests", "testing", "gptq_line_child.py")
LINES = ((0, 23), (0, 26))  # the CUDA lines of the GPU machine
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
         "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"), "in_proj_ba": ("in_proj_b", "in_proj_a")}

require_auto_round()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, str(QDEPS)])}
    root = tmp_path_factory.mktemp("gpukit") / "root"
    proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.testing.gptq_cells", "build", str(root),
                           "--kind", "qwen3_5", "--dims", "gpu"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"gptq_cells build failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return root


@pytest.fixture(scope="module")
def lines(root, tmp_path_factory) -> dict:
    """Each line's child (run side by side) on both variants and on the bf16 kit's text form."""
    tool = load_tool("ci/tools/vllm_lines.py")
    missing = tool.deps_missing()  # gguf, which the 0.22-0.25 lines import
    if missing:
        pytest.fail(missing)
    text = text_form(root / "bf16", tmp_path_factory.mktemp("text") / "bf16-text")
    procs, dumps = {}, {}
    for i, key in enumerate(LINES):
        dumps[key] = tmp_path_factory.mktemp(f"dumps-{key[1]}")
        args = [f"{root / v}={dumps[key] / v}" for v in gptq_kit.VARIANTS] + [str(text)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([line_source(key), REPO, str(tool.DEPS_DIR)]), VLLM_PLUGINS="",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CHILD_PORT=str(29500 + (os.getpid() + 7 * i) % 400))
        procs[key] = subprocess.Popen([sys.executable, CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=REPO)
    out = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        found = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        assert found, f"{key} child printed no result (rc {proc.returncode}):\n{stderr[-4000:]}"
        out[key] = json.loads(found[-1][len("RESULT "):])
        out[key]["dumps"], out[key]["text"] = dumps[key], str(text)
    return out


def _hf_names(model: str, module: str) -> list[str]:
    """The checkpoint tensors (``.weight``) one vLLM module of ``model`` ("target" / "draft") holds."""
    if model == "target":
        if module == "language_model.lm_head":
            base = "lm_head"
        else:
            assert module.startswith("language_model.model."), module
            base = MM_PREFIX + module[len("language_model.model."):]
    elif module == "lm_head":
        base = "lm_head"
    elif module == "model.embed_tokens":  # the draft shares the target's embedding
        base = MM_PREFIX + "embed_tokens"
    else:
        assert module.startswith("model."), module
        base = "mtp." + module[len("model."):]
    head, _, last = base.rpartition(".")
    return [f"{head}.{s}.weight" for s in FUSED[last]] if last in FUSED else [base + ".weight"]


def test_build_writes_the_multimodal_gptq_form(root):
    kit = json.loads((root / gptq_cells.KIT_FILE).read_text())
    assert (kit["kind"], kit["dims"]) == ("qwen3_5", "gpu")
    for name, mtp in gptq_kit.VARIANTS.items():
        cfg = json.loads((root / name / "config.json").read_text())
        assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"] and cfg["model_type"] == "qwen3_5"
        qc = cfg["quantization_config"]
        assert (qc["quant_method"], qc["bits"], qc["group_size"], qc["sym"], qc["desc_act"]) == ("gptq", 4, 128, True, False)
        assert (gptq_kit.MTP_EXCLUSION in qc["dynamic"]) == (mtp == "bf16")
        tensors, _ = gptq_kit._read_tensors(root / name)
        assert all(k.startswith((MM_PREFIX, "mtp.", "lm_head.")) for k in tensors)
        assert ("mtp.layers.0.self_attn.q_proj.qweight" in tensors) == (mtp == "quantized")
        assert (MM_PREFIX + "layers.3.self_attn.q_proj.qweight") in tensors
        deq = root / f"{name}-deq"
        assert json.loads((deq / "config.json").read_text())["architectures"] == ["Qwen3_5ForConditionalGeneration"]


@pytest.mark.parametrize("key", LINES, ids=lambda k: f"{k[0]}.{k[1]}")
def test_line_builds_and_loads_the_kit_with_mtp(root, lines, key):
    """The line's engine config, layers and weight loading on both variants; every weight as the twin's."""
    line = lines[key]
    for name, mtp in gptq_kit.VARIANTS.items():
        res = line["checkpoints"][str(root / name)]
        assert "config_error" not in res, res["config_error"]
        assert res["architectures"] == ["Qwen3_5ForConditionalGeneration"]
        assert res["draft_architectures"] == ["Qwen3_5MTP"]
        assert res["quant_config"] == "AutoGPTQConfig" and res["quantization"] == "auto_gptq"
        twin = gptq_kit._read_tensors(root / f"{name}-deq")[0]
        for model in ("target", "draft"):
            info = res[model]
            assert "error" not in info, f"{name} {model}: {info.get('traceback', info.get('error'))}"
            assert info["not_loaded"] == [], f"{name} {model}: parameters left unloaded {info['not_loaded']}"
            compared = 0
            for module, m in info["modules"].items():
                want = torch.cat([twin[n] for n in _hf_names(model, module)], dim=0)
                got = torch.load(line["dumps"] / name / f"{model}--{module}.pt")
                assert got.shape == want.shape and torch.equal(got.float(), want.float()), f"{name} {model} {module}"
                compared += 1
                if m["method"] == "AutoGPTQLinearMethod":
                    assert m["group"] == 128, (name, module, m)
            assert compared >= (30 if model == "target" else 8), (name, model, compared)
        quant = {mod for mod, m in res["target"]["modules"].items() if m["method"] == "AutoGPTQLinearMethod"}
        assert len(quant) == 3 * 4 + 4, quant  # GDN qkvz, out, gate_up, down x3; attention qkv, o, gate_up, down
        mtp_linears = {mod: m["method"] for mod, m in res["draft"]["modules"].items()
                       if mod.startswith("model.layers.0.") and mod.endswith(("_proj",))}
        assert set(mtp_linears) == {f"model.layers.0.{p}" for p in ("self_attn.qkv_proj", "self_attn.o_proj",
                                                                    "mlp.gate_up_proj", "mlp.down_proj")}
        want_method = "AutoGPTQLinearMethod" if mtp == "quantized" else "UnquantizedLinearMethod"
        assert set(mtp_linears.values()) == {want_method}, (name, mtp_linears)
        assert res["draft"]["modules"]["model.fc"]["method"] == "UnquantizedLinearMethod"


@pytest.mark.parametrize("key", LINES, ids=lambda k: f"{k[0]}.{k[1]}")
def test_line_refuses_mtp_on_the_text_class(lines, key):
    """Why the multimodal form: the line takes no MTP draft for ``Qwen3_5ForCausalLM`` (the kit's text form)."""
    err = lines[key]["checkpoints"][lines[key]["text"]].get("config_error", "")
    assert "Qwen3_5ForCausalLM" in err and "not supported" in err, err[:500]


def test_a_carried_root_is_completed_as_built(root, tmp_path):
    """``run`` on a ROOT carried without the bf16 kit and the twins (a few MB) remakes them byte for byte, and
    refuses a bf16 kit other than the one the checkpoints were quantized from."""
    import shutil

    carried = tmp_path / "carried"
    for name in (*gptq_kit.VARIANTS, gptq_cells.KIT_FILE):
        (shutil.copytree if (root / name).is_dir() else shutil.copy2)(root / name, carried / name)
    size = sum(f.stat().st_size for f in carried.rglob("*") if f.is_file())
    assert size < 5 << 20, size
    gptq_cells.complete(carried)
    for d in ("bf16", *(f"{v}-deq" for v in gptq_kit.VARIANTS)):
        assert (carried / d / "model.safetensors").read_bytes() == (root / d / "model.safetensors").read_bytes(), d
    kit = json.loads((carried / gptq_cells.KIT_FILE).read_text())
    (carried / gptq_cells.KIT_FILE).write_text(json.dumps({**kit, "bf16_sha256": "0" * 64}))
    with pytest.raises(RuntimeError, match="not the bf16 kit"):
        gptq_cells.complete(carried)
