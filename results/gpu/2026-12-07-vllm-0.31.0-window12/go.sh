#!/usr/bin/env bash
# Window 12 (vLLM 0.31.0, model runner v2 the default for MTP, V1 for ngram): issue 52's first GPU cells on a
# 0.29+ line (the GDN group's 0.27-0.31 reach, TurboQuant under v2) and issue 50's quantized kits there.
# Lanes, at most 10 engines at once: P the prefix suite (vLLM's defaults: prefix caching on, mamba align; MTP k=3
# and ngram k=3, plugin on / off), gk the GPTQ kit's quantized MTP layer on bf16 KV and k8v4 (engines only),
# ct the compressed-tensors FP8 block 128x128 kit (engines only). The cells audit on the card after their engines.
V=31; . /tmp/x31/repo/ci/gpu/window/next/plan_env.sh
GK="mtp_quantized mtp k=3 on kv=auto|mtp_quantized mtp k=3 off kv=auto|mtp_quantized mtp k=3 on kv=k8v4"
CT="fp8_block-mtp_quantized mtp k=3 on kv=auto|fp8_block-mtp_bf16 mtp k=3 on kv=k8v4|fp8_block-mtp_bf16 base on kv=k8v4"
job P 0-15 0 $PY -m vllm_platform_ext.testing.cells --suite prefix --parallel 4 --timeout 600 --out $R/P
job gk 0-15 0 $PY -m vllm_platform_ext.testing.gptq_cells run /tmp/gk/root $R/gk --only "$GK" --parallel 3 --timeout 600 --engines-only
job ct 0-15 0 $PY -m vllm_platform_ext.testing.ct_cells run /tmp/ct/root $R/ct --formats fp8_block --ngram --only "$CT" --parallel 3 --timeout 600 --engines-only
wait_jobs
date +%s > $R/plan.end
