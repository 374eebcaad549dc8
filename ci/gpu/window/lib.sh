# Helpers of a device window's plan script (results/gpu/DIARY.md has each window's plan).
# Source it on the GPU machine, then launch jobs in the background and `wait`:
#
#   . ci/gpu/window/lib.sh                       # R (results folder) defaults to /tmp/r/w
#   job c0 0-15 0 bash -c "$(cells_shard /tmp/b/wheels full 8/12 $R/full8)"
#   job e2e 32-47 2 python benchmarks/e2e_spec_decode.py ... --out $R/e2e
#   wait
#
# job NAME CPUS CARD CMD...: runs CMD on card CARD (CUDA_VISIBLE_DEVICES) and CPUs CPUS (taskset) in
#   the background; writes $R/NAME.start, .out (stdout+stderr, then "rc=N"), .done (epoch seconds).
# wait_jobs: waits for the jobs started with `job`, and only those. A bare `wait` also waits for every
#   other background child, such as an endless logger: windows 9 and 10 lost their hand-off from the
#   e2e job to the 0.23.0 shards to that.
# host_log [EVERY]: one line every EVERY seconds (10) in $R/host.log -- epoch, load averages, the GPU's
#   SM and memory clocks, power, temperature and clock-event reasons (where nvidia-smi is), the CPUs'
#   mean MHz; detached (its PID in $R/host_log.pid), so nothing waits for it.
# launch PLAN [LOG]: runs a plan script detached from the device call (setsid nohup). A job started
#   straight from a call ends with that call (window 10: a shard launched from a polling call stopped,
#   load 0, when the call returned); a plan that must outlive its call is launched.
# cells_shard WHEELS SUITE I/N OUT [PARALLEL] [TIMEOUT]: prints the command of one shard of a cell
#   suite (run.sh --do engine) that also stamps OUT.start_ts / OUT.end, for a `bash -c` chain.
# pack.sh and poll.sh (beside this file) bring the results back while the jobs run.
# VPE_COMMIT: export the tree's commit in a plan: the machine's copy has no .git, and the benchmarks' run headers read it.
R="${R:-/tmp/r/w}"
mkdir -p "$R"
[ -e "$R/t0" ] || date +%s > "$R/t0"

JOB_PIDS=()

job() {
  local n=$1 cpus=$2 card=$3; shift 3
  ( date +%s > "$R/$n.start"
    CUDA_VISIBLE_DEVICES=$card taskset -c "$cpus" "$@" > "$R/$n.out" 2>&1
    echo "rc=$?" >> "$R/$n.out"; date +%s > "$R/$n.done" ) &
  JOB_PIDS+=("$!")
}

wait_jobs() {
  local p
  for p in "${JOB_PIDS[@]}"; do wait "$p" || true; done
  JOB_PIDS=()
}

host_log() {
  local every=${1:-10}
  setsid bash -c 'while true; do
      gpu=$(nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
            --format=csv,noheader 2>/dev/null || echo "no nvidia-smi")
      mhz=$(awk "/MHz/{s+=\$4;n++} END{if (n) printf \"%.0f\", s/n}" /proc/cpuinfo)
      echo "$(date +%s) $(cut -d" " -f1-3 /proc/loadavg) | $gpu | $mhz" >> "$0/host.log"; sleep "$1"
    done' "$R" "$every" < /dev/null > /dev/null 2>&1 &
  echo "$!" > "$R/host_log.pid"
}

launch() {
  setsid nohup bash "$1" > "${2:-/tmp/$(basename "$1" .sh).log}" 2>&1 < /dev/null &
}

cells_shard() {
  local wheels=$1 suite=$2 shard=$3 out=$4 parallel=${5:-16} timeout=${6:-560}
  echo "date +%s > $out.start_ts; bash ci/gpu/run.sh --wheels $wheels --do engine --timeout $timeout" \
       "--suite $suite --parallel $parallel --shard $shard --out $out -- -k 'not serve'; date +%s > $out.end;"
}
