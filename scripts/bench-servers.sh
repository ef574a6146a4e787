# Sourced by the broker bench scripts (bench-redis-wait.sh, bench-nats-cluster.sh):
# their arguments, the keybus-bench binary, a temp dir and the servers started
# there, stopped by PID at exit. Before sourcing, set `me` (the script's name)
# and `tag` (the temp dir's name). Then: $events $repeat $bench $dir, pids+=(PID),
# free_port, nats_healthy.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
events=${1:-200000}
repeat=${2:-3}
build=${KEYBUS_BENCH_BUILD:-build}
bench=$build/bench/keybus-bench
[ -x "$bench" ] || { echo "$me: build $bench first (bash scripts/test.sh)" >&2; exit 1; }

dir=$(mktemp -d "/tmp/kb-bench-$tag.XXXXXX")
pids=()
stop() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
    rm -rf "$dir"
}
trap stop EXIT INT TERM

# a port nothing answers on (bash's /dev/tcp: refused means free)
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
}

# nats_healthy HTTP_PORT: wait (up to 30 s) until nats-server's /healthz answers
# 200 (JetStream current, a meta leader known); 1 (said on stderr) if it does not
nats_healthy() {
    for _ in $(seq 300); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/healthz")" = 200 ] && return 0
        sleep 0.1
    done
    echo "$me: nats-server with monitoring port $1 not healthy" >&2
    return 1
}
