#!/usr/bin/env bash
# A second, separate venv holding an OLD CUDA vLLM line (default 0.23.0, what MetaX users run),
# used by tests/patch/test_gdn_cuda_wiring_old_vllm.py to check the GDN CUDA-path wiring against that
# line's real GDNAttentionMetadataBuilder / GPUModelRunner code on CPU tensors.
#
#   bash ci/old_vllm_venv.sh            # create or reuse; last line printed = venv python
#   OLD_VLLM_VERSION=0.26.0 OLD_VLLM_VENV=.venv-old26 bash ci/old_vllm_venv.sh
#
# The CUDA wheel installs on a CPU-only box (its torch pin resolves from PyPI) and `import vllm`
# gives an UnspecifiedPlatform; the pure-Python modules the tests need import. torchvision /
# torchaudio / torchcodec are removed: their builds cannot load here and transformers (pulled in
# by vllm.config) imports torchvision when it is present. Nothing of this repository is
# installed into it: the tests run it with PYTHONPATH=<repo>.
# Idempotent: skipped when the venv already holds this version for this script.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${OLD_VLLM_VERSION:-0.23.0}"
VENV="${OLD_VLLM_VENV:-.venv-old}"
PY="$VENV/bin/python"
STAMP="$VENV/.old-vllm-installed"
want="$VERSION $(sha256sum ci/old_vllm_venv.sh | cut -c1-16)"

check() {
  "$PY" - <<'EOF'
import vllm
import vllm.v1.attention.backends.gdn_attn as g
import vllm.v1.worker.gpu_model_runner as r
print("old vllm", vllm.__version__, "importable:", g.__name__, r.__name__)
EOF
}

if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "== installing vllm==$VERSION into $VENV" >&2
  start=$(date +%s)
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --progress-bar off -U pip >&2
  "$PY" -m pip install -q --progress-bar off --no-cache-dir "vllm==$VERSION" >&2
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
  check >&2
  echo "$want" > "$STAMP"
  echo "== done in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)" >&2
fi
echo "$(cd "$(dirname "$PY")" && pwd)/python"
