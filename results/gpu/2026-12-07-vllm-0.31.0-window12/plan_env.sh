# Sourced by a window's go.sh with V (the line staged by stage.sh): results in /tmp/r/wV, the machine's load
# logged, the run's records (cards, CPUs, commit), the engines' and the float32 reference's environment, PY.
export R=/tmp/r/w$V; cd /tmp/x$V/repo && . ci/gpu/window/lib.sh; export PYTHONUNBUFFERED=1; host_log
nvidia-smi -L > $R/gpus; nproc > $R/nproc; cat /tmp/x$V/commit > $R/commit; export VPE_COMMIT=$(cat /tmp/x$V/commit)
export VPE_REFERENCE_PYTHON=/opt/torch/.venv/bin/python VPE_REFERENCE_DEVICE=cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0
PY=/tmp/x$V/venv/bin/python
