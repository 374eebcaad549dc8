V=31; . /tmp/x31/repo/ci/gpu/window/next/plan_env.sh
CT="fp8_block-mtp_quantized mtp k=3 on kv=auto|fp8_block-mtp_bf16 mtp k=3 on kv=k8v4|fp8_block-mtp_bf16 base on kv=k8v4"
job ct2 0-15 0 $PY -m vllm_platform_ext.testing.ct_cells run /tmp/ct/root $R/ct2 --formats fp8_block --ngram --only "$CT" --parallel 3 --timeout 600 --engines-only
wait_jobs
date +%s > $R/ct2.end
