# Redis transport tests: each starts its own redis-server through tests/support.
kb_contract_test(contract_redis $<TARGET_FILE:with_broker> redis $<TARGET_FILE:keybus-contract>
                 -K redis.lease_ttl_ms=1000 @URL@)
set_tests_properties(contract_redis PROPERTIES LABELS redis)
kb_test(test_redis_basic TIMEOUT 120 LABELS redis)
target_link_libraries(test_redis_basic PRIVATE PkgConfig::HIREDIS)

# Multi-process fault tests run this consumer as a child process.
add_executable(redis_consumer_proc redis_consumer_proc.c)
target_link_libraries(redis_consumer_proc PRIVATE kb_test_support)
kb_test(test_redis_faults TIMEOUT 150 LABELS redis)
target_compile_definitions(test_redis_faults PRIVATE
  KB_CONSUMER_PROC="$<TARGET_FILE:redis_consumer_proc>")
add_dependencies(test_redis_faults redis_consumer_proc)
target_link_libraries(test_redis_faults PRIVATE PkgConfig::HIREDIS)

# Many topics on one bus under a low fd limit (threads and fds counted).
kb_test(test_redis_topics TIMEOUT 120 LABELS redis)
target_link_libraries(test_redis_topics PRIVATE PkgConfig::HIREDIS)

# Parity with mem:// and NATS (issue 9): kb_drain, headers, replay, monitor stats.
kb_test(test_redis_parity TIMEOUT 120 LABELS redis)
target_link_libraries(test_redis_parity PRIVATE PkgConfig::HIREDIS)

# kb_close on a server stopped with SIGSTOP; thread names.
kb_test(test_redis_close TIMEOUT 120 LABELS redis)

# The redis:// URL and redis.* keys checked when set; no password in messages.
kb_test(test_redis_url TIMEOUT 120 LABELS redis)

# kb_close racing every other call (issue 11, item 4).
kb_test(test_close_race TESTNAME close_race_redis ARGS redis LABELS redis TIMEOUT 300)

# redis-sentinel:// and redis.wait_replicas (issue 30): a primary, a replica and
# three Sentinels; the primary killed -9 mid-stream.
kb_test(test_redis_sentinel TIMEOUT 150 LABELS redis)
target_sources(test_redis_sentinel PRIVATE support/sentinel.c)
target_link_libraries(test_redis_sentinel PRIVATE PkgConfig::HIREDIS)

# Dead letters keep every original field; broker_lag before the group exists
# and against the stream's IDs (issue 31).
kb_test(test_redis_figures TIMEOUT 120 LABELS redis)
target_link_libraries(test_redis_figures PRIVATE PkgConfig::HIREDIS)

# Attempts are handler runs: a poison event that abort()s, and events read but
# never run by processes killed -9 (runs_proc children, one consumer name).
kb_test(test_runs TESTNAME runs_redis ARGS redis $<TARGET_FILE:runs_proc> TIMEOUT 120 LABELS redis)
add_dependencies(test_runs runs_proc)

# Entries another client XADDs past the limits: dead-lettered as references,
# never handed to a handler, peak RSS bounded (issue 40).
kb_test(test_redis_limits TIMEOUT 180 LABELS redis)
target_link_libraries(test_redis_limits PRIVATE PkgConfig::HIREDIS)

# Forged coordination data: future members, a foreign `a`, DLQ fields (issue 40).
kb_test(test_redis_forged TIMEOUT 120 LABELS redis)
target_link_libraries(test_redis_forged PRIVATE PkgConfig::HIREDIS)

# The README example through a local stunnel4 tunnel to a TLS-only
# redis-server (docs/deployment.md, "Redis over TLS").
add_test(NAME redis_tls COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/redis_tls.sh
         $<TARGET_FILE:example_hello>)
set_tests_properties(redis_tls PROPERTIES TIMEOUT 180 LABELS redis ENVIRONMENT "${KB_TEST_ENV}")

# The contract suite as the least-privileged ACL user of docs/security.md.
add_test(NAME least_privilege_redis COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/least_privilege.sh
         redis $<TARGET_FILE:keybus-contract>)
set_tests_properties(least_privilege_redis PROPERTIES TIMEOUT 300 LABELS redis
                     ENVIRONMENT "${KB_TEST_ENV}")

# Membership changes under load (issue 38): a join, a leave, a rolling
# restart; 0 lost, per-key order, the longest partition pause bounded.
kb_test(test_redis_membership ARGS $<TARGET_FILE:kb_membership_proc> TIMEOUT 300 LABELS redis)
add_dependencies(test_redis_membership kb_membership_proc)

# Tests that count stream entries (broker_length, pending, lag, MAXLEN) as
# events: one entry per event (redis.publish_batch = 1); frames have their
# own tests (test_redis_frames).
set_property(TEST test_redis_basic test_redis_topics test_redis_parity test_redis_close
             test_redis_figures APPEND PROPERTY ENVIRONMENT KEYBUS_REDIS_PUBLISH_BATCH=1)

# Frames (redis.publish_batch): round trip under concurrency and a hand-over,
# frames and plain entries mixed, a dead letter inside a frame (never handled
# after its consumer is killed), a frame's progress record merged with its dead
# letters' bits, the replay after a consumer killed mid-frame, and Node
# decoding keybus-written frames
# (tests/interop/redis_frames.mjs; skipped without node).
kb_test(test_redis_frames TIMEOUT 120 LABELS redis)
target_link_libraries(test_redis_frames PRIVATE PkgConfig::HIREDIS)
target_compile_definitions(test_redis_frames PRIVATE KB_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# Leases through the kit: a partition back from draining and a renewal
# answered after its deadline are both swept before they are read again.
kb_test(test_redis_lease_kit TIMEOUT 120 LABELS redis)
target_link_libraries(test_redis_lease_kit PRIVATE PkgConfig::HIREDIS)
