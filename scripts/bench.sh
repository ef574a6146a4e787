#!/usr/bin/env bash
# Build keybus (Release) and run the main job: the origin's ordering and
# throughput scenarios on the in-memory transport, with the raw-ring and mutex
# baselines measured in the same run. Extra arguments go to keybus-bench
# (e.g. --json out.jsonl, or --transport redis://127.0.0.1:6379).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DKEYBUS_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j"$(nproc)"
exec build-release/bench/keybus-bench --scenario all "$@"
