#!/usr/bin/env bash
# A device window's staging for one vLLM line, from the call's repository root: `V=31 bash .carry/w31/stage.sh`.
# The line's bundle unpacked (unpack.sh --follow started in the call that carried part00), this commit's wheel
# (.carry/proj) in place of the bundle's own, the tree copied, the window's kits to /tmp, the venv built and
# checked. The window's folder .carry/wV holds this script, go.sh, commit and kits/ (README.md here).
set -u
V="${V:?set V to the line staged: 26 or 31}"; C=$PWD; W=$C/.carry/w$V; T0=$(date +%s)
bash /tmp/p$V/unpack.sh --wait /tmp/b$V 600 > /tmp/unpack$V.log 2>&1 || { echo "unpack failed"; tail -5 /tmp/unpack$V.log; exit 1; }
echo "unpacked t+$(( $(date +%s) - T0 ))s"
rm -f /tmp/b$V/wheels/vllm_platform_ext-*.whl; cp $C/.carry/proj/*.whl /tmp/b$V/wheels/
rm -rf /tmp/x$V && mkdir -p /tmp/x$V/repo && tar -C $C --exclude=./.carry -cf - . | tar -C /tmp/x$V/repo -xf -
cp $W/commit /tmp/x$V/commit
for k in $W/kits/*; do rm -rf /tmp/$(basename $k) && cp -r $k /tmp/; done
mkdir -p /tmp/keep && cp -r $W /tmp/keep/
(cd /tmp/x$V/repo && bash ci/gpu/run.sh --wheels /tmp/b$V/wheels --do check > /tmp/check$V.log 2>&1; echo rc=$? >> /tmp/check$V.log)
tail -8 /tmp/check$V.log
echo "staged t+$(( $(date +%s) - T0 ))s"
