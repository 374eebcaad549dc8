# Helpers of a device window's plan script (ci/gpu/results/HOW.txt has each window's plan).
# Source it on the GPU machine, then launch jobs in the background and `wait`:
#
#   . ci/gpu/window/lib.sh                       # R (results folder) defaults to /tmp/r/w
#   job c0 0-15 0 bash -c "$(cells_shard /tmp/b/wheels full 8/12 $R/full8)"
#   job e2e 32-47 2 python benchmarks/e2e_spec_decode.py ... --out $R/e2e
#   wait
#
# job NAME CPUS CARD CMD...: runs CMD on card CARD (CUDA_VISIBLE_DEVICES) and CPUs CPUS (taskset) in
#   the background; writes $R/NAME.start, .out (stdout+stderr, then "rc=N"), .done (epoch seconds).
# cells_shard WHEELS SUITE I/N OUT [PARALLEL] [TIMEOUT]: prints the command of one shard of a cell
#   suite (run.sh --do engine) that also stamps OUT.start_ts / OUT.end, for a `bash -c` chain.
# pack.sh and poll.sh (beside this file) bring the results back while the jobs run.
R="${R:-/tmp/r/w}"
mkdir -p "$R"
[ -e "$R/t0" ] || date +%s > "$R/t0"

job() {
  local n=$1 cpus=$2 card=$3; shift 3
  ( date +%s > "$R/$n.start"
    CUDA_VISIBLE_DEVICES=$card taskset -c "$cpus" "$@" > "$R/$n.out" 2>&1
    echo "rc=$?" >> "$R/$n.out"; date +%s > "$R/$n.done" ) &
}

cells_shard() {
  local wheels=$1 suite=$2 shard=$3 out=$4 parallel=${5:-16} timeout=${6:-560}
  echo "date +%s > $out.start_ts; bash ci/gpu/run.sh --wheels $wheels --do engine --timeout $timeout" \
       "--suite $suite --parallel $parallel --shard $shard --out $out -- -k 'not serve'; date +%s > $out.end;"
}
