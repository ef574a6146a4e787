#!/bin/sh
# Regenerate docs/benchmarks.md and docs/img/*.png: build (Release), run every
# benchmark, plot. Bounded: each step has a timeout; the whole takes 1-3 min.
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
    timeout 240 "$bench" --json "$res/results.jsonl" "$@" >"$res/$name.txt" || {
        echo "run-all.sh: keybus-bench $* failed (exit $?), see $res/$name.txt" >&2
        status=1
    }
}
status=0
run scenarios --scenario all ${threads:+--threads "$threads"}
run sweep-events --sweep events ${threads:+--threads "$threads"}
run sweep-threads --sweep threads
run latency --scenario multi --events 1000000 --rate 1000000 --cdf "$res/cdf.dat" ${threads:+--threads "$threads"}
echo "run-all.sh: keybus-gbench" >&2
timeout 240 "$gbench" --benchmark_min_time=0.2 --benchmark_color=false >"$res/gbench.txt" 2>&1 || status=1

# --- Redis Streams: only when redis-server exists; own server, stopped by PID --
RJ=$res/redis.jsonl
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
        echo "run-all.sh: keybus-bench --transport $rurl --scenario all" >&2
        timeout 200 "$bench" --transport "$rurl" --scenario all --json "$RJ" >"$res/redis-scenarios.txt" || {
            echo "run-all.sh: redis scenarios failed, see $res/redis-scenarios.txt" >&2
            status=1
        }
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
    echo "run-all.sh: keybus-bench --transport $nurl --scenario all --large-events 200000" >&2
    timeout 240 "$bench" --transport "$nurl" --scenario all --large-events 200000 --json "$NJ" \
        >"$res/nats-scenarios.txt" || {
        echo "run-all.sh: nats scenarios failed, see $res/nats-scenarios.txt" >&2
        status=1
    }
    # The same with frames off: one JetStream message per event.
    for sc in single multi mixed; do
        KEYBUS_NATS_PUBLISH_BATCH=1 timeout 240 "$bench" --transport "$nurl" --scenario "$sc" \
            --large-events 200000 --no-baselines --json "$NJP" >>"$res/nats-plain.txt" || {
            echo "run-all.sh: nats scenarios (frames off) failed, see $res/nats-plain.txt" >&2
            status=1
        }
    done
    stop_nats
    trap - EXIT INT TERM
fi

"$src/bench/plot.sh" "$res" "$img"

# --- docs/benchmarks.md -------------------------------------------------------
J=$res/results.jsonl
table() {   # jq filter selecting rows [, JSON lines file]
    echo "| scenario | kind | transport | events | aggs | thr | seconds | events/s | p50 µs | p99 µs | p99.9 µs | peak RSS MiB | order/lost/dup | × origin | × ring | × mutex |"
    echo "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|"
    jq -r "select($1) | \"| \(.scenario) | \(.kind) | \(.transport) | \(.events) | \(.aggregates) | \(.threads) | \(.seconds * 10000 | round / 10000) | \(.events_per_s | round) | \(.p50_us * 100 | round / 100) | \(.p99_us * 100 | round / 100) | \(.p999_us * 100 | round / 100) | \(.rss_bytes / 104857.6 | round / 10) | \(.order_violations)/\(.lost)/\(.duplicates) | \(.ratio_origin * 10 | round / 10) | \(if .ratio_ring then (.ratio_ring * 100 | round / 100) else \"\" end) | \(if .ratio_mutex then (.ratio_mutex * 100 | round / 100) else \"\" end) |\"" "${2:-$J}"
}
pick() {   # jq filter -> one value
    jq -rs "map(select($1)) | .[0] | $2 // \"n/a\"" "$J"
}
multi_ratio=$(pick '.kind == "large" and .scenario == "multi" and .transport == "mem://"' '(.ratio_ring * 100 | round | tostring) + "%"')
single_eps=$(pick '.kind == "large" and .scenario == "single" and .transport == "mem://"' '.events_per_s | round')
lat_p99=$(pick '.kind == "fixed-rate" and .transport == "mem://"' '.p99_us * 100 | round / 100')
lat_eps=$(pick '.kind == "fixed-rate" and .transport == "mem://"' '.events_per_s | round')
e100k=$(pick '.kind == "sweep-events" and .events == 100000 and .transport == "mem://"' '.events_per_s | round')
e10m=$(pick '.kind == "sweep-events" and .events == 10000000 and .transport == "mem://"' '.events_per_s | round')
r100k=$(pick '.kind == "sweep-events" and .events == 100000 and .transport == "mem://"' '.rss_bytes / 104857.6 | round / 10')
r10m=$(pick '.kind == "sweep-events" and .events == 10000000 and .transport == "mem://"' '.rss_bytes / 104857.6 | round / 10')
scale=$(jq -rn --arg a "$e100k" --arg b "$e10m" '($b | tonumber? // 0) / ($a | tonumber? // 1) * 100 | round | tostring + "%"' 2>/dev/null || echo n/a)
used_threads=$(pick '.kind == "origin" and .transport == "mem://"' '.threads')

