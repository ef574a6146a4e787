/* Core configuration keys (design §4). Transports declare their own keys
 * (kb_transport_ops.props). */
#include "conf_int.h"

#define MS_HOUR 3600000
#define MS_DAY 86400000

const kb_conf_prop kb__core_props[] = {
    {"conf.env", KB_CONF_BOOL, "true", 0, 1,
     "`false`: `kb_open` ignores `KEYBUS_*` environment variables."},
    {"transport.plugins", KB_CONF_TEXT, "", 0, 4096,
     "Comma-separated paths of transport plugins (shared objects exporting "
     "`kb_transport_plugin`, docs/transports.md) to load when this key is set; their "
     "schemes and `<scheme>.*` keys are known from then on. Code and configuration files "
     "only: `KEYBUS_TRANSPORT_PLUGINS` is refused. Absolute paths only; a file or directory "
     "that is group- or world-writable, or owned by a user other than root and this one, is "
     "refused before it is loaded."},
    {"transport", KB_CONF_URL, "mem://", 0, 4096,
     "Transport URL; the scheme picks the transport: `mem://`, "
     "`redis://[user:pass@]host:port[/db]`, "
     "`redis-sentinel://[user:pass@]host1:26379,host2:26379/<master-name>`, "
     "`nats://[user:pass@]host:port`, or NATS seed servers "
     "`nats://[user:pass@]host1:4222,host2:4222` (also written "
     "`nats://host1:4222,nats://host2:4222`)."},
    {"pool.workers", KB_CONF_INT, "1024", 1, 1 << 20,
     "Lanes per topic. An aggregate always maps to lane `fnv1a32(key) % pool.workers`."},
    {"pool.threads", KB_CONF_INT, "0", 0, 1024,
     "Executor threads per bus, shared by all topics; 0 = automatic: the online CPUs, "
     "less one for the publisher unless `pool.idle` is `block` (at least 1)."},
    {"pool.idle", KB_CONF_ENUM, "adaptive", 0, 32,
     "What executors do when their lanes are empty and publishers do on a full lane: "
     "`spin` (busy-poll), `yield` (`sched_yield` loop), `block` (futex at once) or "
     "`adaptive` (spin ~50 µs, yield ~2 ms, then block; on a broker transport's executors "
     "spin ~15 µs, then block). Trade-offs in docs/benchmarks.md.",
     "adaptive|spin|yield|block"},
    {"pool.queue_capacity", KB_CONF_INT, "1000", 1, 1 << 24,
     "Events per lane (the ring is rounded up to a power of two)."},
    {"pool.enqueue_timeout_ms", KB_CONF_INT, "200", 0, MS_HOUR,
     "How long `kb_publish` waits on a full lane before `KB_EFULL`; 0 = not at all."},
    {"retry.max_attempts", KB_CONF_INT, "5", 1, 1000000,
     "Deliveries of one event before it is dead-lettered."},
    {"retry.backoff_ms", KB_CONF_INT, "10", 0, MS_HOUR,
     "Delay before the first retry; doubles per attempt, with jitter. Only the "
     "event's aggregate waits (its lane, with `retry.scope = lane`)."},
    {"retry.max_backoff_ms", KB_CONF_INT, "5000", 0, MS_DAY,
     "Cap on the retry delay; must be at least `retry.backoff_ms`."},
    {"retry.scope", KB_CONF_ENUM, "key", 0, 8,
     "Who waits while an event waits for its retry. `key`: only its aggregate; the "
     "aggregate's later events are set aside in arrival order (they count against "
     "`pool.queue_capacity`) and run after it, while the lane's other aggregates go on. "
     "`lane`: the whole lane waits.",
     "key|lane"},
    {"limits.max_key_bytes", KB_CONF_INT, "1024", 1, 65535,
     "Longest aggregate ID accepted; longer keys get `KB_ETOOBIG`."},
    {"limits.max_payload_bytes", KB_CONF_INT, "1048576", 0, 1 << 30,
     "Largest payload accepted; larger ones get `KB_ETOOBIG`."},
    {"limits.max_headers", KB_CONF_INT, "16", 0, 64,
     "Headers per event (`kb_msg.headers`); more get `KB_ETOOBIG`."},
    {"limits.max_header_bytes", KB_CONF_INT, "4096", 0, 65536,
     "Bytes of header names and values together per event; more get `KB_ETOOBIG`."},
    {"partitions", KB_CONF_INT, "8", 1, 4096,
     "Broker partitions per topic (Redis streams or JetStream subjects); "
     "partition = `fnv1a32(key) % partitions`. Must match what the broker stores."},
    {"group", KB_CONF_STR, "keybus", 1, 128,
     "Consumer group (Redis) or durable-name prefix (NATS)."},
    {"group.start", KB_CONF_ENUM, "earliest", 0, 16,
     "Where a new consumer group starts on a broker: `earliest`, every event the topic "
     "stores; `latest`, only events published after the group is made (Redis: "
     "`XGROUP CREATE … $` in `kb_subscribe`; NATS: `DeliverPolicy` new, when a partition is "
     "first claimed, shortly after `kb_subscribe`: wait for `partitions_owned` before counting "
     "on it). A group that exists keeps its place, and one the server lost is made again "
     "from the start, so nothing is skipped.",
     "earliest|latest"},
    {"consumer", KB_CONF_STR, NULL, 1, 128,
     "This process's consumer name; default `<hostname>-<pid>`. Keep it stable "
     "across restarts to pick up your own pending entries first."},
    {"runs.dir", KB_CONF_TEXT, "", 0, 3800,
     "Directory of the crash journals of broker consumers: which event each executor is "
     "running, so a run cut short by kill -9 or abort() still counts towards "
     "`retry.max_attempts` when the next process of the group on this host starts "
     "(docs/transports.md, \"Attempts are handler runs\"). Empty: "
     "`$XDG_RUNTIME_DIR/keybus-runs`, else `/tmp/keybus-runs-<uid>`; created with mode 0700, and refused when another user owns it."},
    {"metrics.enabled", KB_CONF_BOOL, "false", 0, 1,
     "`true`: also keep histograms of publish-to-handle latency and handler duration "
     "(they read the clock at publish and around every handler run: about 120 "
     "instructions per event); the counters and gauges are always kept. docs/metrics.md; "
     "cost in docs/benchmarks.md."},
    {"metrics.listen", KB_CONF_TEXT, "", 0, 300,
     "`host:port` (e.g. `127.0.0.1:9464`; `[::1]:9464` for IPv6) of a built-in HTTP "
     "endpoint serving `GET /metrics` (Prometheus text) and `GET /partitions` (JSON); "
     "empty: none. `kb_open` fails when it cannot listen there. docs/metrics.md."},
    {"metrics.max_connections", KB_CONF_INT, "64", 1, 1024,
     "Connections the `metrics.listen` endpoint holds at once; more wait in the "
     "kernel's backlog. A request must arrive whole within 5 s of its connection (or of "
     "the previous answer) or the connection is closed. docs/metrics.md."},
    {"metrics.max_connections_per_client", KB_CONF_INT, "8", 1, 1024,
     "Connections one client address may hold at the `metrics.listen` endpoint; more "
     "are closed at once."},
    {"metrics.min_interval_ms", KB_CONF_INT, "1000", 0, MS_HOUR,
     "The endpoint answers from a snapshot collected on a thread of its own, at most "
     "once per this many ms whatever the number of scrapes (the broker's figures cost "
     "commands per partition)."},
    {"stats.interval_ms", KB_CONF_INT, "0", 0, MS_DAY,
     "Period of the stats feed: every that many ms the callback of "
     "`kb_conf_set_stats_cb` gets one JSON document (docs/formats.md); 0 = off."},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL},
};

