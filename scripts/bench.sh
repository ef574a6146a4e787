#!/usr/bin/env bash
# Build keybus (Release) and run the main job: the origin's ordering and
# throughput scenarios on the in-memory transport. Extra arguments go to
# keybus-bench (e.g. --transport redis://127.0.0.1:6379 --json out.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DKEYBUS_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j"$(nproc)"
if [ -x build-release/bench/keybus-bench ]; then
  exec build-release/bench/keybus-bench --scenario all "$@"
fi
# Until the benchmark lands: the embedding example.
cc -std=c11 -Wall -O2 -Iinclude examples/hello.c build-release/libkeybus.a \
   $(pkg-config --libs ck liburcu-bp liburcu-cds inih) -lpthread -o build-release/hello
exec build-release/hello
