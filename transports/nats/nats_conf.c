/* Configuration keys of the NATS JetStream transport (docs/CONFIGURATION.md). */
#include "../../core/conf_int.h"

#define MS_HOUR 3600000

const kb_conf_prop kb__nats_props[] = {
    {"nats.storage", KB_CONF_STR, "file", 1, 6,
     "JetStream storage of the topic streams: `file` or `memory`."},
    {"nats.ack_wait_ms", KB_CONF_INT, "30000", 100, MS_HOUR,
     "Consumer AckWait. The oldest unfinished event of a partition gets an "
     "in-progress ack every third of it, so long handlers keep their message."},
    {"nats.max_ack_pending", KB_CONF_INT, "4096", 16, 1 << 20,
     "Consumer MaxAckPending per partition: events delivered to this process and "
     "not yet acked."},
    {"nats.fetch_batch", KB_CONF_INT, "256", 1, 4096,
     "Messages per pull request (bounded: see docs/transports-nats.md)."},
    {"nats.fetch_expires_ms", KB_CONF_INT, "1000", 10, 60000,
     "Server-side expiry of one pull request."},
    {"nats.ack_interval_ms", KB_CONF_INT, "2", 1, 1000,
     "How often the completion frontier of each partition is acked (AckAll)."},
    {"nats.lease_ttl_ms", KB_CONF_INT, "10000", 500, MS_HOUR,
     "Partition lease and membership TTL; renewed every third of it. A dead "
     "process's partitions move after at most this long."},
    {"nats.lease_bucket", KB_CONF_STR, "keybus_leases", 1, 64,
     "JetStream KV bucket holding partition leases and members."},
    {"nats.publish_max_pending", KB_CONF_INT, "16384", 1, 1 << 20,
     "Asynchronous publishes in flight; `kb_publish` waits up to "
     "`pool.enqueue_timeout_ms` for room, then `KB_EFULL`."},
    {"nats.publish_batch", KB_CONF_INT, "64", 1, 4096,
     "Events of one partition packed into one JetStream message (a frame), which "
     "divides the server's per-message work among them; 1 sends each event as its "
     "own message. A lone event always goes out as a plain message. See "
     "docs/transports-nats.md."},
    {"nats.publish_linger_us", KB_CONF_INT, "1000", 0, 1000000,
     "How long a frame that is not full may wait for more events. The first event "
     "after a quiet spell of this long is sent at once, so sparse traffic is not "
     "delayed."},
    {"nats.publish_timeout_ms", KB_CONF_INT, "5000", 100, MS_HOUR,
     "Wait for one publish ack before the publish is sent again (same Nats-Msg-Id)."},
    {"nats.dup_window_ms", KB_CONF_INT, "120000", 1000, 24 * MS_HOUR,
     "Stream duplicate window for Nats-Msg-Id when the stream is created."},
    {"nats.connect_wait_ms", KB_CONF_INT, "0", 0, MS_HOUR,
     "How long `kb_open` keeps trying an unreachable server; 0 = fail at once "
     "with `KB_ETRANSPORT`."},
    {"nats.reconnect_wait_ms", KB_CONF_INT, "100", 1, 60000,
     "First reconnect delay; doubles per attempt up to `nats.reconnect_max_wait_ms`."},
    {"nats.reconnect_max_wait_ms", KB_CONF_INT, "2000", 1, MS_HOUR,
     "Cap on the reconnect delay."},
    {"nats.token", KB_CONF_TEXT, "", 0, 4096,
     "Authentication token (instead of one in the URL). Never logged."},
    {"nats.creds_file", KB_CONF_TEXT, "", 0, 4096,
     "User credentials file (JWT and NKey seed)."},
    {"nats.tls_ca", KB_CONF_TEXT, "", 0, 4096,
     "CA certificates file; setting any `nats.tls_*` key turns TLS on."},
    {"nats.tls_cert", KB_CONF_TEXT, "", 0, 4096, "Client certificate file (with `nats.tls_key`)."},
    {"nats.tls_key", KB_CONF_TEXT, "", 0, 4096, "Client private key file."},
    {"nats.tls_hostname", KB_CONF_TEXT, "", 0, 255,
     "Expected server host name in its certificate."},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL},
};
