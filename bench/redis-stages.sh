#!/usr/bin/env bash
# Where a redis:// event's publish-to-handle time goes, stage by stage, in a
# paced keybus-bench run (docs/benchmarks.md, "Where a broker event's latency
# goes at everyday load"). As root, with bpftrace. Usage:
#   bench/redis-stages.sh BENCH_BINARY redis://HOST:PORT RATE EVENTS [keybus-bench options...]
# Uprobes on kb__redis_publish and record_of in the statically linked binary
# and on its handler (bpftrace 0.17 cannot read the publish_broker and receive
# probes' stack arguments); an event is known by the send time its payload
# carries. The XADD's time is the first sendto of the process after the
# publish (publisher or sender), the reply's the first read of
# kb-redis-reader after its last write. Prints each stage's median and 90th
# percentile in µs, read off bpftrace's log2 histograms (within a bucket).
set -euo pipefail
bin=$(realpath "$1") url=$2 rate=$3 events=$4
shift 4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat >"$out/stages.bt" <<EOF
uprobe:$bin:kb__redis_publish {
  \$t = *(uint64 *)(*(uint64 *)(arg2 + 16) + 16);
  \$g = @g[0] + 1; @g[0] = \$g; @evt[\$g] = \$t; @pub[\$t] = nsecs;
  @a_send_time_to_publish = hist((nsecs - \$t) / 1000);
}
tracepoint:syscalls:sys_enter_sendto /pid == \$1/ {
  \$i = @sent[0] + 1; \$c = 0; \$g = @g[0];
  while (\$i <= \$g && \$c < 100) { @snd[@evt[\$i]] = nsecs; delete(@evt[\$i]); \$i = \$i + 1; \$c = \$c + 1; }
  @sent[0] = \$i - 1;
}
tracepoint:syscalls:sys_enter_write /pid == \$1 && comm == "kb-redis-reader"/ { @rw[0] = 1; }
tracepoint:syscalls:sys_exit_read /pid == \$1 && comm == "kb-redis-reader"/ {
  if (args->ret > 0 && @rw[0] == 1) { @reply[0] = nsecs; @rw[0] = 0; }
}
uprobe:$bin:record_of {
  \$t = *(uint64 *)(*(uint64 *)(arg1 + 32) + 16);
  \$p = @pub[\$t]; \$w = @snd[\$t]; \$r = @reply[0];
  delete(@pub[\$t]); delete(@snd[\$t]);
  if (\$p > 0 && \$w > 0) {
    @b_publish_to_xadd_sent = hist((\$w - \$p) / 1000);
    if (\$r > \$w) {
      @c_xadd_sent_to_read_returns = hist((\$r - \$w) / 1000);
      @d_read_returns_to_receive = hist((nsecs - \$r) / 1000);
    }
    @rcv[\$t] = nsecs;
  }
}
uprobe:$bin:handle /comm == "kb-exec-0"/ {
  \$t = *(uint64 *)(*(uint64 *)(arg0 + 24) + 16);
  \$r = @rcv[\$t]; delete(@rcv[\$t]);
  @f_send_time_to_handler = hist((nsecs - \$t) / 1000);
  if (\$r > 0) { @e_receive_to_handler = hist((nsecs - \$r) / 1000); }
}
END { clear(@g); clear(@evt); clear(@pub); clear(@sent); clear(@snd); clear(@rw); clear(@reply); clear(@rcv); }
EOF
"$bin" --transport "$url" --scenario multi --events "$events" --rate "$rate" --pace sleep \
    --no-baselines "$@" >"$out/run" 2>&1 &
bench=$!
sleep 0.5
# traced while the run lasts, less its start and its end
BPFTRACE_MAP_KEYS_MAX=40000 timeout $((events / rate - 2)) bpftrace -p "$bench" "$out/stages.bt" \
    "$bench" >"$out/bt" 2>/dev/null || true
wait "$bench"
grep '^multi' "$out/run"
python3 - "$out/bt" <<'EOF'
import re, sys
hists, cur = {}, None
for line in open(sys.argv[1]):
    if line.startswith('@'):
        cur = line.split(':')[0][1:] if line.rstrip().endswith(':') else None
        if cur:
            hists[cur] = []
        continue
    m = re.match(r'\[(\d+)([KM]?)(?:, (\d+)([KM]?)\))?\]?\s+(\d+) \|', line.strip())
    if cur and m:
        mul = {'': 1, 'K': 1024, 'M': 1 << 20}
        lo = int(m.group(1)) * mul[m.group(2)]
        hi = int(m.group(3)) * mul[m.group(4)] if m.group(3) else lo + 1
        hists[cur].append((lo, hi, int(m.group(5))))
def q(h, f):
    t, acc = f * sum(c for _, _, c in h), 0
    for lo, hi, c in h:
        if acc + c >= t:
            return lo + (hi - lo) * (t - acc) / c
        acc += c
for k in sorted(hists):
    if hists[k]:
        print("%-32s %7d events  p50 %7.0f us  p90 %8.0f us"
              % (k[2:], sum(c for _, _, c in hists[k]), q(hists[k], .5), q(hists[k], .9)))
EOF
