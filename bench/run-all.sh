#!/bin/sh
# Regenerate docs/benchmarks.md and docs/img/*.png: build (Release), run every
# benchmark, plot. Bounded: each step has a timeout; the whole takes 10-30 min
# (the broker runs are five alternating repeats each).
# usage: bench/run-all.sh [BUILD_DIR]   (default: build-bench)
# env: THREADS=N passes --threads N; CMAKE_ARGS adds configure options
#      (e.g. "-DKEYBUS_WITH_REDIS=OFF -DKEYBUS_WITH_NATS=OFF" without hiredis/nats.c).
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-bench}
res=$build/bench-results
doc=$src/docs/benchmarks.md
img=$src/docs/img
threads=${THREADS:-}

for tool in cmake jq gnuplot; do
    command -v $tool >/dev/null || { echo "run-all.sh: $tool is required" >&2; exit 2; }
done
# shellcheck disable=SC2086 # CMAKE_ARGS is a list of options
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKEYBUS_BUILD_BENCH=ON ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$(nproc)" --target keybus-bench keybus-gbench >/dev/null
bench=$build/bench/keybus-bench
gbench=$build/bench/keybus-gbench
rm -rf "$res"
mkdir -p "$res" "$img"
load=$(cut -d' ' -f1-3 /proc/loadavg)

run() {   # name, then keybus-bench arguments; the table goes to $res/name.txt
    name=$1
    shift
    echo "run-all.sh: keybus-bench $*" >&2
    timeout 900 "$bench" --json "$res/results.jsonl" "$@" >"$res/$name.txt" || {
        echo "run-all.sh: keybus-bench $* failed (exit $?), see $res/$name.txt" >&2
        status=1
    }
}
status=0
brun() {   # name, JSON lines file, environment ("" or VAR=value), then keybus-bench arguments
    name=$1 json=$2 envs=$3
    shift 3
    echo "run-all.sh: $envs keybus-bench $*" >&2
    # shellcheck disable=SC2086 # envs is one assignment or nothing
    timeout 900 env $envs "$bench" "$@" --json "$json" >"$res/$name.txt" || {
        echo "run-all.sh: keybus-bench $* failed (exit $?), see $res/$name.txt" >&2
        status=1
    }
}
# Latency at everyday load on a broker: the raw client and keybus back to back, five times,
# each paced by --rate from producers that sleep to their send times (spinning, the producer
# would hold one of the two CPUs the server and the consumers need); 10 s at 1k/s.
LJ=$res/broker-latency.jsonl
lat_load=""
broker_latency() {   # broker (redis | nats), URL
    lat_load="$lat_load${lat_load:+; }$1 from $(cut -d' ' -f1-3 /proc/loadavg)"
    for point in 1000:10000 10000:50000 50000:200000; do   # rate:events, 10 s .. 4 s a run
        rate=${point%:*}
        brun "$1-latency-$rate" "$LJ" "" --transport "$2" --scenario multi --events "${point#*:}" \
            --rate "$rate" --pace sleep --baselines=broker --repeat 5 --cdf "$res/cdf-$1-$rate.dat"
    done
}
# The targets are quoted as the median of five same-run ratios: one run on a
# shared 2-vCPU machine can be off by 2x either way.
run scenarios --scenario all --repeat 5 ${threads:+--threads "$threads"}
run batch --scenario all --events 1000000 --batch 64 --repeat 5 ${threads:+--threads "$threads"}
run sweep-events --sweep events ${threads:+--threads "$threads"}
run sweep-threads --sweep threads
run latency-500k --scenario multi --events 1000000 --rate 500000 --repeat 5 ${threads:+--threads "$threads"}
run latency --scenario multi --events 1000000 --rate 1000000 --repeat 5 --cdf "$res/cdf.dat" ${threads:+--threads "$threads"}
# The realistic tail: 2 producers, a 2 µs handler, offered at half of that
# scenario's flat-out rate (keybus's median over three runs).
run tail-flat --scenario multi --events 500000 --producers 2 --handler-us 2 --repeat 3 ${threads:+--threads "$threads"}
tail_rate=$(jq -rs '[.[] | select(.handler_us == 2 and .rate == 0 and .transport == "mem://") | .events_per_s] | sort | if length == 0 then 100000 else .[length / 2 | floor] / 2 | floor end' "$res/results.jsonl")
run tail --scenario multi --events 500000 --producers 2 --handler-us 2 --rate "$tail_rate" --repeat 5 ${threads:+--threads "$threads"}
# The same with producers that sleep to their send times: spinning, they and the executor are
# three busy threads on two CPUs (bench/profiles.md).
TJ=$res/tail-sleep.jsonl
brun tail-sleep "$TJ" "" --scenario multi --events 500000 --producers 2 --handler-us 2 --rate "$tail_rate" --pace sleep --repeat 5 ${threads:+--threads "$threads"}
# Failing handlers: one event in 1000 asks for one retry, 100 ms later; 10,000 aggregates, so
# each lane is shared by about ten. keybus runs once per retry.scope.
( export KEYBUS_RETRY_BACKOFF_MS=100
  run handler-fails --scenario multi --aggregates 10000 --events 1000000 --handler-fail-rate 0.001 --repeat 3 ${threads:+--threads "$threads"}
  run handler-fails-rate --scenario multi --aggregates 10000 --events 300000 --rate 100000 --handler-fail-rate 0.001 --repeat 3 --no-baselines ${threads:+--threads "$threads"}
  exit $status ) || status=1
for idle in adaptive spin yield block; do   # the wait strategies: speed, latency, idle CPU
    run "idle-$idle" --scenario multi --events 1000000 --idle "$idle" --idle-cpu --no-baselines
    run "idle-rate-$idle" --scenario multi --events 200000 --rate 100000 --idle "$idle" --no-baselines
done
echo "run-all.sh: keybus-gbench" >&2
timeout 240 "$gbench" --benchmark_min_time=0.2 --benchmark_color=false \
    --benchmark_out="$res/gbench.json" --benchmark_out_format=json >"$res/gbench.txt" 2>&1 || status=1

