#!/usr/bin/env bash
# Window 12 (fallback, vLLM 0.26.0) staging, from the call's repository root: both bundles unpacked (--follow started in calls 1-2), this
# commit's wheel in place of the bundles' own, the tree copied for each line, the kits to /tmp, both venvs checked.
set -u
C=$PWD; T0=$(date +%s)
VS="${VS:-26 23}"
for v in $VS; do bash /tmp/p$v/unpack.sh --wait /tmp/b$v 600 > /tmp/unpack$v.log 2>&1 || { echo "unpack $v failed"; tail -5 /tmp/unpack$v.log; exit 1; }; done
echo "unpacked t+$(( $(date +%s) - T0 ))s"
for v in $VS; do
  rm -f /tmp/b$v/wheels/vllm_platform_ext-*.whl; cp $C/.carry/proj/*.whl /tmp/b$v/wheels/
  rm -rf /tmp/x$v && mkdir -p /tmp/x$v/repo && tar -C $C --exclude=./.carry -cf - . | tar -C /tmp/x$v/repo -xf -
  cp $C/.carry/win26b/commit /tmp/x$v/commit
done
for k in gk ct; do rm -rf /tmp/$k && cp -r $C/.carry/k26/$k /tmp/$k; done
mkdir -p /tmp/keep && cp -r $C/.carry/win26b /tmp/keep/win26b
(cd /tmp/x26/repo && bash ci/gpu/run.sh --wheels /tmp/b26/wheels --do check > /tmp/check26.log 2>&1; echo rc=$? >> /tmp/check26.log) &
case " $VS " in *" 23 "*) (cd /tmp/x23/repo && bash ci/gpu/run.sh --wheels /tmp/b23/wheels --do check > /tmp/check23.log 2>&1; echo rc=$? >> /tmp/check23.log) & ;; esac
wait
tail -4 /tmp/check2?.log
echo "staged t+$(( $(date +%s) - T0 ))s"
