#!/usr/bin/env bash
# Window 12 (vLLM 0.31.0) staging, from the call's repository root: the bundle unpacked (--follow started in call 1),
# this commit's wheel in, the tree copied, the kits to /tmp, the venv built and checked (torch 2.13.0 carried).
set -u
C=$PWD; T0=$(date +%s)
bash /tmp/p31/unpack.sh --wait /tmp/b31 600 > /tmp/unpack31.log 2>&1 || { echo "unpack failed"; tail -5 /tmp/unpack31.log; exit 1; }
echo "unpacked t+$(( $(date +%s) - T0 ))s"
rm -f /tmp/b31/wheels/vllm_platform_ext-*.whl; cp $C/.carry/proj/*.whl /tmp/b31/wheels/
rm -rf /tmp/x31 && mkdir -p /tmp/x31/repo && tar -C $C --exclude=./.carry -cf - . | tar -C /tmp/x31/repo -xf -
cp $C/.carry/win31/commit /tmp/x31/commit
for k in gk ct; do rm -rf /tmp/$k && cp -r $C/.carry/k31/$k /tmp/$k; done
mkdir -p /tmp/keep && cp -r $C/.carry/win31 /tmp/keep/win31
(cd /tmp/x31/repo && bash ci/gpu/run.sh --wheels /tmp/b31/wheels --do check > /tmp/check31.log 2>&1; echo rc=$? >> /tmp/check31.log)
tail -8 /tmp/check31.log
echo "staged t+$(( $(date +%s) - T0 ))s"
