#!/usr/bin/env bash
# What a membership change costs a running service: a producer at $RATE events/s
# over $KEYS keys, two consumer processes, 16 partitions, per-key order checked
# (build/bench/keybus-membership runs the processes, bench/membership.py checks
# their logs). Real servers on free loopback ports in a temp dir, stopped by PID.
# Each run prints its figures, then a Markdown row (median / worst over the runs)
# for docs/deployment.md ("What each failure costs").
#
# Usage: bash scripts/bench-membership.sh BROKER SCENARIO [RUNS (default 5)]
#   nats:  join | leave | rolling | node-lost-stream-leader | node-lost-kv-leader |
#          node-lost-non-leader | node-restarted
#          (3-node JetStream cluster, nats.replicas = 3, the URL naming all three)
#   redis: join | leave | rolling | primary-lost
#          (one redis-server; primary-lost: a primary, a replica and three Sentinels
#          with down-after-milliseconds 5000, redis.wait_replicas = 1)
# join: the second process starts under load; leave: it stops with SIGTERM;
# rolling: each process in turn stopped with SIGTERM and started again (under a
# new name, as a redeployed process); node-lost-*: the node leading the topic's
# stream, the lease bucket, or nothing (nor the meta group when one such is free)
# killed -9 and left down; node-restarted: the stream leader's node killed -9 and
# started again 10 s later; primary-lost: the Redis primary killed -9, started
# again 10 s later (the Sentinels make it a replica of the new primary).
# Settings: keybus defaults (lease TTL 10 s) but for the above; KEYBUS_* in the
# environment apply to every process. KB_MSHIP_SECONDS (default 30) of
# publishing, the change at 8 s; KB_MSHIP_KEEP=DIR keeps each run's logs there.
set -euo pipefail
me=bench-membership.sh tag=membership
broker=${1:-} scenario=${2:-} runs=${3:-5}
case "$broker:$scenario" in
nats:join | nats:leave | nats:rolling | nats:node-lost-stream-leader | nats:node-lost-kv-leader | \
    nats:node-lost-non-leader | nats:node-restarted | redis:join | redis:leave | redis:rolling | \
    redis:primary-lost) ;;
*)
    sed -n '9,16p' "$0" >&2
    exit 2
    ;;
esac
# shellcheck source=scripts/bench-servers.sh
source "$(dirname "$0")/bench-servers.sh"
prog=$build/bench/keybus-membership
check="python3 bench/membership.py"
[ -x "$prog" ] || { echo "$me: build $prog first" >&2; exit 1; }
rate=${RATE:-5000} keys=${KEYS:-2000} seconds=${KB_MSHIP_SECONDS:-30} parts=16
topic=ledger.events
export KEYBUS_PARTITIONS=$parts KEYBUS_GROUP=ledger

# mark WHAT: the time of a change, in the run's marks file
mark() { echo "$($prog now) $*" >>"$run/marks"; }

# --- NATS: three nodes; node i's pid in npid[i] ----------------------------
nats_node() {   # I: start node i on its ports and dir (again after a kill)
    (cd "$run/n$1" && exec nats-server -c server.conf -l server.log) &
    npid[$1]=$!
    pids+=($!)
}
# nats_up: the three nodes on free ports, healthy; a port taken meanwhile by
# someone else makes a node fail, and then three fresh ports are tried (3 times)
nats_up() {
    for _ in 1 2 3; do
        nats_try && return 0
        for p in "${npid[@]}"; do
            kill -9 "$p" 2>/dev/null || continue
            wait "$p" 2>/dev/null || true
        done
        rm -rf "$run"/n?
    done
    return 1
}
nats_try() {
    nport=() nhttp=() nroute=() npid=()
    for i in 0 1 2; do nport+=("$(free_port)"); nhttp+=("$(free_port)"); nroute+=("$(free_port)"); done
    for i in 0 1 2; do
        local r=""
        for j in 0 1 2; do [ "$j" = "$i" ] || r+="${r:+, }nats-route://127.0.0.1:${nroute[$j]}"; done
        mkdir -p "$run/n$i"
        cat >"$run/n$i/server.conf" <<EOF
server_name: n$i
listen: 127.0.0.1:${nport[$i]}
http: 127.0.0.1:${nhttp[$i]}
jetstream { store_dir: "$run/n$i/js" }
cluster { name: kbmship, listen: 127.0.0.1:${nroute[$i]}, routes: [ $r ] }
EOF
        nats_node "$i"
    done
    for i in 0 1 2; do nats_healthy "${nhttp[$i]}" || return 1; done
    url="nats://127.0.0.1:${nport[0]},127.0.0.1:${nport[1]},127.0.0.1:${nport[2]}"
    export KEYBUS_NATS_REPLICAS=3
}

