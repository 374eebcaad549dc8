"""A hand-packer's qzeros convention: the experts' qzeros stored as 8 (GPTQ v2 / 'zero itself') instead of v1's 7."""
import json, shutil, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.audit import Reference
root = Path("/tmp/moeg/kit2"); d = Path("/tmp/moeg/zp8")
if d.exists(): shutil.rmtree(d)
shutil.copytree(root / "mtp_bf16", d)
n = 0
for f in d.glob("*.safetensors"):
    sd = load_file(str(f))
    for k in list(sd):
        if ".mlp.experts." in k and k.endswith(".qzeros"):
            sd[k] = torch.full_like(sd[k], 0x88888888 - (1 << 32)); n += 1
    save_file(sd, str(f), metadata={"format": "pt"})
print("planted", n, flush=True)
P = default_prompts(); S = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
r = run_in_subprocess(str(d), P, [EngineConfig()], S, env={"VLLM_CPU_INT4_W4A8": "0"}, timeout=900)[0]
print("err", r.error[:300], flush=True)
ref = Reference(str(root / "mtp_bf16-deq"))
a = ref.audit(P, r.tokens, r.logprobs)
print(json.dumps(dict(positions=a.positions, bad05=a.count(0.5), bad01=a.count(0.1), drift02=a.drift_count(), max_drift=a.max_drift, max_regret=a.max_regret)))
