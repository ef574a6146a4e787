#!/usr/bin/env bash
# Cost of metrics and trace points (issue 28), same-run ratios: keybus-bench
# with metrics.enabled true and false, with the USDT probes compiled out, and
# with docs/tracing.md's bpftrace line attached, alternating, REPEAT times
# each; medians. Prints the Markdown section bench/metrics.md holds.
# Usage: bench/metrics.sh BUILD_DIR NOSDT_BUILD_DIR [REPEAT]
#   NOSDT_BUILD_DIR: cmake -S . -B build-nosdt -DKB_HAVE_SDT=0 -DKEYBUS_BUILD_TESTS=OFF
#                    && cmake --build build-nosdt --target keybus-bench
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
bench="$1/bench/keybus-bench" nosdt="$2/bench/keybus-bench" repeat="${3:-5}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
args=(--scenario multi --events 1M --large-events 0 --no-baselines --json -)
bt="$(grep -m1 '^bpftrace -p "$PID" -e ' "$src/docs/tracing.md")"
can_trace=0
[ "$(id -u)" -eq 0 ] && command -v bpftrace >/dev/null && can_trace=1

# run CONFIG MODE: one JSON line appended to $tmp/CONFIG.MODE
run() {
  local config="$1" mode="$2" extra=()
  [ "$mode" = rate ] && extra=(--rate 500000)
  case "$config" in
    on) KEYBUS_METRICS_ENABLED=true "$bench" "${args[@]}" "${extra[@]}" ;;
    off) "$bench" "${args[@]}" "${extra[@]}" ;;
    nosdt) KEYBUS_METRICS_ENABLED=true "$nosdt" "${args[@]}" "${extra[@]}" ;;
    attached)   # every hit traps into the kernel: a tenth of the events
      KEYBUS_METRICS_ENABLED=true LIB="$bench" run="$bench ${args[*]/1M/100k} ${extra[*]}" \
        bash -c "${bt/-p \"\$PID\"/-c \"\$run\"}" 2>/dev/null | grep '^{' ;;
  esac 2>/dev/null | grep '^{' >>"$tmp/$config.$mode"
}

configs=(on off nosdt)
[ "$can_trace" -eq 1 ] && configs+=(attached)
for i in $(seq "$repeat"); do
  for mode in flat rate; do
    for c in "${configs[@]}"; do run "$c" "$mode"; done
  done
done

median() {   # FILE FIELD
  jq -s "[.[].$2] | sort | .[length/2|floor]" "$1"
}
label() {
  case "$1" in
    on) echo "metrics on (\`KEYBUS_METRICS_ENABLED=true\`), probes detached" ;;
    off) echo "metrics off (\`metrics.enabled = false\`, the default)" ;;
    nosdt) echo "probes compiled out (\`-DKB_HAVE_SDT=0\`), metrics on" ;;
    attached) echo "probes attached (docs/tracing.md's bpftrace line), metrics on" ;;
  esac
}
base_flat="$(median "$tmp/on.flat" events_per_s)"
echo "| build and configuration | flat out events/s | × metrics on | p50 µs at 500k/s | p99 µs at 500k/s |"
echo "|---|--:|--:|--:|--:|"
for c in "${configs[@]}"; do
  flat="$(median "$tmp/$c.flat" events_per_s)"
  printf '| %s | %.0f | %.2f | %s | %s |\n' "$(label "$c")" "$flat" \
    "$(jq -n "$flat / $base_flat")" "$(median "$tmp/$c.rate" p50_us)" "$(median "$tmp/$c.rate" p99_us)"
done
echo
echo "\`bench/metrics.sh build build-nosdt $repeat\`: \`keybus-bench ${args[*]}\` flat out and with"
echo "\`--rate 500000\`, the configurations alternating, median of $repeat runs each (attached:"
echo "100k events per run)."
