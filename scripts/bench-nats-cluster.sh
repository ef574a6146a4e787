#!/usr/bin/env bash
# What a 3-node JetStream cluster with nats.replicas = 3 costs: keybus-bench
# (multi scenario) against one nats-server -js and against a 3-node cluster
# (R1 and R3 streams), runs alternating, all in one invocation. Prints a
# Markdown table for docs/benchmarks.md ("NATS JetStream cluster"). Servers:
# free loopback ports, own store dirs, file storage, stopped by PID.
# Usage: bash scripts/bench-nats-cluster.sh [events (default 200000)] [repeat (default 3)]
#    or: bash scripts/bench-nats-cluster.sh consumers [count (default 8)] [rounds (default 3)]
# `consumers`: instead, what a durable consumer's creation costs on the same
# servers (keybus-consumer-cost: count consumers made one after another, rounds
# times, per replica count; the single node as the baseline), for
# docs/transports-nats.md ("What a consumer's creation costs").
set -euo pipefail
me=bench-nats-cluster.sh tag=ncluster
mode=throughput
if [ "${1:-}" = consumers ]; then
    mode=consumers
    shift
fi
# shellcheck source=scripts/bench-servers.sh
source "$(dirname "$0")/bench-servers.sh"

# start NAME CONF: nats-server with that configuration, in $dir/NAME
start() {
    mkdir -p "$dir/$1"
    printf '%s\n' "$2" >"$dir/$1/server.conf"
    (cd "$dir/$1" && exec nats-server -c server.conf -l server.log) &
    pids+=($!)
}

single=$(free_port) single_http=$(free_port)
start single "listen: 127.0.0.1:$single
http: 127.0.0.1:$single_http
jetstream { store_dir: \"$dir/single/js\" }"
ports=() https=() routes=()
for i in 0 1 2; do ports+=("$(free_port)"); https+=("$(free_port)"); routes+=("$(free_port)"); done
for i in 0 1 2; do
    r=""
    for j in 0 1 2; do [ "$j" = "$i" ] || r+="
    nats-route://127.0.0.1:${routes[$j]}"; done
    start "n$i" "server_name: n$i
listen: 127.0.0.1:${ports[$i]}
http: 127.0.0.1:${https[$i]}
jetstream { store_dir: \"$dir/n$i/js\" }
cluster { name: kbbench, listen: 127.0.0.1:${routes[$i]}, routes: [$r
  ] }"
done
nats_healthy "$single_http"
for i in 0 1 2; do nats_healthy "${https[$i]}"; done
cluster="nats://127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"

if [ "$mode" = consumers ]; then
    cost=$build/bench/keybus-consumer-cost
    [ -x "$cost" ] || { echo "$me: build $cost first" >&2; exit 1; }
    count=${1:-8} rounds=${2:-3}
    echo "one nats-server -js (the baseline):"
    "$cost" "nats://127.0.0.1:$single" "$count" "$rounds" 1
    echo "3-node cluster, an R3 stream as nats.replicas = 3 makes:"
    "$cost" "$cluster" "$count" "$rounds" 3
    echo "$(nats-server --version), loopback, file storage; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
    exit 0
fi

# run LABEL URL REPLICAS: one keybus-bench run, events/s on stdout (a lease
# bucket per replica count: an existing one keeps its own)
run() {
    local out="$dir/run.jsonl"
    rm -f "$out"
    KEYBUS_NATS_REPLICAS=$3 KEYBUS_NATS_LEASE_BUCKET=leases_r$3 "$bench" --transport "$2" --scenario multi \
        --events "$events" --no-baselines --json "$out" >"$dir/run.log" 2>&1 || {
        echo "bench-nats-cluster.sh: keybus-bench failed ($1):" >&2
        tail -5 "$dir/run.log" >&2
        exit 1
    }
    jq -r '.events_per_s' "$out"
}

declare -A got
for r in $(seq "$repeat"); do
    got[single]+="$(run single "nats://127.0.0.1:$single" 1) "
    got[r1]+="$(run r1 "$cluster" 1) "
    got[r3]+="$(run r3 "$cluster" 3) "
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
m_single=$(echo "${got[single]}" | median)
row() {
    local m
    m=$(echo "${got[$1]}" | median)
    printf '| %s | %s | %.0f (%s) | %.2f |\n' "$2" "$3" "$m" \
        "$(echo ${got[$1]} | xargs printf '%.0f ' | sed 's/ $//')" \
        "$(awk -v a="$m" -v b="$m_single" 'BEGIN { print a / b }')"
}
echo "| setup | nats.replicas | events/s, median of $repeat (all runs) | × single node |"
echo "|---|--:|--:|--:|"
row single "one nats-server -js" 1
row r1 "3-node cluster, URL with the 3 seeds" 1
row r3 "3-node cluster, URL with the 3 seeds" 3
echo
echo "keybus-bench --scenario multi --events $events --no-baselines; $(nats-server --version), loopback, file storage; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