const kb_conf_field kb__core_fields[] = {
    KB_CONF_FIELD("conf.env", conf_env),
    KB_CONF_FIELD("transport", transport),
    KB_CONF_FIELD("pool.workers", pool_workers),
    KB_CONF_FIELD("pool.threads", pool_threads),
    KB_CONF_FIELD("pool.idle", pool_idle),
    KB_CONF_FIELD("pool.queue_capacity", pool_queue_capacity),
    KB_CONF_FIELD("pool.enqueue_timeout_ms", pool_enqueue_timeout_ms),
    KB_CONF_FIELD("retry.max_attempts", retry_max_attempts),
    KB_CONF_FIELD("retry.backoff_ms", retry_backoff_ms),
    KB_CONF_FIELD("retry.max_backoff_ms", retry_max_backoff_ms),
    KB_CONF_FIELD("retry.scope", retry_scope),
    KB_CONF_FIELD("limits.max_key_bytes", max_key_bytes),
    KB_CONF_FIELD("limits.max_payload_bytes", max_payload_bytes),
    KB_CONF_FIELD("limits.max_headers", max_headers),
    KB_CONF_FIELD("limits.max_header_bytes", max_header_bytes),
    KB_CONF_FIELD("partitions", partitions),
    KB_CONF_FIELD("group", group),
    KB_CONF_FIELD("consumer", consumer),
    KB_CONF_FIELD("runs.dir", runs_dir),
    KB_CONF_FIELD("metrics.enabled", metrics_enabled),
    KB_CONF_FIELD("metrics.listen", metrics_listen),
    KB_CONF_FIELD("metrics.max_connections", metrics_max_connections),
    KB_CONF_FIELD("metrics.max_connections_per_client", metrics_max_per_client),
    KB_CONF_FIELD("metrics.min_interval_ms", metrics_min_interval_ms),
    KB_CONF_FIELD("stats.interval_ms", stats_interval_ms),
    {NULL, 0, KB_FIELD_INT},
};
