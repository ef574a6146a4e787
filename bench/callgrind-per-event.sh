#!/usr/bin/env bash
# Instructions per event on each side of a mem:// run, counted by callgrind
# (machine load does not change them). Usage:
#   bench/callgrind-per-event.sh BENCH_BINARY SCENARIO EVENTS [keybus-bench options...]
# Prints: publish = kb_publish_to or kb_publish_batch inclusive, executor =
# executor_main inclusive less the benchmark's handler (bench/run_bus.c).
set -euo pipefail
bin=$1 scenario=$2 events=$3
shift 3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bin" --scenario "$scenario" \
    --events "$events" --no-baselines "$@" >"$out/log" 2>&1
callgrind_annotate --inclusive=yes --threshold=100 "$out/cg" 2>/dev/null >"$out/ann"
incl() {   # inclusive instructions of a function, 0 when absent: the largest of its
           # entries, the one that counts code inlined from other files (headers) too
    awk -v f=":$1( |$)" '$0 ~ f { gsub(",", "", $1); if ($1 + 0 > max) max = $1 + 0 }
        END { print max + 0 }' "$out/ann"
}
batch=$(incl kb_publish_batch) to=$(incl kb_publish_to)
publish=$(( to > 0 ? to : batch ))
executor=$(( $(incl executor_main) - $(incl handle) ))
echo "scenario=$scenario events=$events $* publish/event=$(( publish / events )) executor/event=$(( executor / events )) total/event=$(( (publish + executor) / events ))"
