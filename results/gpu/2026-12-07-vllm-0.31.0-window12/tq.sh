V=31; . /tmp/x31/repo/ci/gpu/window/next/plan_env.sh
rm -f $R/plan.end
job T 0-15 0 $PY -m vllm_platform_ext.testing.cells --suite tq --parallel 12 --timeout 560 --out $R/T
wait_jobs
date +%s > $R/plan.end
