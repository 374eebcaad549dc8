#!/usr/bin/env bash
# On the GPU machine, after `bash unpack.sh DEST` (ci/gpu/bundle.py build wrote both):
#   bash DEST/project/ci/gpu/run.sh --wheels DEST/wheels [--suite core|full|cpu] [--shard i/n]
#                                   [--parallel N] [--out DIR] [-- extra pytest args]
# Installs the carried wheels into a venv beside the machine's own torch (no network: --no-index
# --no-deps, exactly the locked files), then runs the gpu_engine tests, which start the real vLLM
# engine for each cell of the suite and audit every token against float32 transformers.
# Results: DIR/results.json and DIR/results.md (default DIR: ./gpu-results next to DEST).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
project="$(cd "$here/../.." && pwd)"
wheels="" suite="core" shard="1/1" parallel="4" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --shard) shard="$2"; shift 2 ;;
    --parallel) parallel="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$wheels" ] || { echo "run.sh: --wheels DIR is required" >&2; exit 2; }
out="${out:-$(dirname "$project")/gpu-results}"
venv="$(dirname "$project")/venv"
py="${PYTHON:-python3}"

if [ ! -f "$venv/.installed" ]; then
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv"   # the machine's torch 2.11 / triton 3.6 stay visible
  # every locked wheel, the stripped vLLM wheel and this project's wheel (its entry points are how
  # vLLM finds the plugin), exactly as carried: no index, no resolution
  "$venv/bin/python" -m pip install -q --no-index --no-deps "$wheels"/*.whl
  touch "$venv/.installed"
fi
"$venv/bin/python" - <<'EOF'
import torch, vllm, vllm_platform_ext
print(f"torch {torch.__version__} cuda {torch.version.cuda} device "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}; vllm {vllm.__version__}")
EOF
cd "$project"
VPE_CELLS_SUITE="$suite" VPE_CELLS_SHARD="$shard" VPE_CELLS_PARALLEL="$parallel" VPE_CELLS_OUT="$out" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -m gpu_engine tests/test_gpu_engine.py "$@" || rc=$?
echo "results: $out/results.json, $out/results.md"
exit "${rc:-0}"
