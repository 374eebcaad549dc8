#!/usr/bin/env bash
# The plan (window 2026-12-07c, commit in /tmp/x26/commit): issue 50 (GPTQ kit gk, native AutoRound kit ak, engines
# only: runs.json judged on the CPU host), issue 54 (verify --model on the GPU), issue 51 (mtp3-preempt on k8v4).
# Three lanes, at most ~11 engines at once on 16 CPUs.
cd /tmp/x26/repo && . ci/gpu/window/lib.sh; export PYTHONUNBUFFERED=1; host_log
nvidia-smi -L > $R/gpus; nproc > $R/nproc; cat /tmp/x26/commit > $R/commit 2>/dev/null
export VPE_REFERENCE_PYTHON=/opt/torch/.venv/bin/python VPE_REFERENCE_DEVICE=cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=/tmp/x26/venv/bin/python
G="$PY -m vllm_platform_ext.testing.gptq_cells run"
MTP="mtp k=3 on kv=auto|mtp k=3 off kv=auto"
B="kv=k8v4|mtp_bf16 ngram"
LONG="$PY -m vllm_platform_ext.testing.long_cells run --kind qwen3_5 --dims gpu --graphs full_and_piecewise"
EA='{"gpu_memory_utilization": 0.05, "kv_cache_memory_bytes": 2147483648}'
VM="--gpu-memory-utilization 0.06 --kv-cache-memory-bytes 2147483648 --max-model-len 512"
SC='{"method": "mtp", "num_speculative_tokens": 3}'
job gk 0-15 0 bash -c "$G /tmp/gk/root $R/gkA --only '$MTP' --parallel 5 --timeout 540 --engines-only; $G /tmp/gk/root $R/gkB --only '$B' --parallel 5 --timeout 700 --engines-only"
job ak 0-15 0 bash -c "$G /tmp/ak/root $R/akA --only '$MTP' --parallel 5 --timeout 540 --engines-only; $G /tmp/ak/root $R/akB --only '$B' --parallel 5 --timeout 700 --engines-only"
job vm 0-15 0 bash -c "mkdir -p $R/vm; $PY -m vllm_platform_ext.cli verify --model /tmp/gk/root/mtp_quantized --json $R/vm/gk_mtp_quantized.json --work-dir /tmp/vmw $VM --speculative-config '$SC'; $LONG $R/lk8p --kv turboquant_k8v4 --only mtp3-preempt --engine-args '$EA'"
wait_jobs
date +%s > $R/plan.end
