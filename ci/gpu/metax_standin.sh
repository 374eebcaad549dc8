#!/usr/bin/env bash
# Issue 33 item 4, the GPU stand-in for a MetaX host: vLLM 0.26's real CUDA wheel + vLLM-metax master's
# real Python package (its compiled MetaX parts stubbed to forward to vLLM's own CUDA kernels:
# tests/fixtures/metax_standin_gpu.py) + this plugin, on an NVIDIA GPU, through the audited engine cells.
# On the GPU machine, after `bash ci/gpu/run.sh --wheels /tmp/b/wheels --do check` (the venv):
#   bash ci/gpu/metax_standin.sh [--venv DIR] [--metax-src DIR] [--out DIR] [--timeout S] [--parallel N]
#                                [--suite S] [--steps prepare,premise,smoke,fa-check,doctor,cells]
#                                [--gptq-moe-root ROOT]
#   --venv       run.sh's venv (vLLM 0.26 + this plugin; default $(dirname repo)/venv)
#   --metax-src  vLLM-metax's source, Python only (default .carry/vllm-metax-master: carried with the repo)
#   --out        logs and results (default $(dirname repo)/metax-standin-results)
#   --timeout    seconds per engine (default 420); --parallel engines side by side (default 4)
#   --gptq-moe-root  a GPTQ MoE kit (gptq_cells build ROOT --kind qwen3_5_moe --dims gpu): adds the gptq-moe step
# Steps, each logging to OUT/<step>.log and a line to OUT/standin.log; a failed step does not stop the
# others (except prepare, which all but premise need); the exit status is 1 if any step failed:
#   prepare   OUT/root: the stubs, vLLM-metax's entry points (.dist-info), the fake libmxsml (gcc; without
#             it vLLM-metax takes NonMxsmlMacaPlatform, said in prepare.log), env.sh / engine-env.json
#   premise   the plain venv: vllm._C_stable_libtorch / _moe_C_stable_libtorch register the torch.ops._C*,
#             _C_cache_ops, _moe_C ops the mcoplib._C/_moe_C stubs stand for (shim 1)
#   smoke     the stand-in env: vLLM-metax's platform active, our register() None, both plugins' hooks,
#             the GPU stubs in place, no flashinfer stub, CudaRTLibrary on cuda* names (shims 1, 4, 5)
#   fa-check  the flash_attn forward on vLLM's FA2 against float32: varlen, paged, with_kvcache with K+1 and
#             with one query token (shim 2); runs before the cells start, so that the FA2 modules the engines
#             reach are compiled once, here, into the JIT cache
#   doctor    `vllm-platform-ext doctor` in the stand-in env
#   cells     python -m vllm_platform_ext.testing.cells --suite metax-standin: Qwen3-Next MTP k=3 on
#             turboquant_k8v4 (FULL_AND_PIECEWISE, plugin on), its floors (plain decoding on k8v4, MTP k=3
#             on KV auto) and the k8v4 cell with only our plugin off; results.json / results.md,
#             progress.log, engine-logs/ in OUT. It starts after fa-check, beside the other checks.
#   gptq-moe  (with --gptq-moe-root; issue 50) the GPTQ MoE kit's cells (gptq_cells run --moe: base, MTP k=3,
#             ngram k=3 on the bf16 kit and both GPTQ variants, plugin on and only ours off) in the stand-in env,
#             where vLLM-metax's MacaAutoGPTQConfig sends the routed experts to MacaMoeWNA16Config; engines
#             only (OUT/gptq-moe/runs.json), then `gptq_cells judge` (float32 reference on $VPE_REFERENCE_DEVICE).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
project="$(cd "$here/../.." && pwd)"
venv="$(dirname "$project")/venv" metax_src="$project/.carry/vllm-metax-master"
out="$(dirname "$project")/metax-standin-results" timeout=420 parallel=4 suite="metax-standin"
steps="prepare,premise,smoke,fa-check,doctor,cells" gptq_moe_root=""
die() { echo "metax_standin.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --venv|--metax-src|--out|--timeout|--parallel|--suite|--steps|--gptq-moe-root)
      [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
      case "$1" in
        --venv) venv="$2" ;; --metax-src) metax_src="$2" ;; --out) out="$2" ;; --timeout) timeout="$2" ;;
        --parallel) parallel="$2" ;; --suite) suite="$2" ;; --steps) steps="$2" ;; --gptq-moe-root) gptq_moe_root="$2" ;;
      esac
      shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ "$timeout" =~ ^[0-9]+$ ]] && [ "$timeout" -gt 0 ] || die "--timeout takes seconds > 0; got $timeout"
