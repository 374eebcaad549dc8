#!/usr/bin/env bash
# Window 2026-12-07c, second plan: issue 54 on the GPU -- the guard's overhead (alone), then verify --model on the
# GPTQ and native AutoRound kits (MTP k=3; AutoRound also with TurboQuant k8v4). The bundle has no flashinfer:
# FlashInfer sampler off and the GDN prefill on Triton, as the cells do (testing/engine.py).
export R=/tmp/r/w2; cd /tmp/x26/repo && . ci/gpu/window/lib.sh; host_log
cat /tmp/x26/commit > $R/commit; nvidia-smi -L > $R/gpus
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VPE_REFERENCE_PYTHON=/opt/torch/.venv/bin/python VPE_REFERENCE_DEVICE=cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=/tmp/x26/venv/bin/python
SC='{"method": "mtp", "num_speculative_tokens": 3}'
SA='["--max-model-len", "512", "--max-num-seqs", "64", "--gpu-memory-utilization", "0.4", "--gdn-prefill-backend", "triton", "--speculative-config", "{\"method\": \"mtp\", \"num_speculative_tokens\": 3}"]'
mkdir -p $R/guard $R/vm
job guard 0-15 0 $PY benchmarks/bench_guard_overhead.py --engine --model /tmp/gk/root/mtp_bf16 --serve-args "$SA" --out $R/guard/RESULTS.md
wait_jobs
VM="--gpu-memory-utilization 0.2 --kv-cache-memory-bytes 2147483648 --max-model-len 512 --gdn-prefill-backend triton"
job vmg 0-5 0 $PY -m vllm_platform_ext.cli verify --model /tmp/gk/root/mtp_quantized --json $R/vm/gk_mtp_quantized.json --work-dir /tmp/vmg $VM --speculative-config "$SC"
job vma 6-10 0 $PY -m vllm_platform_ext.cli verify --model /tmp/ak/root/mtp_quantized --json $R/vm/ak_mtp_quantized.json --work-dir /tmp/vma $VM --speculative-config "$SC"
job vmt 11-15 0 $PY -m vllm_platform_ext.cli verify --model /tmp/ak/root/mtp_quantized --json $R/vm/ak_mtp_quantized_k8v4.json --work-dir /tmp/vmt $VM --kv-cache-dtype turboquant_k8v4 --speculative-config "$SC"
wait_jobs
date +%s > $R/plan.end
