#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -DKEYBUS_FUZZ=ON) in their own build
# dir and runs each for a bounded time on its seed corpus (tests/fuzz/corpus/
# <target>/, read only: new inputs go to a scratch dir). Fails on any crash,
# leak or sanitizer report; crash inputs are left in the build dir.
#   tests/fuzz/run.sh [seconds per target, default 20]
# KEYBUS_FUZZ_BUILD: build dir (default build-fuzz); KEYBUS_FUZZ_CMAKE_ARGS:
# more cmake arguments (e.g. -DKEYBUS_WITH_NATS=OFF).
set -euo pipefail

seconds=${1:-20}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${KEYBUS_FUZZ_BUILD:-$root/build-fuzz}

# shellcheck disable=SC2086
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DKEYBUS_FUZZ=ON -DKEYBUS_BUILD_TESTS=OFF \
  -DKEYBUS_BUILD_BENCH=OFF ${KEYBUS_FUZZ_CMAKE_ARGS:-} >/dev/null
# conf ini url dlq_id cli_text, plus redis_entry, redis_reply, redis_frame, nats_frame, nats_kv,
# nats_lease and nats_stored with their transports
IFS=';' read -r -a targets <"$build/fuzz_targets"
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null

status=0
for t in "${targets[@]}"; do
  scratch=$(mktemp -d)
  log=$build/fuzz_$t.log
  if "$build/fuzz_$t" -max_total_time="$seconds" -max_len=16384 -print_final_stats=1 \
       -artifact_prefix="$build/crash-$t-" "$scratch" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1; then
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    rate=$(grep -E '^stat::average_exec_per_sec' "$log" | awk '{print $2}')
    echo "fuzz_$t: ok, ${rate:-?} exec/s, ${last}"
  else
    echo "fuzz_$t: FAILED (log: $log)"
    tail -40 "$log"
    status=1
  fi
  rm -rf "$scratch"
done
exit "$status"