{
cat <<MD
# keybus benchmarks

Generated by \`bench/run-all.sh\` on $(date -u +%Y-%m-%d) — do not edit by hand; change the
script and rerun it. Every number below comes from the same invocation.

## Machine

- $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
- Linux $(uname -r), $(cc --version | head -1)
- load average when the run started: $load (a shared machine is noisy: compare ratios
  measured in the same run rather than absolute numbers across runs)
- pool.threads: ${threads:-library default = online CPUs ($used_threads)}; 1 producer thread; 64-byte payloads

## Commands

\`\`\`sh
bench/run-all.sh                      # all of the below, then this page and docs/img/*.png
keybus-bench --scenario all           # origin sizes + 1M-event runs, with baselines
keybus-bench --sweep events           # multi, 10k .. 10M events
keybus-bench --sweep threads          # multi, 1M events, 1 .. 2×CPUs executors
keybus-bench --scenario multi --events 1000000 --rate 1000000 --cdf cdf.dat   # latency at 1M/s
keybus-gbench                         # google-benchmark micro-benchmarks
keybus-bench --transport redis://localhost:6379 --scenario all   # any transport, same scenarios
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

## Results: scenarios

$(table '.kind == "origin" or .kind == "large"')

## Goals

| goal | measured | met |
|---|---|:-:|
| mem:// multi end-to-end ≥ 50% of baseline:ring (same run, 1M events) | $multi_ratio | $(jq -rn --arg v "$multi_ratio" '($v | rtrimstr("%") | tonumber? // 0) >= 50 | if . then "yes" else "no" end') |
| single aggregate ≥ 5M events/s (1M events) | $single_eps events/s | $(jq -rn --arg v "$single_eps" '($v | tonumber? // 0) >= 5000000 | if . then "yes" else "no" end') |
| p99 publish-to-handle ≤ 20 µs at a fixed 1M events/s | p99 $lat_p99 µs (achieved $lat_eps events/s) | $(jq -rn --arg v "$lat_p99" '($v | tonumber? // 1e9) <= 20 | if . then "yes" else "no" end') |
| 10M events within 10% of the throughput at 100k, memory flat | $e10m vs $e100k events/s ($scale); RSS $r10m vs $r100k MiB | $(jq -rn --arg s "$scale" '($s | rtrimstr("%") | tonumber? // 0) >= 90 | if . then "throughput yes" else "throughput no" end'); $(jq -rn --arg a "$r100k" --arg b "$r10m" '($b | tonumber? // 1e9) <= ($a | tonumber? // 0) * 1.1 + 1.2 | if . then "memory yes" else "memory no" end') |

"Memory flat" allows 10% plus the collector's duplicate bitmap (one bit per event: 1.2 MiB at
10M), which the RSS includes.

Why the p99 at 1M events/s is milliseconds, not microseconds: on this VM the tail is other
threads taking the CPU, not the bus. At a fixed 100k events/s with one executor the median is
under 1 µs, yet ~1-8% of events wait 2-10 ms, in bursts handled together. \`perf sched
timehist\` during such a run shows the executor runnable but off its CPU for up to 8.4 ms while
a kernel worker (\`kworker/1:1\`, virtio) ran there, and a sandbox process waking every 50 ms;
with one producer and one executor spinning on a 2-vCPU machine there is no spare CPU to
absorb them. The same happens to \`baseline:ring\`, less often in a given run. The goal needs a
quiet, isolated core (isolcpus, or at least a third CPU); it is not met here.

## Scaling: events

$(table '.kind == "sweep-events"')

![throughput against events](img/throughput_vs_events.png)

![peak RSS against events](img/rss_vs_events.png)

## Scaling: threads

$(table '.kind == "sweep-threads"')

![throughput against threads](img/throughput_vs_threads.png)

## Latency at a fixed 1M events/s

$(table '.kind == "fixed-rate"')

![latency CDF](img/latency_cdf.png)

## Redis Streams

$redis_note. Same binary and scenarios against a \`redis-server\` this script starts on a free
loopback port (\`--save "" --appendonly no\`, its own temp dir) and stops by PID afterwards:

\`\`\`sh
redis-server --port P --bind 127.0.0.1 --save "" --dir /tmp/x
keybus-bench --transport redis://127.0.0.1:P --scenario all
\`\`\`

\`baseline:redis-raw\` (bench/baseline_redis.c) is plain hiredis on the same server in the same
run: one thread pipelines \`XADD stream * k <key> d <payload>\` (the fields keybus writes) into
a single stream, a second thread on its own connection loops \`XREADGROUP COUNT 2048 BLOCK 100\`
and acks each batch with one \`XACK\` pipelined ahead of the next read; entries go through the
same order/loss/duplicate checker. keybus uses the defaults: 8 partitions, \`redis.batch\` 256
per partition, validated (fenced) reads, fenced acks. Issue target: keybus end-to-end ≥ 80%
of \`baseline:redis-raw\`.

$(if [ -s "$RJ" ]; then table 'true' "$RJ"; fi)

| scenario | kind | events | baseline:redis-raw events/s | keybus redis:// events/s | keybus / raw |
|---|---|--:|--:|--:|--:|
$(if [ -s "$RJ" ]; then jq -rs 'group_by([.scenario, .kind])[] | (map(select(.transport == "baseline:redis-raw"))[0]) as $r | (map(select(.transport | startswith("redis://")))[0]) as $k | select($r and $k) | "| \($k.scenario) | \($k.kind) | \($k.events) | \($r.events_per_s | round) | \($k.events_per_s | round) | \(($k.events_per_s / $r.events_per_s * 100) | round)% |"' "$RJ"; fi)

Multi-process run: one producer process publishes 1,000,000 events (100 keys × 10,000, 64-byte
payloads, \`kb_publish\` + \`kb_flush\`) while two consumer processes share the topic's 8
partitions by lease (\`tests/redis_consumer_proc\`, handler delay 0, each handled event written
as a line to one \`O_APPEND\` log — a \`write(2)\` per event). Throughput is events over the
time from the first publish until the log holds 1M lines (polled every 0.1 s); order, loss and
duplicates are checked on the log's global order.

| events | consumer processes | seconds | publish events/s | end-to-end events/s | distinct/order violations/dup | handled by a / b |
|---|--:|--:|--:|--:|:-:|:-:|
${redis_mp:-| not run | | | | | | |}

## NATS JetStream

$nats_note. Same binary and scenarios (large runs at 200,000 events to stay bounded) against a
\`nats-server -js\` this script starts on a free loopback port with its own store dir and stops by PID:

\`\`\`sh
nats-server -js -a 127.0.0.1 -p P -sd /tmp/x
keybus-bench --transport nats://127.0.0.1:P --scenario all --large-events 200000
\`\`\`

\`baseline:nats-raw\` (bench/baseline_nats.c) is plain nats.c on the same server in the same run:
one thread async-publishes to one subject of a file-storage stream (key in a header, 16,384 in
flight), a pull consumer acks every message; entries go through the same checker. keybus uses
the defaults: 8 partitions, one durable pull consumer per partition, acks by per-partition
completion frontier (AckAll), and **frames**: up to 64 events of one partition per JetStream
message (\`nats.publish_batch\`; a lone event after a quiet millisecond goes alone and plain; see
docs/transports-nats.md). The server's work is per message, and on 2 cores the server is the
bottleneck, so frames are where the speed comes from; the column "frames off" is the same run
with \`KEYBUS_NATS_PUBLISH_BATCH=1\` (one message per event, like the raw baseline). Issue targets:
multi-aggregate ≥ 100% of \`baseline:nats-raw\`; single aggregate ≥ 20× the origin's 4,695 events/s.

$(if [ -s "$NJ" ]; then table 'true' "$NJ"; fi)

| scenario | kind | events | baseline:nats-raw events/s | frames off events/s (/ raw) | keybus nats:// events/s | keybus / raw | × origin |
|---|---|--:|--:|--:|--:|--:|--:|
$(if [ -s "$NJ" ]; then jq -rn --slurpfile a "$NJ" --slurpfile p "$NJP" '$a | group_by([.scenario, .kind])[] | (map(select(.transport == "baseline:nats-raw"))[0]) as $r | (map(select(.transport | startswith("nats://")))[0]) as $k | ([$p[] | select(.scenario == $k.scenario and .kind == $k.kind)][0]) as $q | select($r and $k) | "| \($k.scenario) | \($k.kind) | \($k.events) | \($r.events_per_s | round) | \(if $q then "\($q.events_per_s | round) (\(($q.events_per_s / $r.events_per_s * 100) | round)%)" else "not run" end) | \($k.events_per_s | round) | \(($k.events_per_s / $r.events_per_s * 100) | round)% | \($k.ratio_origin * 10 | round / 10) |"'; fi)

## Micro-benchmarks (google-benchmark)

\`keybus-gbench\` (bench/bench_gbench.cc): FNV-1a by key length; one lane's enqueue/dequeue
through \`kb_pool\` (SPSC and MPSC rings, batches of 1000 then \`kb_pool_flush\`);
submit-to-handle over 1024 lanes and 100 keys with 1 and 2 producer threads and 1 or 2
executors; the same through the naive mutex pool. Debian's libbenchmark is built without
NDEBUG, hence its DEBUG warning; it does not affect the code under test.

\`\`\`
$(grep -v '^\*\*\*WARNING' "$res/gbench.txt")
\`\`\`
MD
} >"$doc.tmp"
mv "$doc.tmp" "$doc"
echo "run-all.sh: wrote $doc and $img/*.png (raw data in $res)" >&2
exit $status
