#!/usr/bin/env bash
# Window 11 (issue 50 on the GPU): the GPTQ kit (gk) and native AutoRound kit (ak) on vLLM 0.23.0; the
# compressed-tensors kit (ct: W8A8 int8, FP8 channel, FP8 block, W4A16; multimodal form) on 0.26.0. Engines only
# (runs.json), each run then judged on the card (float32 reference on cuda); runs.json also judged on the host if cut.
export R=/tmp/r/w11; cd /tmp/x26/repo && . ci/gpu/window/lib.sh; export PYTHONUNBUFFERED=1; host_log
nvidia-smi -L > $R/gpus; nproc > $R/nproc; cat /tmp/x26/commit > $R/commit; export VPE_COMMIT=$(cat /tmp/x26/commit)
export VPE_REFERENCE_PYTHON=/opt/torch/.venv/bin/python VPE_REFERENCE_DEVICE=cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0
G23="/tmp/x23/venv/bin/python -m vllm_platform_ext.testing.gptq_cells"
G26="/tmp/x26/venv/bin/python -m vllm_platform_ext.testing.gptq_cells"
F="mtp_quantized base on kv=k8v4|mtp_quantized mtp k=3 on kv=k8v4|mtp_quantized mtp k=3 off kv=k8v4"  # FULL graphs: the first report's setting
C26="/tmp/x26/venv/bin/python -m vllm_platform_ext.testing.ct_cells"
MTP="mtp k=3 on kv=auto|mtp k=3 off kv=auto"
B="kv=k8v4|mtp_bf16 ngram"
SC='{"method": "mtp", "num_speculative_tokens": 3}'
VM="--gpu-memory-utilization 0.06 --kv-cache-memory-bytes 2147483648 --max-model-len 512 --gdn-prefill-backend triton"
job gk 0-15 0 bash -c "cd /tmp/x23/repo; $G23 run /tmp/gk/root $R/gkA --only '$MTP' --parallel 3 --timeout 540 --engines-only; $G23 judge /tmp/gk/root $R/gkA > $R/gkA.judge 2>&1; $G23 run /tmp/gk/root $R/gkB --only '$B' --parallel 3 --timeout 700 --engines-only; $G23 judge /tmp/gk/root $R/gkB > $R/gkB.judge 2>&1"
job ak 0-15 0 bash -c "cd /tmp/x23/repo; $G23 run /tmp/ak/root $R/akA --only '$MTP' --parallel 3 --timeout 540 --engines-only; $G23 judge /tmp/ak/root $R/akA > $R/akA.judge 2>&1; $C26 run /tmp/ct/root $R/ctB --only 'kv=k8v4' --parallel 3 --timeout 700 --engines-only; $C26 judge /tmp/ct/root $R/ctB > $R/ctB.judge 2>&1; mkdir -p $R/vm; cd /tmp/x26/repo; for m in on off; do P=; [ \$m = off ] && P=VLLM_PLUGINS=; env \$P /tmp/x26/venv/bin/python -m vllm_platform_ext.cli verify --model /tmp/gk/root/mtp_quantized --json $R/vm/gk_q_\$m.json --work-dir /tmp/vm\$m $VM --speculative-config '$SC' > $R/vm/\$m.out 2>&1; done"
job ct 0-15 0 bash -c "$C26 run /tmp/ct/root $R/ctA --only 'kv=auto' --parallel 5 --timeout 600 --engines-only; $C26 judge /tmp/ct/root $R/ctA > $R/ctA.judge 2>&1; $G26 run /tmp/ak/root $R/akF --graphs full --only '$F' --parallel 3 --timeout 600 --engines-only; $G26 judge /tmp/ak/root $R/akF > $R/akF.judge 2>&1"
wait_jobs
date +%s > $R/plan.end