[[ "$parallel" =~ ^[0-9]+$ ]] && [ "$parallel" -gt 0 ] || die "--parallel takes a count > 0; got $parallel"
for s in ${steps//,/ }; do
  case "$s" in premise|prepare|smoke|fa-check|doctor|cells|gptq-moe) ;;
    *) die "--steps takes premise, prepare, smoke, fa-check, doctor, cells, gptq-moe; got $s" ;; esac
done
if [ -n "$gptq_moe_root" ]; then
  [ -f "$gptq_moe_root/kit.json" ] || die "--gptq-moe-root $gptq_moe_root holds no kit.json (gptq_cells build writes it)"
  gptq_moe_root="$(cd "$gptq_moe_root" && pwd)"
  [[ ",$steps," == *",gptq-moe,"* ]] || steps="$steps,gptq-moe"
elif [[ ",$steps," == *",gptq-moe,"* ]]; then
  die "the gptq-moe step needs --gptq-moe-root ROOT"
fi
py="$venv/bin/python"
[ -x "$py" ] || die "no python at $py: build the venv first (bash ci/gpu/run.sh --wheels DIR --do check) or pass --venv"
[ -f "$metax_src/vllm_metax/platform.py" ] || die "--metax-src $metax_src holds no vllm_metax/platform.py (copy ../shared/vllm-metax/master there)"
metax_src="$(cd "$metax_src" && pwd)"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
root="$out/root" log="$out/standin.log" fx="$project/tests/fixtures/metax_standin_gpu.py"
cd "$project"
failed=()
want() { [[ ",$steps," == *",$1,"* ]]; }
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$log"; }
finish() {  # name rc t0: the step's outcome and its log's tail into standin.log
  say "step $1: $([ "$2" -eq 0 ] && echo ok || echo "FAILED rc=$2") in $((SECONDS - $3))s (log $out/$1.log)"
  tail -n 8 "$out/$1.log" 2>/dev/null | sed 's/^/    | /' >>"$log"
  [ "$2" -eq 0 ] || failed+=("$1")
}
step() {  # name limit cmd...: run in the foreground, output to OUT/name.log
  local name="$1" limit="$2" t0=$SECONDS rc=0; shift 2
  say "step $name: $*"
  timeout --kill-after=30 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  finish "$name" "$rc" "$t0"
  return "$rc"
}
standin=(bash -c '. "$0" && exec "$@"' "$root/env.sh")  # a command in the stand-in's environment

say "metax_standin.sh: venv $venv, vLLM-metax $metax_src, out $out, timeout ${timeout}s/engine, parallel $parallel, suite $suite, steps $steps"
say "host $(hostname); repo $(git -C "$project" rev-parse --short HEAD 2>/dev/null || echo '?'); gcc $(command -v gcc || echo NONE); $(nvidia-smi -L 2>/dev/null | head -n 8 | tr '\n' ';' || echo 'no nvidia-smi')"
if want prepare; then
  step prepare 180 "$py" "$fx" prepare --root "$root" --metax-src "$metax_src"
  grep -q "WARNING no fake libmxsml" "$out/prepare.log" && say "prepare: NO fake libmxsml (gcc missing?): vLLM-metax runs as NonMxsmlMacaPlatform"
fi
if [ ! -f "$root/env.sh" ]; then
  say "no stand-in root ($root/env.sh): only premise can run"
  failed+=("no-root")
  if want premise; then steps="premise"; else steps=""; fi
