V=31; . /tmp/x31/repo/ci/gpu/window/next/plan_env.sh
rm -f $R/plan.end
export VLLM_USE_V2_MODEL_RUNNER=0
job V1 0-15 0 $PY -m vllm_platform_ext.testing.cells --suite core --shard 1/10 --parallel 1 --timeout 220 --out $R/V1
wait_jobs
date +%s > $R/plan.end