# --- Redis: one server, or a primary, a replica and three Sentinels --------
redis_node() {   # NAME PORT [ARGS...]: a redis-server in $run/NAME
    local name=$1 port=$2
    shift 2
    mkdir -p "$run/$name"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$run/$name" --save '' --daemonize no \
        --protected-mode no --logfile server.log "$@" &
    rpid[$name]=$!
    pids+=($!)
    for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.1; done
    echo "$me: redis-server $name on $port did not start" >&2
    return 1
}
redis_up() {
    declare -gA rpid=()
    rprimary=$(free_port)
    redis_node primary "$rprimary" --repl-diskless-sync-delay 0
    url="redis://127.0.0.1:$rprimary"
    [ "$scenario" = primary-lost ] || return 0
    redis_node replica "$(free_port)" --replicaof 127.0.0.1 "$rprimary" --repl-diskless-sync-delay 0
    local s sp list=""
    for s in 0 1 2; do
        sp=$(free_port)
        mkdir -p "$run/s$s"
        : >"$run/s$s/sentinel.conf"
        redis-sentinel "$run/s$s/sentinel.conf" --port "$sp" --bind 127.0.0.1 --dir "$run/s$s" \
            --daemonize no --protected-mode no --logfile server.log \
            --sentinel monitor kbmaster 127.0.0.1 "$rprimary" 2 \
            --sentinel down-after-milliseconds kbmaster 5000 \
            --sentinel failover-timeout kbmaster 60000 &
        pids+=($!)
        list+="${list:+,}127.0.0.1:$sp"
        sports[s]=$sp
    done
    # every Sentinel sees the replica and the two others
    for _ in $(seq 300); do
        local ready=0
        for s in 0 1 2; do
            redis-cli -p "${sports[$s]}" sentinel master kbmaster 2>/dev/null |
                awk 'p == "num-slaves" { s = $1 } p == "num-other-sentinels" { o = $1 } { p = $1 }
                     END { exit !(s >= 1 && o >= 2) }' && ready=$((ready + 1))
        done
        [ "$ready" = 3 ] && break
        sleep 0.1
    done
    url="redis-sentinel://$list/kbmaster"
    export KEYBUS_REDIS_WAIT_REPLICAS=1 KEYBUS_REDIS_WAIT_TIMEOUT_MS=500 KEYBUS_REDIS_RECONNECT_MAX_MS=1000
}

# --- the processes -----------------------------------------------------------
consumer() {   # NAME: start a consumer process; its pid in cpid[NAME]
    "$prog" consume "$url" "$topic" "$1" "$run/$1.log" 2>>"$run/$1.err" &
    cpid[$1]=$!
    for _ in $(seq 300); do grep -q subscribed "$run/$1.err" 2>/dev/null && return 0; sleep 0.1; done
    echo "$me: consumer $1 did not subscribe:" >&2
    tail -3 "$run/$1.err" >&2
    return 1
}
sigterm() {   # NAME: SIGTERM a consumer process and wait for its exit
    kill -TERM "${cpid[$1]}"
    wait "${cpid[$1]}" || echo "$me: consumer $1 exited with $?" >&2
    unset "cpid[$1]"
}