# --- The origin's pool rebuilt in Go (bench/origin_go): only when go exists -----
# keybus and the Go pool alternately, five times per scenario; each ratio is taken
# within its pair.
GJ=$res/origin-go.jsonl
go_note="not run: go not found"
if command -v go >/dev/null 2>&1 &&
   (cd "$src/bench/origin_go" && go build -o "$build/origin-go" .) >/dev/null 2>&1; then
    go_note="$(go version | cut -d' ' -f3), GOMAXPROCS = $(nproc), load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
    echo "run-all.sh: mem:// against bench/origin_go, 5 alternating runs per scenario" >&2
    for i in 1 2 3 4 5; do
        for s in single multi mixed; do
            timeout 300 "$bench" --scenario "$s" --events 1000000 --no-baselines --json "$GJ" >/dev/null || status=1
            timeout 300 "$build/origin-go" -scenario "$s" -events 1000000 >>"$GJ" || status=1
        done
    done
fi

# --- Redis Streams: only when redis-server exists; own server, stopped by PID --
RJ=$res/redis.jsonl
RJB=$res/redis-batch.jsonl
redis_note="not run: redis-server not found"
redis_mp=""
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 &&
   cmake --build "$build" -j"$(nproc)" --target redis_consumer_proc >/dev/null 2>&1; then
    rdir=$(mktemp -d /tmp/kb-bench-redis.XXXXXX)
    rport=""
    for try in 1 2 3 4 5 6 7 8; do   # a free loopback port: nothing answers there yet
        p=$(( 20000 + ($$ * 31 + try * 7919) % 40000 ))
        redis-cli -p $p ping >/dev/null 2>&1 && continue
        redis-server --port $p --bind 127.0.0.1 --save "" --appendonly no --dir "$rdir" \
            --daemonize yes --pidfile "$rdir/redis.pid" --logfile "$rdir/redis.log" >/dev/null 2>&1 || continue
        for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
            redis-cli -p $p ping >/dev/null 2>&1 && break
            sleep 0.1
        done
        if redis-cli -p $p ping >/dev/null 2>&1 && [ -s "$rdir/redis.pid" ]; then rport=$p; break; fi
    done
    stop_redis() {
        [ -s "$rdir/redis.pid" ] && kill "$(cat "$rdir/redis.pid")" 2>/dev/null
        sleep 0.3
        rm -rf "$rdir"
    }
    if [ -n "$rport" ]; then
        trap stop_redis EXIT INT TERM
        rurl=redis://127.0.0.1:$rport
        redis_note="redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), loopback, no persistence"
        # default (kb_publish_to per event), then batched: 5 alternating runs each
        # (raw, xadd and keybus back to back), medians in the summary
        brun redis-scenarios "$RJ" "" --transport "$rurl" --scenario all --large-events 200000 --repeat 5
        brun redis-batch "$RJB" "" --transport "$rurl" --scenario all --events 200000 --batch 64 --repeat 5
        broker_latency redis "$rurl"
        redis-cli -p "$rport" flushall >/dev/null
        # 1M events (100 keys x 10k), one producer process, two consumer processes
        # (tests/redis_consumer_proc: 8 partitions shared by lease, each handled
        # event appended as a line to one O_APPEND log), order checked on the log.
        cons=$build/tests/redis_consumer_proc
        topic=kbbench.mp.$$
        log=$rdir/handled.log
        "$cons" "$rurl" "$topic" mp-a "$log" 10000 0 & pa=$!
        "$cons" "$rurl" "$topic" mp-b "$log" 10000 0 & pb=$!
        owners=0
        for i in $(seq 100); do   # both processes hold leases
            owners=$(for n in 0 1 2 3 4 5 6 7; do redis-cli -p "$rport" get "kb:{$topic}:lease:$n"; done |
                     cut -d'#' -f1 | grep -c . | tr -d ' ')
            [ "$owners" = 8 ] && [ "$(for n in 0 1 2 3 4 5 6 7; do redis-cli -p "$rport" get "kb:{$topic}:lease:$n"; done | cut -d'#' -f1 | sort -u | grep -c .)" = 2 ] && break
            sleep 0.1
        done
        t0=$(date +%s.%N)
        timeout 120 "$cons" --produce "$rurl" "$topic" 100 10000 || status=1
        tp=$(date +%s.%N)
        n=0
        for i in $(seq 1200); do
            n=$(wc -l <"$log" 2>/dev/null || echo 0)
            [ "$n" -ge 1000000 ] && break
            sleep 0.1
        done
        t1=$(date +%s.%N)
        kill -TERM $pa $pb 2>/dev/null
        wait $pa $pb 2>/dev/null || true
        check=$(awk '{ k = $1; s = $2; if (s == last[k] + 1) last[k] = s; else if (s <= last[k]) dup++; else bad++; by[$3]++ }
                     END { for (k in last) d += last[k]; printf "%d %d %d %d %d", d, bad, dup, by["mp-a"], by["mp-b"] }' "$log")
        redis_mp=$(echo "$t0 $tp $t1 $check" | awk '{ printf "| 1,000,000 | 2 | %.2f | %.0f | %.0f | %d/%d/%d | %d / %d |", $3 - $1, 1e6 / ($2 - $1), $4 / ($3 - $1), $4, $5, $6, $7, $8 }')
        [ "$(echo "$check" | cut -d' ' -f1-3)" = "1000000 0 0" ] || status=1
    fi
    stop_redis
    trap - EXIT INT TERM
fi

# --- NATS JetStream: only when nats-server exists; own server, stopped by PID --
NJ=$res/nats.jsonl
NJP=$res/nats-plain.jsonl
NJB=$res/nats-batch.jsonl
nats_note="not run: nats-server not found"
if command -v nats-server >/dev/null 2>&1; then
    ndir=$(mktemp -d /tmp/kb-bench-nats.XXXXXX)
    nport=$(( 20000 + ($$ * 37 + 4242) % 40000 ))
    nats-server -js -a 127.0.0.1 -p "$nport" -sd "$ndir" -l "$ndir/nats.log" &
    npid=$!
    stop_nats() {
        kill "$npid" 2>/dev/null || true
        wait "$npid" 2>/dev/null || true   # the server exits by SIGTERM
        rm -rf "$ndir"
    }
    trap stop_nats EXIT INT TERM
    for i in $(seq 1 50); do
        grep -q "Server is ready" "$ndir/nats.log" 2>/dev/null && break
        sleep 0.1
    done
    nats_note="nats-server $(nats-server --version | sed 's/.*v//'), loopback, file storage"
    nurl=nats://127.0.0.1:$nport
    # default (frames), per-message (frames off: one JetStream message per
    # event) and batched: 5 alternating runs each (raw and keybus back to back)
    brun nats-scenarios "$NJ" "" --transport "$nurl" --scenario all --large-events 200000 --repeat 5
    brun nats-plain "$NJP" KEYBUS_NATS_PUBLISH_BATCH=1 --transport "$nurl" --scenario all \
        --large-events 0 --repeat 5
    brun nats-batch "$NJB" "" --transport "$nurl" --scenario all --events 200000 --batch 64 --repeat 5
    broker_latency nats "$nurl"
    stop_nats
    trap - EXIT INT TERM
fi

# --- Broker edges: many topics per bus, restarts with a stable consumer name --
# The tests print their figures; each starts its own server and stops it by PID.
edges=$res/edges.txt
: >"$edges"
if cmake --build "$build" -j"$(nproc)" --target test_redis_topics test_nats_topics \
       test_nats_restart nats_consumer_proc >/dev/null 2>&1; then
    echo "run-all.sh: broker edges (1,000 topics; NATS restarts)" >&2
    timeout 240 "$build/tests/test_redis_topics" 2>&1 | grep -E "^redis, [0-9]+ topics" >>"$edges" || status=1
    KB_TEST_TOPICS=1000 timeout 300 "$build/tests/test_nats_topics" 2>&1 |
        grep -E "[0-9]+ topics: subscribed" >>"$edges" || status=1
    KB_TEST_RESTART_PATTERN=issue timeout 300 "$build/tests/test_nats_restart" \
        "$build/tests/nats_consumer_proc" 2>&1 | grep -E "[0-9]+ restarts:" >>"$edges" || status=1
fi

"$src/bench/plot.sh" "$res" "$img"

# --- docs/benchmarks.md -------------------------------------------------------
J=$res/results.jsonl
table() {   # jq filter selecting rows [, JSON lines file]
    echo "| scenario | kind | transport | events | aggs | prd | thr | batch | seconds | events/s | CPU ns/event | p50 µs | p99 µs | p99.9 µs | peak RSS MiB | order/lost/dup | × origin | × ring | × mutex | × raw |"
    echo "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|--:|"
    jq -r "select($1) | \"| \(.scenario) | \(.kind) | \(.transport) | \(.events) | \(.aggregates) | \(.producers) | \(.threads) | \(.batch // 1) | \(.seconds * 10000 | round / 10000) | \(.events_per_s | round) | \(.cpu_ns_per_event // 0 | round) | \(.p50_us * 100 | round / 100) | \(.p99_us * 100 | round / 100) | \(.p999_us * 100 | round / 100) | \(.rss_bytes / 104857.6 | round / 10) | \(.order_violations)/\(.lost)/\(.duplicates) | \(.ratio_origin * 10 | round / 10) | \(if .ratio_ring then (.ratio_ring * 100 | round / 100) else \"\" end) | \(if .ratio_mutex then (.ratio_mutex * 100 | round / 100) else \"\" end) | \(if .ratio_raw then (.ratio_raw * 100 | round / 100) else \"\" end) |\"" "${2:-$J}"
}
pick() {   # jq filter -> one value
    jq -rs "map(select($1)) | .[0] | $2 // \"n/a\"" "$J"
}
e100k=$(pick '.kind == "sweep-events" and .events == 100000 and .transport == "mem://"' '.events_per_s | round')
e10m=$(pick '.kind == "sweep-events" and .events == 10000000 and .transport == "mem://"' '.events_per_s | round')
r100k=$(pick '.kind == "sweep-events" and .events == 100000 and .transport == "mem://"' '.rss_bytes / 104857.6 | round / 10')
r10m=$(pick '.kind == "sweep-events" and .events == 10000000 and .transport == "mem://"' '.rss_bytes / 104857.6 | round / 10')
scale=$(jq -rn --arg a "$e100k" --arg b "$e10m" '($b | tonumber? // 0) / ($a | tonumber? // 1) * 100 | round | tostring + "%"' 2>/dev/null || echo n/a)
used_threads=$(pick '.kind == "origin" and .transport == "mem://"' '.threads')
ratio_of() {   # scenario kind batch -> median ratio_ring of the mem:// rows
    jq -rs --arg s "$1" --arg k "$2" --argjson b "$3" '[.[] | select(.scenario == $s and .kind == $k and .batch == $b and .transport == "mem://" and .ratio_ring) | .ratio_ring] | sort | if length == 0 then "n/a" else .[length / 2 | floor] * 100 | round / 100 | tostring end' "$J"
}
met() {   # value target -> yes / no
    jq -rn --arg v "$1" --argjson t "$2" 'if ($v | tonumber? // -1) >= $t then "yes" else "no" end'
}
median() {   # jq row filter, field [, file] -> median over the rows, 2 decimals
    jq -rs "[.[] | select($1) | $2 | select(. != null)] | sort | if length == 0 then \"n/a\" else (if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end) * 100 | round / 100 end" "${3:-$J}"
}
vs_ring() {   # jq row filter, field -> median over the runs of mem://'s field / baseline:ring's in the same run
    jq -rs "[.[] | select($1)] as \$r | [range(0; \$r | length) | select(\$r[.].transport == \"mem://\") as \$i | \$r[\$i] as \$m | ([\$r[0:\$i][] | select(.transport == \"baseline:ring\")] | last) as \$g | select(\$g and \$g.$2 > 0) | \$m.$2 / \$g.$2] | sort | if length == 0 then \"n/a\" else (if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end) * 100 | round / 100 end" "$J"
}
atmost() {   # value target -> yes / no
    jq -rn --arg v "$1" --argjson t "$2" 'if ($v | tonumber? // 1e18) <= $t then "yes" else "no" end'
}
brokers() {   # mode, JSON lines file, keybus URL prefix, raw baseline -> summary rows (medians)
    [ -s "$2" ] || { echo "| $1 | not run | | | | | | | | | |"; return; }
    jq -rs --arg mode "$1" --arg k "$3" --arg raw "$4" '
      def med: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
               else (.[length / 2 - 1] + .[length / 2]) / 2 end;
      def r2: if . == null then "" else (. * 100 | round / 100 | tostring) end;
      def n0: if . == null then "" else (round | tostring) end;
      group_by([.scenario, .events])[] | (map(select(.transport | startswith($k)))) as $kb
      | select($kb | length > 0)
      | ($kb | map(.events_per_s) | med) as $m
      | "| \($mode) | \(.[0].scenario) | \(.[0].events) | \($kb | length) "
        + "| \(map(select(.transport == $raw) | .events_per_s) | med | n0) "
        + "| \(map(select(.transport == "baseline:redis-xadd") | .events_per_s) | med | n0) "
        + "| \($m | n0) | \($kb | map(.events_per_s / $m) | min | r2)-\($kb | map(.events_per_s / $m) | max | r2) "
        + "| \($kb | map(.ratio_raw // empty) | med | r2) | \($kb | map(.ratio_xadd // empty) | med | r2) "
        + "| \($kb | map(select(.order_violations + .lost + .duplicates > 0)) | length) |"' "$2"
}
go_rows() {   # -> rows: medians per scenario, mem:// over the Go run right after it
    [ -s "$GJ" ] || { echo "| $go_note | | | | | |"; return; }
    jq -rs '
      def med: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
               else (.[length / 2 - 1] + .[length / 2]) / 2 end;
      def r2: if . == null then "" else (. * 100 | round / 100 | tostring) end;
      def n0: if . == null then "" else (round | tostring) end;
      . as $all | [range(0; length) | select($all[.].transport == "mem://") as $i | $all[$i] as $k
        | ([$all[$i + 1:][] | select(.transport == "baseline:origin-go" and .scenario == $k.scenario)] | first) as $g
        | select($g) | {s: $k.scenario, k: $k, g: $g}] | group_by(.s)[]
      | "| \(.[0].s) | \(length) | \(map(.k.events_per_s) | med | n0) | \(map(.g.events_per_s) | med | n0) "
        + "| \(map(.k.events_per_s / .g.events_per_s) | med | r2) (\(map(.k.events_per_s / .g.events_per_s) | min | r2)-\(map(.k.events_per_s / .g.events_per_s) | max | r2)) "
        + "| \(map(.k.cpu_ns_per_event) | med | n0) / \(map(.g.cpu_ns_per_event) | med | n0) "
        + "| \(map(select(.k.order_violations + .k.lost + .k.duplicates + .g.order_violations > 0)) | length) |"' "$GJ"
}
latency_rows() {   # broker URL prefix, raw baseline -> rows: medians, and keybus over the raw run just before it
    [ -s "$LJ" ] || { echo "| $1 | not run | | | | | | | | | |"; return; }
    jq -rs --arg k "$1" --arg raw "$2" '
      def med: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
               else (.[length / 2 - 1] + .[length / 2]) / 2 end;
      def r2: if . == null then "" else (. * 100 | round / 100 | tostring) end;
      def n0: if . == null then "" else (round | tostring) end;
      . as $all | [range(0; length) | select($all[.].transport | startswith($k)) as $i
        | $all[$i] as $b | ([$all[0:$i][] | select(.transport == $raw and .rate == $b.rate)] | last) as $r
        | select($r) | {rate: $b.rate, b: $b, r: $r}] | group_by(.rate)[]
      | "| \($k | rtrimstr("://")) | \(.[0].rate) | \(length) "
        + "| \(map(.r.p50_us) | med | r2) | \(map(.r.p99_us) | med | r2) "
        + "| \(map(.b.p50_us) | med | r2) | \(map(.b.p99_us) | med | r2) "
        + "| \(map(.b.p50_us / .r.p50_us) | med | r2) | \(map(.b.p99_us / .r.p99_us) | med | r2) "
        + "| \(map(.r.cpu_ns_per_event / 1000) | med | n0) / \(map(.b.cpu_ns_per_event / 1000) | med | n0) "
        + "| \(map(select(.b.order_violations + .b.lost + .b.duplicates + .r.order_violations + .r.lost + .r.duplicates > 0)) | length) |"' "$LJ"
}
r500='.kind == "fixed-rate" and .rate == 500000 and .handler_us == 0'
r1m='.kind == "fixed-rate" and .rate == 1000000 and .handler_us == 0'
flat_multi='.kind == "large" and .scenario == "multi"'
idle_adaptive=$(median '.idle == "adaptive" and .idle_cpu_pct != null' .idle_cpu_pct)
mutex_sweep=$(jq -rs '[.[] | select(.kind == "sweep-threads" and .transport == "mem://") | "\(.threads): \(.ratio_mutex * 100 | round / 100)"] | join(", ")' "$J")
mutex_min=$(jq -rs '[.[] | select(.kind == "sweep-threads" and .transport == "mem://") | .ratio_mutex] | min // "n/a"' "$J")
allocs=$(jq -r '[.benchmarks[] | select(.name | startswith("BM_publish_to")) | "\(.name | sub("BM_publish_to/payload_bytes:"; "") | sub("/real_time"; "")) B: \(.allocs_per_publish * 10000 | round / 10000) allocations, \(.bytes_per_publish * 100 | round / 100) B per publish (\(.real_time | round) ns)"] | join("; ")' "$res/gbench.json" 2>/dev/null || echo n/a)
allocs_max=$(jq -r '[.benchmarks[] | select(.name | startswith("BM_publish_to")) | .allocs_per_publish] | max // "n/a"' "$res/gbench.json" 2>/dev/null || echo n/a)

{
cat <<MD
# keybus benchmarks

Generated by \`bench/run-all.sh\` on $(date -u +%Y-%m-%d) — do not edit by hand; change the
script and rerun it. Every number below comes from the same invocation. Before/after
comparisons of changes that should not move speed: [benchmarks-history.md](benchmarks-history.md).

## Machine

- $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
- Linux $(uname -r), $(cc --version | head -1)
- load average when the run started: $load (a shared machine is noisy: compare ratios
  measured in the same run rather than absolute numbers across runs)
- pool.threads: ${threads:-library default = online CPUs less one for the publisher ($used_threads)}; pool.idle adaptive; 1 producer thread; 64-byte payloads

## Commands

\`\`\`sh
bench/run-all.sh                      # all of the below, then this page and docs/img/*.png
keybus-bench --scenario all --repeat 5     # origin sizes + 1M-event runs, with baselines, 5 times
keybus-bench --scenario all --events 1000000 --batch 64 --repeat 5   # through kb_publish_batch
keybus-bench --scenario multi --events 1000000 --idle S --idle-cpu   # each pool.idle strategy
keybus-bench --sweep events           # multi, 10k .. 10M events
keybus-bench --sweep threads          # multi, 1M events, 1 .. 2×CPUs executors
keybus-bench --scenario multi --events 1000000 --rate 500000 --repeat 5            # latency at 500k/s
keybus-bench --scenario multi --events 1000000 --rate 1000000 --repeat 5 --cdf cdf.dat   # latency at 1M/s
keybus-bench --scenario multi --events 500000 --producers 2 --handler-us 2 --rate R   # the realistic tail
keybus-bench --scenario multi --events 500000 --producers 2 --handler-us 2 --rate R --pace sleep
KEYBUS_RETRY_BACKOFF_MS=100 keybus-bench --scenario multi --aggregates 10000 --events 1000000 --handler-fail-rate 0.001 --repeat 3   # failing handlers, per retry.scope
KEYBUS_RETRY_BACKOFF_MS=100 keybus-bench --scenario multi --aggregates 10000 --events 300000 --rate 100000 --handler-fail-rate 0.001 --repeat 3 --no-baselines
keybus-gbench                         # google-benchmark micro-benchmarks
keybus-bench --transport redis://localhost:6379 --scenario all   # any transport, same scenarios
keybus-bench --transport URL --scenario multi --events 10000 --rate 1000 --pace sleep --baselines=broker --repeat 5   # broker latency (also 10k/s, 50k/s)
(cd bench/origin_go && go build -o /tmp/origin-go .) && /tmp/origin-go -scenario single -events 1000000   # the origin's pool in Go
\`\`\`

## How it measures

- Scenarios are the origin's (seed 001, NATS JetStream + keyed worker pool): **single** = 1
  aggregate, 10,000 events (origin: 2.13 s, 4,695 events/s); **multi** = 100 aggregates, 50,000
  events (3.61 s, 13,850 events/s); **mixed** = 3 aggregates (\`order-\`, \`user-\`,
  \`product-sku-\` keys), 60 events, interleaved in a shuffled order. The origin lists the mixed
  case at 16.6 events/s (60 events in 3.61 s); we compare it with the stricter 13,850 events/s.
  At these sizes an in-memory bus finishes in well under a millisecond, so each scenario also
  runs at 1,000,000 events (kind \`large\`).
- Each payload carries its aggregate, a sequence number and a CLOCK_MONOTONIC publish
  timestamp. Every run counts per-aggregate order violations (an event handled after a later
  one of its aggregate), losses and duplicates; keybus-bench exits non-zero on any.
- **seconds** run from the first publish to the last handled event; **events/s** is distinct
  events handled over that time. Latency is publish-to-handle, in an HDR-style log-linear
  histogram (<0.8% bucket error). Flat-out runs measure queueing as much as the bus — their
  latency is that of a saturated queue; the fixed-rate run is the latency figure. Under
  \`--rate\` the latency starts at the scheduled send time, so a producer that falls behind
  shows up as latency (no coordinated omission).
- **peak RSS** is per run (VmHWM reset through /proc/self/clear_refs after malloc_trim).
- **Baselines**, run on the same scenario just before keybus: \`baseline:ring\` — one producer
  hashing each key with FNV-1a into 1024 raw SPSC \`ck_ring\`s (256 slots), one consumer
  sweeping them: the in-process limit. \`baseline:mutex\` — a naive keyed pool, one
  mutex + two condvars per worker, a \`malloc\`'d copy per event, as many workers as keybus has
  executors. Both pay the same per-event checking and timestamping as keybus.
  **× ring** / **× mutex** are keybus's events/s over theirs; **× origin** is over the origin's figure.
- **CPU ns/event** is the process's user + system CPU time (\`getrusage\`) from the first
  publish to the last handled event, over the events handled: every thread, spinning ones
  included. On a shared machine it moves less than speed does.

## Results: scenarios

$(table '.kind == "origin" or .kind == "large"')

## Results: batch publishing (\`--batch 64\`)

$(table '.kind == "custom" and .batch == 64 or (.kind == "custom" and .rate == 0 and .transport != "mem://" and .events == 1000000 and (.idle // "") == "")')

## Targets of the hot path

Each figure is the median of five same-run figures (\`--repeat 5\`: the baselines and keybus run
back to back, five times; ratios are taken within a run, then the median). \`kb_publish_to\` is
one call per event through a topic handle; \`--batch 64\` publishes through \`kb_publish_batch\`,
64 events per call (the baselines always publish one by one). CPU per event is the process's
user + system time from the first publish to the last handled event (\`getrusage\`), over the
events: every thread counts, spinning ones included, so it is the cost of the whole run.

| target | measured | met | command |
|---|---|:-:|---|
| \`--rate 500000\`, multi: p99 ≤ 1.0 × baseline:ring's p99 | $(vs_ring "$r500" p99_us) × ($(median "$r500 and .transport == \"mem://\"" .p99_us) µs) | $(atmost "$(vs_ring "$r500" p99_us)" 1.0) | \`keybus-bench --scenario multi --events 1000000 --rate 500000 --repeat 5\` |
| \`--rate 500000\`, multi: p50 ≤ 5 µs | $(median "$r500 and .transport == \"mem://\"" .p50_us) µs | $(atmost "$(median "$r500 and .transport == \"mem://\"" .p50_us)" 5) | the same |
| \`--rate 1000000\`, multi: p99 ≤ 1.0 × baseline:ring's p99 | $(vs_ring "$r1m" p99_us) × ($(median "$r1m and .transport == \"mem://\"" .p99_us) µs) | $(atmost "$(vs_ring "$r1m" p99_us)" 1.0) | \`keybus-bench --scenario multi --events 1000000 --rate 1000000 --repeat 5\` |
| \`--rate 1000000\`, multi: p50 ≤ 5 µs | $(median "$r1m and .transport == \"mem://\"" .p50_us) µs | $(atmost "$(median "$r1m and .transport == \"mem://\"" .p50_us)" 5) | the same |
| flat out, multi: p99 ≤ 100 µs | $(median "$flat_multi and .transport == \"mem://\"" .p99_us) µs | $(atmost "$(median "$flat_multi and .transport == \"mem://\"" .p99_us)" 100) | \`keybus-bench --scenario all --repeat 5\` |
| multi, 100 aggregates: ≥ 0.8 × baseline:ring | $(ratio_of multi large 1) | $(met "$(ratio_of multi large 1)" 0.8) | the same |
| mixed, 3 aggregates: ≥ 0.8 × baseline:ring | $(ratio_of mixed large 1) | $(met "$(ratio_of mixed large 1)" 0.8) | the same |
| single aggregate: ≥ 1.0 × baseline:ring | $(ratio_of single large 1) | $(met "$(ratio_of single large 1)" 1.0) | the same |
| multi: ≥ 1.0 × baseline:ring with \`--batch 64\` | $(ratio_of multi custom 64) | $(met "$(ratio_of multi custom 64)" 1.0) | \`keybus-bench --scenario all --events 1000000 --batch 64 --repeat 5\` |
| single: ≥ 1.0 × baseline:ring with \`--batch 64\` | $(ratio_of single custom 64) | $(met "$(ratio_of single custom 64)" 1.0) | the same |
| multi: CPU per event ≤ 1.5 × baseline:ring's | $(vs_ring "$flat_multi" cpu_ns_per_event) × ($(median "$flat_multi and .transport == \"mem://\"" .cpu_ns_per_event) vs $(median "$flat_multi and .transport == \"baseline:ring\"" .cpu_ns_per_event) ns) | $(atmost "$(vs_ring "$flat_multi" cpu_ns_per_event)" 1.5) | \`keybus-bench --scenario all --repeat 5\` |
| idle: adaptive burns ≤ 1 % of a CPU over a quiet second | $idle_adaptive % | $(atmost "$idle_adaptive" 1) | \`keybus-bench --scenario multi --events 1000000 --idle adaptive --idle-cpu\` |
| ≥ 2 × baseline:mutex at every \`--threads\` value of the sweep | $mutex_sweep | $(met "$mutex_min" 2.0) | \`keybus-bench --sweep threads\` |
| 0 heap allocations per publish in steady state, payloads ≤ 256 B (origin: 11 allocations, 601 B) | $allocs | $(jq -rn --arg a "$allocs_max" 'if ($a | tonumber? // 1) < 0.01 then "yes" else "no" end') | \`keybus-gbench --benchmark_filter=publish_to\` |
| every run: 0 order violations / 0 lost / 0 duplicates | $(jq -rs 'map(select(.order_violations + .lost + .duplicates > 0)) | length' "$J") runs with any | $(jq -rs 'if map(select(.order_violations + .lost + .duplicates > 0)) | length == 0 then "yes" else "no" end' "$J") | all of the above |
| 10M events within 10% of the throughput at 100k, memory flat | $e10m vs $e100k events/s ($scale); RSS $r10m vs $r100k MiB | $(jq -rn --arg s "$scale" '($s | rtrimstr("%") | tonumber? // 0) >= 90 | if . then "throughput yes" else "throughput no" end'); $(jq -rn --arg a "$r100k" --arg b "$r10m" '($b | tonumber? // 1e9) <= ($a | tonumber? // 0) * 1.1 + 1.2 | if . then "memory yes" else "memory no" end') | \`keybus-bench --sweep events\` |

"Memory flat" allows 10% plus the collector's duplicate bitmap (one bit per event: 1.2 MiB at
10M), which the RSS includes. Allocations per publish count every \`malloc\`-family call of
the process (executors included) over the timed loop, after 1,000,000 publishes of warm-up (enough to fill the lanes), through a
malloc hook in \`keybus-gbench\`. Where a target is missed, [What the profiles
say](#what-the-profiles-say) shows why.

### The realistic tail

Two producer threads (\`baseline:ring\` has one by definition), a handler that busy-waits 2 µs
per event, offered at half of keybus's flat-out rate for the same settings ($tail_rate events/s;
medians of five runs):

| transport | p50 µs | p99 µs | p99.9 µs | CPU ns/event |
|---|--:|--:|--:|--:|
$(for tr in mem:// baseline:ring baseline:mutex; do f=".handler_us == 2 and .rate > 0 and .pace != \"sleep\" and .transport == \"$tr\""; echo "| $tr | $(median "$f" .p50_us) | $(median "$f" .p99_us) | $(median "$f" .p999_us) | $(median "$f" .cpu_ns_per_event) |"; done)

\`keybus-bench --scenario multi --events 500000 --producers 2 --handler-us 2 --repeat 3\` (flat out),
then the same with \`--rate $tail_rate --repeat 5\`. Those producers spin to their send times,
so mem:// has three busy threads (two producers, one executor) on two CPUs where the ring has
two ([What the profiles say](#what-the-profiles-say)); the same offered load from producers that
sleep to their send times (\`--pace sleep\`; medians of five runs):

| transport | p50 µs | p99 µs | p99.9 µs | CPU ns/event |
|---|--:|--:|--:|--:|
$(for tr in mem:// baseline:ring baseline:mutex; do f=".transport == \"$tr\""; echo "| $tr | $(median "$f" .p50_us "$TJ") | $(median "$f" .p99_us "$TJ") | $(median "$f" .p999_us "$TJ") | $(median "$f" .cpu_ns_per_event "$TJ") |"; done)

### What the profiles say

$(cat "$src/bench/profiles.md")

## Idle strategies

\`pool.idle\` decides what executors do with empty lanes and publishers with full ones (see
[threading](threading.md)). Throughput is multi, 1M events flat out; latency is multi at a fixed
100,000 events/s (200,000 events); idle CPU is the process's CPU time over a quiet second right
after the flat-out run (\`getrusage\`), in % of one CPU.

| pool.idle | executors | events/s (flat out) | p50 µs at 100k/s | p99 µs at 100k/s | idle CPU % |
|---|--:|--:|--:|--:|--:|
$(for i in adaptive spin yield block; do jq -rs --arg i "$i" '(map(select(.idle == $i and .idle_cpu_pct != null))[0]) as $f | (map(select(.idle == $i and .rate == 100000))[0]) as $r | select($f and $r) | "| \($i) | \($f.threads) | \($f.events_per_s | round) | \($r.p50_us * 100 | round / 100) | \($r.p99_us * 100 | round / 100) | \($f.idle_cpu_pct * 100 | round / 100) |"' "$J"; done)

\`spin\` and \`yield\` keep a CPU busy per executor even when nothing happens; \`block\` costs a
futex wake-up per burst and uses every CPU for executors (the publisher then shares one);
\`adaptive\` (the default) spins through the gaps of a busy stream, yields for a little while and
then sleeps, so an idle bus costs nothing measurable.

## Failing handlers: \`retry.scope\` key and lane

One event in 1000 asks for one retry (\`--handler-fail-rate 0.001\`, \`KEYBUS_RETRY_BACKOFF_MS=100\`:
the retry comes 50..100 ms later); multi with 10,000 aggregates, so about ten share each of the
1,024 lanes; 1M events flat out and 300k at 100,000 events/s; each keybus run once with
\`retry.scope = key\` and once with \`lane\`. Latency is that of the events whose own aggregate
was not waiting for a retry: what a failing aggregate costs the others. With \`key\` only the
failing aggregate waits (its later events are set aside); with \`lane\` its lane's other
aggregates wait with it.

| retry.scope | events/s flat out (median) | p99 µs flat out (median) | p99 µs at 100k/s (median) | p999 µs at 100k/s (median) |
|---|--:|--:|--:|--:|
$(for s in key lane; do echo "| $s | $(median ".kind == \"handler-fails\" and .rate == 0 and .retry_scope == \"$s\"" .events_per_s) | $(median ".kind == \"handler-fails\" and .rate == 0 and .retry_scope == \"$s\"" .p99_us) | $(median ".kind == \"handler-fails\" and .rate == 100000 and .retry_scope == \"$s\"" .p99_us) | $(median ".kind == \"handler-fails\" and .rate == 100000 and .retry_scope == \"$s\"" .p999_us) |"; done)

Every keybus run:

| retry.scope | events | rate | events/s | p50 µs | p99 µs | p99.9 µs | order/lost/dup |
|---|--:|--:|--:|--:|--:|--:|:-:|
$(jq -r 'select(.kind == "handler-fails" and .retry_scope != "") | "| \(.retry_scope) | \(.events) | \(.rate) | \(.events_per_s | round) | \(.p50_us * 100 | round / 100) | \(.p99_us * 100 | round / 100) | \(.p999_us * 100 | round / 100) | \(.order_violations)/\(.lost)/\(.duplicates) |"' "$J")

## Scaling: events

$(table '.kind == "sweep-events"')

![throughput against events](img/throughput_vs_events.png)

![peak RSS against events](img/rss_vs_events.png)

## Scaling: threads

$(table '.kind == "sweep-threads"')

![throughput against threads](img/throughput_vs_threads.png)

## Latency at fixed rates (500k and 1M events/s)

$(table '.kind == "fixed-rate" and .handler_us == 0')

## The realistic tail: 2 producers, a 2 µs handler

$(table '.handler_us == 2')

![latency CDF](img/latency_cdf.png)

## Against the origin's pool in Go

\`bench/origin_go\` is seed 001's \`KeyedWorkerPool\` rebuilt as written there (1024
goroutines, a channel of 1,000 each, FNV-32a, \`ProcessMessage\` with a 200 ms
\`time.After\`), driven by the same plan as keybus-bench (keys, rounds, the mixed shuffle, a
64-byte payload per event, the order checked per aggregate, CPU per event by \`getrusage\`).
$go_note. Five alternating pairs per scenario, \`keybus-bench --scenario S --events 1000000
--no-baselines\` then \`origin-go -scenario S -events 1000000\`; × origin-go is taken within
each pair, then the median (range in brackets). Target: ≥ 3 × in every scenario.

| scenario | pairs | mem:// events/s | origin-go events/s | × origin-go | CPU ns/event mem:// / origin-go | pairs with order/lost/dup |
|---|--:|--:|--:|--:|--:|--:|
$(go_rows)

## Brokers: keybus against the raw baselines

One line per broker, mode and point: the median of five alternating runs (each run puts the
raw baselines and keybus back to back on the same server; × raw and × xadd are taken within a
run, then the median), from the Redis and NATS runs below. **default**: \`kb_publish_to\` per
event with the default configuration (NATS: frames); **per-message** (NATS): frames off,
\`nats.publish_batch = 1\`, one JetStream message per event; **batched**: \`--batch 64\`
(\`kb_publish_batch\`). \`baseline:redis-xadd\` is the server's ceiling for appending: the same
pipelined XADDs with no reader (read back into the checker after the timing). "spread" is the
slowest and fastest run over the median. Issue 29's targets: NATS per-message ≥ 1.0 × raw;
NATS default single ≥ 500k events/s; Redis batched ≥ 0.5 × xadd and ≥ 1.0 × raw; Redis without
batch ≥ 0.8 × raw; Redis single: every run within 20 % of the median and ≥ 100k events/s.

| broker, mode | scenario | events | runs | raw events/s | xadd events/s | keybus events/s | spread | × raw | × xadd | runs with order/lost/dup |
|---|---|--:|--:|--:|--:|--:|:-:|--:|--:|--:|
$(brokers "redis default" "$RJ" "redis://" "baseline:redis-raw")
$(brokers "redis batched" "$RJB" "redis://" "baseline:redis-raw")
$(brokers "nats default" "$NJ" "nats://" "baseline:nats-raw")
$(brokers "nats per-message" "$NJP" "nats://" "baseline:nats-raw")
$(brokers "nats batched" "$NJB" "nats://" "baseline:nats-raw")

$(cat "$src/bench/throughput.md")

## Brokers: latency at everyday load (1,000, 10,000 and 50,000 events/s)

Multi (100 aggregates), one producer that sleeps to each send time (\`--pace sleep\`), five
alternating runs per point: the raw client (\`baseline:redis-raw\` / \`baseline:nats-raw\`),
paced by \`--rate\` exactly as keybus is (the same driver calls both), then keybus, on the same
server. Latency is publish-to-handle from the scheduled send time. The ratios are keybus's
figure over the raw run just before it, then the median over the five; CPU is the process's
(user + system, every thread) over the events. Targets at 1k and 10k/s: p50 ≤ 1.5 × and p99
≤ 2 × raw. Load average at the start of each broker's runs: ${lat_load:-not run}.
\`keybus-bench --transport URL --scenario multi --events N --rate R --pace sleep
--baselines=broker --repeat 5 --cdf cdf-BROKER-R.dat\` with N = 10,000, 50,000 and 200,000.

| broker | events/s offered | runs | raw p50 µs | raw p99 µs | keybus p50 µs | keybus p99 µs | p50 × raw | p99 × raw | CPU µs/event raw / keybus | runs with order/lost/dup |
|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|
$(latency_rows "redis://" "baseline:redis-raw")
$(latency_rows "nats://" "baseline:nats-raw")

$(for b in redis nats; do if [ -s "$res/cdf-$b-1000.dat" ]; then printf '![%s latency CDF](img/latency_cdf_%s.png)\n\n' "$b" "$b"; fi; done)
$(cat "$src/bench/latency.md")

## Redis Streams

$redis_note. Same binary and scenarios against a \`redis-server\` this script starts on a free
loopback port (\`--save "" --appendonly no\`, its own temp dir) and stops by PID afterwards:

\`\`\`sh
redis-server --port P --bind 127.0.0.1 --save "" --dir /tmp/x
keybus-bench --transport redis://127.0.0.1:P --scenario all --large-events 200000 --repeat 5
keybus-bench --transport redis://127.0.0.1:P --scenario all --events 200000 --batch 64 --repeat 5
\`\`\`

\`baseline:redis-raw\` (bench/baseline_redis.c) is plain hiredis on the same server in the same
run: one thread pipelines \`XADD stream * k <key> d <payload>\` (the fields keybus writes) into
a single stream, a second thread on its own connection loops \`XREADGROUP COUNT 2048 BLOCK 100\`
and acks each batch with one \`XACK\` pipelined ahead of the next read; entries go through the
same order/loss/duplicate checker. keybus uses the defaults: 8 partitions, \`redis.batch\` 256
per partition, validated (fenced) reads, fenced acks. Issue target: keybus end-to-end ≥ 80%
of \`baseline:redis-raw\`.

$(if [ -s "$RJ" ]; then table 'true' "$RJ"; fi)

$(if [ -s "$RJB" ]; then echo "With \`--batch 64\` (\`kb_publish_batch\`):"; echo; table 'true' "$RJB"; fi)

Multi-process run: one producer process publishes 1,000,000 events (100 keys × 10,000, 64-byte
payloads, \`kb_publish\` + \`kb_flush\`) while two consumer processes share the topic's 8
partitions by lease (\`tests/redis_consumer_proc\`, handler delay 0, each handled event written
as a line to one \`O_APPEND\` log — a \`write(2)\` per event). Throughput is events over the
time from the first publish until the log holds 1M lines (polled every 0.1 s); order, loss and
duplicates are checked on the log's global order.

| events | consumer processes | seconds | publish events/s | end-to-end events/s | distinct/order violations/dup | handled by a / b |
|---|--:|--:|--:|--:|:-:|:-:|
${redis_mp:-| not run | | | | | | |}

$(cat "$src/bench/replication.md")

## NATS JetStream

$nats_note. Same binary and scenarios (large runs at 200,000 events to stay bounded) against a
\`nats-server -js\` this script starts on a free loopback port with its own store dir and stops by PID:

\`\`\`sh
nats-server -js -a 127.0.0.1 -p P -sd /tmp/x
keybus-bench --transport nats://127.0.0.1:P --scenario all --large-events 200000 --repeat 5
KEYBUS_NATS_PUBLISH_BATCH=1 keybus-bench --transport nats://127.0.0.1:P --scenario all --large-events 0 --repeat 5
keybus-bench --transport nats://127.0.0.1:P --scenario all --events 200000 --batch 64 --repeat 5
\`\`\`

\`baseline:nats-raw\` (bench/baseline_nats.c) is plain nats.c on the same server in the same run:
one thread async-publishes to one subject of a file-storage stream (key in a header, 16,384 in
flight), a pull consumer acks every message; entries go through the same checker. keybus uses
the defaults: 8 partitions, one durable pull consumer per partition, acks by per-partition
completion frontier (AckAll), and **frames**: up to 64 events of one partition per JetStream
message (\`nats.publish_batch\`; a lone event after a quiet millisecond goes alone and plain; see
docs/transports-nats.md). The server's work is per message, and on 2 cores the server is the
bottleneck, so frames are where the speed comes from; "frames off" below is the same with
\`KEYBUS_NATS_PUBLISH_BATCH=1\` (one message per event, like the raw baseline). Medians and
targets: [the broker summary](#brokers-keybus-against-the-raw-baselines).

$(if [ -s "$NJ" ]; then table 'true' "$NJ"; fi)

Frames off (\`KEYBUS_NATS_PUBLISH_BATCH=1\`, one JetStream message per event):

$(if [ -s "$NJP" ]; then table 'true' "$NJP"; fi)

With \`--batch 64\` (\`kb_publish_batch\`, frames on):

$(if [ -s "$NJB" ]; then table 'true' "$NJB"; fi)

$(cat "$src/bench/cluster.md")

## Metrics and trace points

\`metrics.enabled\` (histograms) on and off, the USDT probes detached, compiled out and
attached (docs/metrics.md, docs/tracing.md).

$(cat "$src/bench/metrics.md")

## Broker edges

Many topics on one bus and restarts with a stable consumer name (issue: broker edges), measured
by the tests that assert them, on real servers they start themselves. Threads and
connections per bus do not grow with topics; limits and formulas are in [limits](limits.md).

\`\`\`sh
build/tests/test_redis_topics                          # 1,000 topics x 10 events on redis://
KB_TEST_TOPICS=1000 build/tests/test_nats_topics       # the same on nats://
KB_TEST_RESTART_PATTERN=issue build/tests/test_nats_restart build/tests/nats_consumer_proc
    # NATS, consumer=fixed-c: 2,000 events/s for 30 s over 100 keys, killed -9 and restarted
    # 20 times at 0.6-1.6 s intervals, 3 more times idle, then a last consumer drains
\`\`\`

\`\`\`
$(sed 's/^\[ *[A-Z]* *\] *//' "$edges")
\`\`\`

## Micro-benchmarks (google-benchmark)

\`keybus-gbench\` (bench/bench_gbench.cc): FNV-1a by key length; one lane's enqueue/dequeue
through \`kb_pool\` (SPSC and MPSC rings, batches of 1000 then \`kb_pool_flush\`);
submit-to-handle over 1024 lanes and 100 keys with 1 and 2 producer threads and 1 or 2
executors; the same through the naive mutex pool; and \`BM_publish_to\`, the cost of one
\`kb_publish_to\` on mem:// with the default configuration (64 and 256-byte payloads): time per
publish with the executors handling concurrently, and heap allocations and bytes per publish
counted by a malloc hook (\`allocs_per_publish\`, \`bytes_per_publish\`) beside the origin's Go
pool (\`origin_allocs\` 11, \`origin_bytes\` 601). Debian's libbenchmark is built without
NDEBUG, hence its DEBUG warning; it does not affect the code under test.

\`\`\`
$(grep -v '^\*\*\*WARNING' "$res/gbench.txt")
\`\`\`
MD
} >"$doc.tmp"
mv "$doc.tmp" "$doc"
echo "run-all.sh: wrote $doc and $img/*.png (raw data in $res)" >&2
exit $status
