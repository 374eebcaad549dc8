#!/bin/bash
# Nsight Compute profile of the TurboQuant verify kernel (GPU machine). Writes one tarball to $OUT.
#   bash ci/tools/ncu_turboquant.sh "PRESET B K [CFG_JSON without spaces]" ...
set -u
out=${OUT:-/tmp}/ncu; mkdir -p "$out"
for c in "$@"; do
  set -- $c; name=$(echo "$1_b$2_k$3" | tr -c 'A-Za-z0-9_\n' _)
  ncu --clock-control none --set full --import-source no -k regex:_tq_verify -c 1 -f -o "$out/$name" \
      python benchmarks/profile_turboquant.py case "$@" > "$out/$name.log" 2>&1 || tail -5 "$out/$name.log"
  ncu -i "$out/$name.ncu-rep" --page details > "$out/$name.txt" 2>&1
  ncu -i "$out/$name.ncu-rep" --page source --print-source sass --csv > "$out/${name}_sass.csv" 2>/dev/null
  echo "== $name"; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issued Ipc|No Eligible|Block Limit|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Shared Memory Configuration Size|Dynamic Shared" "$out/$name.txt" | head -24
  grep -E -A2 "Stall|stall" "$out/$name.txt" | grep -E "^ +[A-Z].*(cycles|%)" | head -12
done
tar czf "${OUT:-/tmp}/ncu.tgz" -C "$out" . && ls -la "${OUT:-/tmp}/ncu.tgz"
