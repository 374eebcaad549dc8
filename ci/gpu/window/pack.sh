# Status of a window's jobs, and its results' small files as one tar in $OUT (when set).
# Usage: bash ci/gpu/window/pack.sh   (R: the results folder, default /tmp/r/w)
R="${R:-/tmp/r/w}"
now=$(date +%s); t0=$(cat "$R/t0" 2>/dev/null || echo "$now")
echo "t+$((now - t0))s"
for s in "$R"/*.start; do
  [ -e "$s" ] || continue
  n=$(basename "$s" .start)
  if [ -e "$R/$n.done" ]; then
    echo "done: $n $(( $(cat "$R/$n.done") - $(cat "$s") ))s $(tail -n 1 "$R/$n.out" 2>/dev/null)"
  else
    echo "running: $n $((now - $(cat "$s")))s"
  fi
done
ls "$R"/*.end 2>/dev/null | xargs -r -n1 basename | tr '\n' ' '; echo
if [ -n "${OUT:-}" ]; then  # files under 3 MB (logs, results), no checkpoints
  (cd "$(dirname "$R")" && find "$(basename "$R")" -type f -size -3M ! -name '*.safetensors' ! -name '*.pt' \
     | tar czf "$OUT/w.tgz.tmp" -T -) && mv "$OUT/w.tgz.tmp" "$OUT/w.tgz"
fi
