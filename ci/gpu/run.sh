#!/usr/bin/env bash
# On the GPU machine, after `bash unpack.sh DEST` (ci/gpu/bundle.py build wrote both):
#   bash DEST/project/ci/gpu/run.sh --wheels DEST/wheels [--suite core|full|cpu|tp2] [--shard i/n]
#                                   [--parallel N] [--out DIR] [--do engine,kernels,e2e,e2e-tp2]
#                                   [-- extra pytest args]
# Installs the carried wheels into a venv beside the machine's own torch (no network: --no-index
# --no-deps, exactly the locked files), then, in the order given by --do (default: engine):
#   kernels  the GPU kernel tests (pytest -m gpu: tests/test_turboquant_gpu.py, tests/test_gdn_gpu.py)
#   engine   the gpu_engine tests: the real vLLM engine for each cell of the suite, every token
#            audited against float32 transformers
#   e2e      benchmarks/e2e_spec_decode.py: the Qwen3.6-35B-A3B shape (8 layers) and the tiny model
#   e2e-tp2  the same benchmark at tensor_parallel_size=2 (a 2-GPU kind): B and C at batch 8, 4K
# so one warm machine does all of it in one call.
# Results in DIR (default: ./gpu-results next to DEST): results.json / results.md (engine),
# kernels.xml (kernels), e2e/ and e2e-tiny/ (e2e).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
project="$(cd "$here/../.." && pwd)"
wheels="" suite="core" shard="1/1" parallel="4" out="" do="engine"
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --shard) shard="$2"; shift 2 ;;
    --parallel) parallel="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --do) do="$2"; shift 2 ;;
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
  # ... unless "$py" is itself a venv (the GPU machine's python3 is /opt/torch/.venv): a venv made
  # from a venv sees the base interpreter's site-packages, not its parent's. Name the folder that
  # holds torch in a .pth (after the venv's own packages, so the carried wheels come first).
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    torch_site=$("$py" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
    purelib=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "$torch_site" > "$purelib/zz-machine-torch.pth"
    "$venv/bin/python" -c "import torch, triton" || { echo "run.sh: no torch/triton from $py" >&2; exit 3; }
  fi
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
mkdir -p "$out"
for step in ${do//,/ }; do
  case "$step" in
    kernels)
      "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml "$out/kernels.xml" \
        tests/test_turboquant_gpu.py tests/test_gdn_gpu.py "$@" || rc=$?
      echo "results: $out/kernels.xml" ;;
    engine)
      VPE_CELLS_SUITE="$suite" VPE_CELLS_SHARD="$shard" VPE_CELLS_PARALLEL="$parallel" VPE_CELLS_OUT="$out" \
        "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider -m gpu_engine tests/test_gpu_engine.py "$@" || rc=$?
      echo "results: $out/results.json, $out/results.md" ;;
    e2e)
      "$venv/bin/python" benchmarks/e2e_spec_decode.py --model qwen36_a3b --layers 8 --out "$out/e2e" || rc=$?
      "$venv/bin/python" benchmarks/e2e_spec_decode.py --model tiny --out "$out/e2e-tiny" || rc=$?
      echo "results: $out/e2e/e2e.md, $out/e2e-tiny/e2e.md" ;;
    e2e-tp2)
      "$venv/bin/python" benchmarks/e2e_spec_decode.py --model qwen36_a3b --layers 8 --tp 2 --configs B,C \
        --batches 8 --contexts 4096 --out "$out/e2e-tp2" || rc=$?
      echo "results: $out/e2e-tp2/e2e.md" ;;
    *) echo "run.sh: --do takes engine, kernels, e2e, e2e-tp2; got $step" >&2; exit 2 ;;
  esac
done
exit "${rc:-0}"
