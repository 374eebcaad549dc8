#!/usr/bin/env bash
# On the GPU machine, after `bash unpack.sh DEST` (ci/gpu/bundle.py build wrote both):
#   bash DEST/project/ci/gpu/run.sh --wheels DEST/wheels [--suite core|full|cpu] [--shard i/n]
#                                   [--parallel N] [--memory kv-bytes|utilization] [--timeout S] [--out DIR]
#                                   [--do check,kernels-quick,kernels,engine,e2e] [-- extra pytest args]
# Finds the interpreter that holds torch ($PYTHON, else python3/python on PATH, else /opt/*), and
# builds a venv on it (ci/gpu/machine_venv.py: the carried wheels with --no-index --no-deps, torch
# and Triton the machine's own, also where that interpreter is itself a venv). Then, in the order
# given by --do (default: engine):
#   check          only the venv and its version line (torch, its CUDA, Triton, vLLM); where the bundle
#                  carries torch (wheels/bundle-pins.json), machine_venv.py fails unless the carried
#                  torch, its CUDA and Triton are the pinned ones and import from the run venv
#   kernels-quick  the GPU kernel tests' quick tier (each test's first case: every kernel once)
#   kernels        the GPU kernel tests (pytest -m gpu: tests/ops/test_turboquant_gpu.py, tests/ops/test_gdn_gpu.py),
#                  all of them, or the --kernel-shard i/n part of them
#   engine         the gpu_engine tests: the real vLLM engine for each cell of the suite, every token
#                  audited against float32 transformers (in a separate process, on the GPU with TF32 off:
#                  $VPE_REFERENCE_DEVICE, default cuda here; the reference python,
#                  $VPE_REFERENCE_PYTHON, default the machine's interpreter, whose transformers has Qwen3.5)
#   e2e            benchmarks/e2e_spec_decode.py: the Qwen3.6-35B-A3B shape (8 layers) and the tiny model
#   e2e-tp2        the same benchmark at tensor_parallel_size=2 (a 2-GPU kind): B and C at batch 8, 4K
# so one warm machine does all of it in one call.
# --memory kv-bytes (default where the vLLM line has kv_cache_memory_bytes): each engine gets its KV
# cache in bytes and vLLM skips its memory profiling, so side-by-side engines never trip it;
# utilization: each engine gets 0.8/N of the GPU (use with --parallel 1: cells one after another).
# --timeout S: seconds per engine (default 1800); past it the engine's process group is killed and the
# cell fails as a harness error, so a suite ends inside a device call and still writes its results.
# Results in DIR (default: ./gpu-results next to DEST): results.json / results.md (engine), progress.log
# and engine-logs/<cell>.log (each engine's whole log, also of a cell cut short),
# kernels.xml / kernels-quick.xml (kernels), e2e/ and e2e-tiny/ (e2e).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
project="$(cd "$here/../.." && pwd)"
wheels="" suite="core" shard="1/1" parallel="4" out="" do="engine" memory="" kshard="1/1" timeout="1800"
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --shard) shard="$2"; shift 2 ;;
    --kernel-shard) kshard="$2"; shift 2 ;;
    --parallel) parallel="$2"; shift 2 ;;
    --memory) memory="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --do) do="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$wheels" ] || { echo "run.sh: --wheels DIR is required" >&2; exit 2; }
for step in ${do//,/ }; do
  case "$step" in check|kernels-quick|kernels|engine|e2e|e2e-tp2) ;;
    *) echo "run.sh: --do takes check, kernels-quick, kernels, engine, e2e, e2e-tp2; got $step" >&2; exit 2 ;;
  esac
done
case "$memory" in ""|kv-bytes|utilization) ;;
  *) echo "run.sh: --memory takes kv-bytes or utilization; got $memory" >&2; exit 2 ;;
esac
out="${out:-$(dirname "$project")/gpu-results}"
venv="$(dirname "$project")/venv"

torch_python() {  # the first interpreter that imports torch
  local c tried=""
  if [ -n "${PYTHON:-}" ]; then
    "$PYTHON" -c 'import torch' >/dev/null 2>&1 && { echo "$PYTHON"; return 0; }
    echo "run.sh: PYTHON=$PYTHON cannot import torch" >&2; return 1
  fi
  for c in python3 python /opt/*/.venv/bin/python3 /opt/*/bin/python3; do
    command -v "$c" >/dev/null 2>&1 || continue
    tried="$tried $c"
    if "$c" -c 'import torch' >/dev/null 2>&1; then command -v "$c"; return 0; fi
  done
  echo "run.sh: no interpreter here imports torch (tried:${tried:- none}); set PYTHON=" >&2; return 1
}

py="$(torch_python)"
"$py" "$here/machine_venv.py" "$venv" "$wheels"   # builds once (stamped), then only checks
export VPE_REFERENCE_PYTHON="${VPE_REFERENCE_PYTHON:-$py}"
export VPE_REFERENCE_DEVICE="${VPE_REFERENCE_DEVICE:-cuda}"  # the float32 reference on the GPU (TF32 off)
"$venv/bin/python" - <<'PYEOF'
import torch, vllm, vllm_platform_ext
try:
    import triton
    tv = triton.__version__
except ImportError:
    tv = "none"
print(f"torch {torch.__version__} cuda {torch.version.cuda} device "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}; triton {tv}; vllm {vllm.__version__}")
PYEOF
cd "$project"
mkdir -p "$out"
for step in ${do//,/ }; do
  case "$step" in
    check) ;;
    kernels-quick)
      VPE_GPU_TIER=quick "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider -m gpu \
        --junitxml "$out/kernels-quick.xml" tests/ops/test_turboquant_gpu.py tests/ops/test_gdn_gpu.py "$@" || rc=$?
      echo "results: $out/kernels-quick.xml" ;;
    kernels)
      kx="$out/kernels.xml"; [ "$kshard" = "1/1" ] || kx="$out/kernels-${kshard/\//of}.xml"
      VPE_GPU_SHARD="$kshard" "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml "$kx" \
        tests/ops/test_turboquant_gpu.py tests/ops/test_gdn_gpu.py "$@" || rc=$?
      echo "results: $kx" ;;
    engine)
      VPE_CELLS_SUITE="$suite" VPE_CELLS_SHARD="$shard" VPE_CELLS_PARALLEL="$parallel" VPE_CELLS_OUT="$out" \
        VPE_CELLS_MEMORY="$memory" VPE_CELLS_TIMEOUT="$timeout" \
        "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider -m gpu_engine tests/testing/test_gpu_engine.py "$@" || rc=$?
      echo "results: $out/results.json, $out/results.md" ;;
    e2e)
      "$venv/bin/python" benchmarks/e2e_spec_decode.py --model qwen36_a3b --layers 8 --timeout "$timeout" --out "$out/e2e" || rc=$?
      "$venv/bin/python" benchmarks/e2e_spec_decode.py --model tiny --timeout "$timeout" --out "$out/e2e-tiny" || rc=$?
      echo "results: $out/e2e/e2e.md, $out/e2e-tiny/e2e.md" ;;
    e2e-tp2)
      "$venv/bin/python" benchmarks/e2e_spec_decode.py --model qwen36_a3b --layers 8 --tp 2 --configs B,C --timeout "$timeout" \
        --batches 8 --contexts 4096 --out "$out/e2e-tp2" || rc=$?
      echo "results: $out/e2e-tp2/e2e.md" ;;
  esac
done
exit "${rc:-0}"
