# A polling call's command: packs every 20 s (a call cut short still brings back the last pack)
# until SECONDS have passed, or once the plan has written $R/plan.end, or, with N, once N jobs are done.
# Usage: bash ci/gpu/window/poll.sh SECONDS [N]. (Window 12 asked for 5 jobs of a plan of one: its last
# poll ran 150 s of device time past the plan's end; a plan that ends with `date +%s > $R/plan.end` stops it.)
here=$(cd "$(dirname "$0")" && pwd)
R="${R:-/tmp/r/w}"
end=$(( $(date +%s) + $1 )); want=${2:-0}; every=${POLL_EVERY:-20}
while [ "$(date +%s)" -lt "$end" ]; do
  sleep "$every"
  bash "$here/pack.sh" > /tmp/pack.log 2>&1
  [ -e "$R/plan.end" ] && break
  if [ "$want" -gt 0 ] && [ "$(ls "$R"/*.done 2>/dev/null | wc -l)" -ge "$want" ]; then break; fi
done
bash "$here/pack.sh" 2>&1 | grep -v "^INFO" | cut -c1-250 | tail -40