fi

# fa-check first, in the foreground: besides checking the forwards it compiles the FA2 modules the
# engines need (vLLM 0.26's FA2 has no Hopper code: the driver JIT-compiles its PTX on first use, minutes a
# module; the cache, CUDA_CACHE_MAXSIZE in the stand-in's env, then serves every engine)
want fa-check && step fa-check 600 "${standin[@]}" "$py" "$fx" fa-check
cells_pid=""
if want cells; then  # in the background: the engines' start-up (~4 min) overlaps the checks below
  ref="${VPE_REFERENCE_PYTHON:-}"
  if [ -z "$ref" ]; then  # as run.sh: the machine's own interpreter (its transformers) for the float32 reference
    for c in python3 python /opt/*/.venv/bin/python3 /opt/*/bin/python3; do
      command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch, transformers' >/dev/null 2>&1 && { ref="$(command -v "$c")"; break; }
    done
  fi
  ref="${ref:-$py}"
  say "step cells: reference python $ref; engines get $root/engine-env.json; plugin-off cells VLLM_PLUGINS=$(cat "$root/metax-plugins.txt")"
  cells_t0=$SECONDS
  (PYTHONPATH="$root/metax_eps" VPE_REFERENCE_PYTHON="$ref" timeout --kill-after=30 $((timeout + 600)) \
     "$py" -m vllm_platform_ext.testing.cells --suite "$suite" --parallel "$parallel" --timeout "$timeout" \
     --engine-env "$root/engine-env.json" --plugins-off "$(cat "$root/metax-plugins.txt")" --out "$out" \
     >"$out/cells.log" 2>&1) &
  cells_pid=$!
fi
gptq_pid=""
if want gptq-moe; then  # in the background too, beside the cells
  say "step gptq-moe: gptq_cells run $gptq_moe_root --moe, plugin-off engines VLLM_PLUGINS=$(cat "$root/metax-plugins.txt")"
  gptq_t0=$SECONDS
  (cd "$project" && PYTHONPATH="$root/metax_eps" timeout --kill-after=30 $((timeout * 3 + 900)) bash -c '
     "$0" -m vllm_platform_ext.testing.gptq_cells run "$1" "$2" --moe --parallel "$3" --timeout "$4" \
       --engine-env "$5" --plugins-off "$6" --engines-only && "$0" -m vllm_platform_ext.testing.gptq_cells judge "$1" "$2"' \
     "$py" "$gptq_moe_root" "$out/gptq-moe" "$parallel" "$timeout" "$root/engine-env.json" "$(cat "$root/metax-plugins.txt")" \
     >"$out/gptq-moe.log" 2>&1) &
  gptq_pid=$!
fi
want premise && step premise 300 "$py" "$fx" premise
want smoke && step smoke 420 "${standin[@]}" "$py" "$fx" smoke
want doctor && step doctor 300 "${standin[@]}" "$py" -m vllm_platform_ext.cli doctor

if [ -n "$cells_pid" ]; then
  rc=0; wait "$cells_pid" || rc=$?
  finish cells "$rc" "$cells_t0"
  if [ -f "$out/results.md" ]; then  # the engines name the fake libmxsml's card: say which card it was
    card="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
    { echo "GPU stand-in (ci/gpu/metax_standin.sh): vLLM-metax master's platform on ${card:-an unnamed GPU}; the"
      echo "device name in the table's first line is the fake libmxsml's."; echo; cat "$out/results.md"; } >"$out/results.md.new"
    mv "$out/results.md.new" "$out/results.md"
    sed 's/^/    /' "$out/results.md" >>"$log"
  fi
fi
if [ -n "$gptq_pid" ]; then
  rc=0; wait "$gptq_pid" || rc=$?
  finish gptq-moe "$rc" "$gptq_t0"
fi
if [ ${#failed[@]} -gt 0 ]; then
  say "DONE with failures: ${failed[*]} (logs in $out)"
  exit 1
fi
say "DONE: all steps ok (logs in $out)"
