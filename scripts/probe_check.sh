#!/usr/bin/env bash
# Fresh probes followed by the default demo: does a probe give estimates the demo's measured
# time agrees with, also when another process keeps a CPU core busy while it measures?
#
#   scripts/probe_check.sh [N] [BUSY_EVERY]     (default 20 rounds, every 2nd one with a busy core)
#
# Each round clears the cached rates (streamplan probe --reset), probes (streamplan probe
# --json), with a busy loop on one core during the probe in every BUSY_EVERY-th round, then runs
# `streamplan demo --json` and prints the demo's estimated and measured time. A probe that is
# not trusted is not cached, so the demo then probes again itself. STREAMPLAN_BIN overrides the
# command (default build/streamplan). Prints one row per round and the count within 0.75-1.25.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${STREAMPLAN_BIN:-build/streamplan}
n=${1:-20}
every=${2:-2}
py=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )
[ -x "$bin" ] || { echo "probe_check: no streamplan command at $bin (scripts/setup.sh builds it)" >&2; exit 1; }
printf "%5s %5s %8s %7s %8s %11s %11s %9s\n" round busy attempts cached other_cores "estimate ms" "measured ms" "est/meas"
within=0
for i in $(seq 1 "$n"); do
  "$bin" probe --reset >/dev/null
  busy=no
  if [ "$every" -gt 0 ] && [ $((i % every)) -eq 0 ]; then
    busy=yes
    ( while :; do :; done ) &
    spin=$!
  fi
  probe=$("$bin" probe --json)
  [ "$busy" = yes ] && { kill "$spin"; wait "$spin" 2>/dev/null || true; }
  demo=$("$bin" demo --json --quiet)
  row=$(PROBE="$probe" DEMO="$demo" $py -c '
import json, os
p, d = json.loads(os.environ["PROBE"]), json.loads(os.environ["DEMO"])
est, meas = d["plan"]["estimated_ms"], d["planned"]["ms"]
print(p["attempts"], str(p["cached"]).lower(), "%.2f" % p["other_cores"], "%.1f" % est, "%.1f" % meas, "%.3f" % (est / meas))')
  read -r attempts cached other est meas ratio <<<"$row"
  printf "%5d %5s %8s %7s %11s %11s %11s %9s\n" "$i" "$busy" "$attempts" "$cached" "$other" "$est" "$meas" "$ratio"
  if $py -c "import sys; sys.exit(0 if 0.75 <= $ratio <= 1.25 else 1)"; then within=$((within + 1)); fi
done
echo "within 0.75-1.25: $within of $n"
