# Redis Streams transport (hiredis); included by the top CMakeLists when
# KEYBUS_WITH_REDIS=ON. Layers, top down: redis_int.h.
list(APPEND KB_SOURCES
  transports/redis/redis.c transports/redis/redis_keeper.c transports/redis/redis_consume.c
  transports/redis/redis_sweep.c transports/redis/redis_deliver.c transports/redis/redis_entry.c
  transports/redis/redis_publish.c transports/redis/redis_sender.c transports/redis/redis_backlog.c
  transports/redis/redis_settle.c
  transports/redis/redis_lease.c transports/redis/redis_members.c transports/redis/redis_dlq.c
  transports/redis/redis_stats.c transports/redis/redis_drain.c transports/redis/redis_jobs.c
  transports/redis/redis_meta.c transports/redis/redis_limit.c transports/redis/redis_conn.c
  transports/redis/redis_sentinel.c
  transports/redis/redis_url.c transports/redis/redis_fields.c)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
list(APPEND KB_PRIVATE_LIBS PkgConfig::HIREDIS)
list(APPEND KB_DEFINITIONS KB_WITH_REDIS)
string(APPEND KB_PC_REQUIRES " hiredis")
