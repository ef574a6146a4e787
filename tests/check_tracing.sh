#!/usr/bin/env bash
# docs/tracing.md's bpftrace and perf lines, run as written against keybus-bench
# (`-c` or a command in place of `-p "$PID"`). Exit 77 (ctest: skipped) when not
# root or the tools are missing or cannot attach on this kernel.
# Usage: check_tracing.sh KEYBUS_BENCH DOCS_TRACING_MD
set -uo pipefail
bench="$1" doc="$2"
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "not root"
# grep reads it all: an early `grep -q` exit would SIGPIPE readelf and, under
# pipefail, fail the check at random.
readelf -n "$bench" | grep stapsdt >/dev/null || { echo "no USDT probes in $bench" >&2; exit 1; }
export LIB="$bench"
export run="$bench --events 2000 --large-events 0 --scenario multi --no-baselines --threads 2"
status=77

if command -v bpftrace >/dev/null && timeout 30 bpftrace -e 'BEGIN { exit(); }' >/dev/null 2>&1; then
  line="$(grep -m1 '^bpftrace -p "$PID" -e ' "$doc")" || { echo "no bpftrace line in $doc" >&2; exit 1; }
  cmd="${line/-p \"\$PID\"/-c \"\$run\"}"
  out="$(timeout 120 bash -c "$cmd" 2>&1)"
  for want in '^@queued_us:' '^@handler_us:' '^@settle_us:' '^@events: 2000$'; do
    grep -q "$want" <<<"$out" || { echo "bpftrace line: no $want in:"; echo "$out"; exit 1; } >&2
  done
  echo "bpftrace line of $doc: 2000 events through every stage"
  status=0
else
  echo "bpftrace missing or cannot attach: its line not run"
fi

if command -v perf >/dev/null; then
  line="$(grep -m1 '^perf probe -x "$LIB"' "$doc")" || { echo "no perf line in $doc" >&2; exit 1; }
  cmd="${line/-p \"\$PID\" -- sleep 10/-- \$run}"
  out="$(timeout 120 bash -c "$cmd" 2>&1)"
  for probe in handler_start ack; do
    grep -Eq "^ +2,?000 +sdt_keybus:$probe" <<<"$out" ||
      { echo "perf line: sdt_keybus:$probe not counted 2000 times in:"; echo "$out"; exit 1; } >&2
  done
  echo "perf line of $doc: 2000 handler_start and ack"
  status=0
fi
[ "$status" -eq 77 ] && skip "neither bpftrace nor perf usable"
exit 0
