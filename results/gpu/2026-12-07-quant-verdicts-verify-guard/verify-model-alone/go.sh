#!/usr/bin/env bash
# Window 2026-12-07d (issue 54): verify --model on the GPU again, one engine at a time (clean tokens/s), with the
# audit's loader fix (audit.causal_lm: transformers' own config class after vLLM 0.26 registered its Qwen3_5Config).
export R=/tmp/r/w4; cd /tmp/x26/repo && . ci/gpu/window/lib.sh; host_log
cat /tmp/x26/commit > $R/commit; nvidia-smi -L > $R/gpus; mkdir -p $R/vm
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VPE_REFERENCE_DEVICE=cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=/tmp/x26/venv/bin/python
SC='{"method": "mtp", "num_speculative_tokens": 3}'
VM="--gpu-memory-utilization 0.3 --kv-cache-memory-bytes 2147483648 --max-model-len 512 --gdn-prefill-backend triton"
job vmg 0-15 0 $PY -m vllm_platform_ext.cli verify --model /tmp/gk/root/mtp_quantized --json $R/vm/gk_mtp_quantized.json --work-dir /tmp/vmg $VM --speculative-config "$SC"
wait_jobs
job vmt 0-15 0 $PY -m vllm_platform_ext.cli verify --model /tmp/ak/root/mtp_quantized --json $R/vm/ak_mtp_quantized_k8v4.json --work-dir /tmp/vmt $VM --kv-cache-dtype turboquant_k8v4 --speculative-config "$SC"
wait_jobs
date +%s > $R/plan.end
