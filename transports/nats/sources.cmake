# NATS JetStream transport (nats.c); included by the top CMakeLists.txt.
# Layers, top-down (nats.c's opening comment): nats.c; the concerns; the
# pipes they share; helpers on messages and names.
list(APPEND KB_SOURCES
  transports/nats/nats.c
  transports/nats/nats_connect.c transports/nats/nats_consume.c transports/nats/nats_lease.c
  transports/nats/nats_acker.c transports/nats/nats_dlq.c transports/nats/nats_drain.c
  transports/nats/nats_stats.c transports/nats/nats_publish.c transports/nats/nats_runs.c
  transports/nats/nats_batch.c transports/nats/nats_send.c transports/nats/nats_tally.c
  transports/nats/nats_topic.c transports/nats/nats_claim.c transports/nats/nats_probe.c
  transports/nats/nats_hdr.c transports/nats/nats_frame.c transports/nats/nats_msg.c
  transports/nats/nats_names.c)
pkg_check_modules(NATS REQUIRED IMPORTED_TARGET libnats)
list(APPEND KB_PRIVATE_LIBS PkgConfig::NATS)
list(APPEND KB_DEFINITIONS KB_WITH_NATS)
