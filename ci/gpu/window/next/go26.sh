#!/usr/bin/env bash
# Window 12 fallback (vLLM 0.26.0, bundle with FlashAttention 2 kept): issue 50's compressed-tensors kit on TurboQuant
# k8v4 and FP8 block 128x128 on bf16 KV (engines only, judged on the host), issue 54's verify --model plugin on / off.
V=26; . /tmp/x26/repo/ci/gpu/window/next/plan_env.sh
FB="fp8_block-mtp_bf16 mtp k=3 on kv=auto|fp8_block-mtp_quantized mtp k=3 on kv=auto|fp8_block-mtp_quantized mtp k=3 off kv=auto"
SC='{"method": "mtp", "num_speculative_tokens": 3}'
VM="--gpu-memory-utilization 0.06 --kv-cache-memory-bytes 2147483648 --max-model-len 512 --gdn-prefill-backend triton"
job ctB 0-15 0 $PY -m vllm_platform_ext.testing.ct_cells run /tmp/ct/root $R/ctB --formats fp8_block w8a8_int8 --only 'kv=k8v4' --parallel 5 --timeout 600 --engines-only
job ctF 0-15 0 $PY -m vllm_platform_ext.testing.ct_cells run /tmp/ct/root $R/ctF --formats fp8_block --ngram --only "$FB" --parallel 4 --timeout 600 --engines-only
mkdir -p $R/vm
job vmon 0-15 0 $PY -m vllm_platform_ext.cli verify --model /tmp/gk/root/mtp_quantized --json $R/vm/gk_q_on.json --work-dir /tmp/vmon $VM --speculative-config "$SC"
job vmoff 0-15 0 env VLLM_PLUGINS= $PY -m vllm_platform_ext.cli verify --model /tmp/gk/root/mtp_quantized --json $R/vm/gk_q_off.json --work-dir /tmp/vmoff $VM --speculative-config "$SC"
wait_jobs
date +%s > $R/plan.end