one_run() {   # N
    run=$dir/run$1
    mkdir -p "$run"
    : >"$run/marks"
    declare -gA cpid=()
    if [ "$broker" = nats ]; then nats_up; else redis_up; fi
    consumer c1
    [ "$scenario" = join ] || consumer c2
    sleep 2   # the two share the partitions before the load starts
    "$prog" produce "$url" "$topic" "$rate" "$keys" "$seconds" "$run/summary" 2>"$run/producer.err" &
    local producer=$! poller="" stream victim
    if [ "$broker" = nats ]; then
        stream=$($check stream "$topic")
        $check consumers "$stream" "$run/consumers" "${nhttp[@]}" &
        poller=$!
    fi
    sleep 8
    case "$broker:$scenario" in
    *:join) mark "c2 starts"; consumer c2 ;;
    *:leave) mark "c2 SIGTERM"; sigterm c2 ;;
    *:rolling)
        mark "c1 SIGTERM"; sigterm c1; consumer c1b
        sleep 8
        mark "c2 SIGTERM"; sigterm c2; consumer c2b
        ;;
    nats:node-lost-stream-leader | nats:node-restarted) victim=$($check leader "$stream" "${nhttp[@]}") ;;
    nats:node-lost-kv-leader) victim=$($check leader KV_keybus_leases "${nhttp[@]}") ;;
    nats:node-lost-non-leader) victim=$($check bystander "$stream" "${nhttp[@]}" 2>>"$run/marks.txt") ;;
    redis:primary-lost)
        mark "primary killed -9"
        kill -9 "${rpid[primary]}"
        wait "${rpid[primary]}" 2>/dev/null || true
        sleep 10
        mark "old primary started again"
        redis_node primary "$rprimary" --repl-diskless-sync-delay 0
        ;;
    esac
    if [ -n "${victim:-}" ]; then
        mark "n$victim killed -9"
        kill -9 "${npid[$victim]}"
        wait "${npid[$victim]}" 2>/dev/null || true
        if [ "$scenario" = node-restarted ]; then
            sleep 10
            mark "n$victim started again"
            nats_node "$victim"
        fi
    fi
    wait "$producer" || echo "$me: the producer exited with $? (kb_drain: see $run/summary)" >&2
    sleep 1
    for c in "${!cpid[@]}"; do sigterm "$c"; done
    [ -z "$poller" ] || { kill "$poller"; wait "$poller" 2>/dev/null || true; }
    local logs=("$run"/c*.log)
    echo "run $1 ($broker $scenario):"
    [ ! -s "$run/marks.txt" ] || sed 's/^/  /' "$run/marks.txt"
    $check check "$run/result" "$parts" "$run/summary" "$run/marks" \
        ${poller:+"$run/consumers"} -- "${logs[@]}"
    # what the library logged from the change on (but its lease-by-lease debug lines)
    sort -n "$run"/*.err | awk -v t="$(head -c 20 "$run/marks" | cut -d' ' -f1)" '$1 >= t - 1' |
        grep -v ' L7 ' | head -25 | cut -c1-300 | sed 's/^/  log: /' || true
    cp "$run/result" "$dir/result$1"
    # the run's servers, by PID
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
    pids=()
    if [ -n "${KB_MSHIP_KEEP:-}" ]; then   # the logs, not the servers' stores
        rm -rf "$run"/n?/js "$run"/primary/*.rdb
        mkdir -p "$KB_MSHIP_KEEP" && cp -r "$run" "$KB_MSHIP_KEEP/$broker-$scenario-$(date +%H%M%S)-run$1"
    fi
    rm -rf "$run"
}

for n in $(seq "$runs"); do one_run "$n"; done
echo
echo "| what changed | runs | longest partition pause, s (median / worst) | kb_drain after the last publish, s | last handled after it, s | lost | order violations | duplicates (worst run) | consumers created / owner changes per run |"
echo "|---|--:|--:|--:|--:|--:|--:|--:|---|"
$check row "$broker: $scenario" "$dir"/result*
echo
echo "bash scripts/bench-membership.sh $broker $scenario $runs; $rate events/s over $keys keys for ${seconds} s, $parts partitions, the change at 8 s; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
