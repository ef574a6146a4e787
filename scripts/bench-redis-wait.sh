#!/usr/bin/env bash
# What redis.wait_replicas = 1 costs: keybus-bench (multi scenario) against a
# single redis-server and against a primary with one replica, with WAIT off and
# on, runs alternating, all in one invocation. Prints a Markdown table for
# docs/benchmarks.md ("Redis with a replica"). Servers: free loopback ports,
# own temp dir, no persistence, stopped by PID.
# Usage: bash scripts/bench-redis-wait.sh [events (default 200000)] [repeat (default 3)]
set -euo pipefail
me=bench-redis-wait.sh tag=wait
# shellcheck source=scripts/bench-servers.sh
source "$(dirname "$0")/bench-servers.sh"

# start NAME PORT [redis-server arguments...]
start() {
    local name=$1 port=$2
    shift 2
    mkdir -p "$dir/$name"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir/$name" \
        --repl-diskless-sync-delay 0 --logfile "$dir/$name/log" "$@" >/dev/null 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
    echo "bench-redis-wait.sh: redis-server $name did not start" >&2
    exit 1
}

single=$(free_port); start single "$single"
primary=$(free_port); start primary "$primary"
replica=$(free_port); start replica "$replica" --replicaof 127.0.0.1 "$primary"
for _ in $(seq 100); do
    redis-cli -p "$primary" info replication | grep "state=online" >/dev/null && break
    sleep 0.1
done

# run LABEL PORT WAIT: one keybus-bench run, events/s on stdout
run() {
    local port=$2 wait=$3 out="$dir/run.jsonl"
    rm -f "$out"
    redis-cli -p "$port" flushall >/dev/null
    KEYBUS_REDIS_WAIT_REPLICAS=$wait "$bench" --transport "redis://127.0.0.1:$port" --scenario multi \
        --events "$events" --no-baselines --json "$out" >/dev/null 2>&1 || {
        echo "bench-redis-wait.sh: keybus-bench failed ($1)" >&2
        exit 1
    }
    jq -r '.events_per_s' "$out"
}

declare -A got
for r in $(seq "$repeat"); do
    got[single]+="$(run single "$single" 0) "
    got[replica0]+="$(run replica0 "$primary" 0) "
    got[replica1]+="$(run replica1 "$primary" 1) "
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
m_single=$(echo "${got[single]}" | median)
m0=$(echo "${got[replica0]}" | median)
m1=$(echo "${got[replica1]}" | median)

echo "| setup | redis.wait_replicas | events/s, median of $repeat (all runs) | × single node |"
echo "|---|--:|--:|--:|"
printf '| one redis-server | 0 | %.0f (%s) | 1.00 |\n' "$m_single" "$(echo ${got[single]} | xargs printf '%.0f ' | sed 's/ $//')"
printf '| primary + 1 replica | 0 | %.0f (%s) | %.2f |\n' "$m0" "$(echo ${got[replica0]} | xargs printf '%.0f ' | sed 's/ $//')" \
    "$(awk -v a="$m0" -v b="$m_single" 'BEGIN { print a / b }')"
printf '| primary + 1 replica | 1 | %.0f (%s) | %.2f |\n' "$m1" "$(echo ${got[replica1]} | xargs printf '%.0f ' | sed 's/ $//')" \
    "$(awk -v a="$m1" -v b="$m_single" 'BEGIN { print a / b }')"
echo
echo "keybus-bench --scenario multi --events $events --no-baselines; redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), loopback, no persistence; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
