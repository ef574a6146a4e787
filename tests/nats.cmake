# NATS JetStream transport tests: each starts its own nats-server -js.
kb_contract_test(contract_nats $<TARGET_FILE:with_broker> nats $<TARGET_FILE:keybus-contract>
                 -K nats.lease_ttl_ms=1000 -K nats.ack_wait_ms=2000 @URL@)
# The same contract with frames off (every event its own JetStream message).
kb_contract_test(contract_nats_plain $<TARGET_FILE:with_broker> nats
                 $<TARGET_FILE:keybus-contract> -X nats.publish_batch=1
                 -K nats.lease_ttl_ms=1000 -K nats.ack_wait_ms=2000 @URL@)
set_tests_properties(contract_nats contract_nats_plain PROPERTIES LABELS nats)
kb_test(test_nats_interop TIMEOUT 90 LABELS nats)
target_link_libraries(test_nats_interop PRIVATE PkgConfig::NATS)
kb_test(test_nats_frames TIMEOUT 90 LABELS nats)
kb_test(test_nats_parity TIMEOUT 120 LABELS nats)
target_link_libraries(test_nats_parity PRIVATE PkgConfig::NATS)
target_link_libraries(test_nats_frames PRIVATE PkgConfig::NATS)
add_executable(nats_consumer_proc nats_consumer_proc.c)
target_link_libraries(nats_consumer_proc PRIVATE kb_test_support)
kb_test(test_nats_faults ARGS $<TARGET_FILE:nats_consumer_proc> TIMEOUT 300 LABELS nats)
target_link_libraries(test_nats_faults PRIVATE PkgConfig::NATS)
kb_test(test_nats_restart ARGS $<TARGET_FILE:nats_consumer_proc> TIMEOUT 180 LABELS nats)
target_link_libraries(test_nats_restart PRIVATE PkgConfig::NATS)
# Alone: beside other server tests under TSan its incarnations are too slow to
# ack between kills, and it times out (on main too).
set_tests_properties(test_nats_restart PROPERTIES RUN_SERIAL TRUE)
kb_test(test_nats_limits TIMEOUT 90 LABELS nats)
kb_test(test_nats_topics TIMEOUT 300 LABELS nats)
target_link_libraries(test_nats_topics PRIVATE PkgConfig::NATS)
# The hand-written $JS.ACK parser against nats.c's natsMsg_GetMetaData.
kb_test(test_nats_ackparse TIMEOUT 60 LABELS nats)
target_link_libraries(test_nats_ackparse PRIVATE PkgConfig::NATS keybus::internal)
# Publishes found by their message (nats_flight.c): against a plain array.
kb_test(test_nats_flight TIMEOUT 60 LABELS nats)
target_link_libraries(test_nats_flight PRIVATE keybus::internal)
# kb_close within its deadline with the server stopped by SIGSTOP.
kb_test(test_nats_close TIMEOUT 90 LABELS nats)
# URLs and credentials: parts checked when set, userinfo decoded, nats.c's
# reasons in errors, no secret in any message.
kb_test(test_nats_urls TIMEOUT 90 LABELS nats)

# kb_close racing every other call (issue 11, item 4).
kb_test(test_close_race TESTNAME close_race_nats ARGS nats LABELS nats TIMEOUT 300)
# The partition count is part of a topic; foreign subjects dead-lettered; the
# lease bucket's TTL set from nats.lease_ttl_ms (issue 25 item 1, issue 31 item 5).
kb_test(test_nats_partitions TIMEOUT 120 LABELS nats)
target_link_libraries(test_nats_partitions PRIVATE PkgConfig::NATS)

# Attempts are handler runs: a poison event that abort()s, events read but never run.
kb_test(test_runs TESTNAME runs_nats ARGS nats $<TARGET_FILE:runs_proc> TIMEOUT 120 LABELS nats)
add_dependencies(test_runs runs_proc)

# A 3-node JetStream cluster (issue 30, NATS half): R3 streams and lease bucket,
# the stream leader, a non-leader and the lease bucket's leader killed -9.
kb_test(test_nats_cluster ARGS $<TARGET_FILE:nats_consumer_proc> TIMEOUT 300 LABELS nats)
# Three servers and three bus processes: alone, so their leases are not starved
# by the rest of the suite on 2 cores (a TSan run beside it timed out).
set_tests_properties(test_nats_cluster PROPERTIES RUN_SERIAL ON)
target_sources(test_nats_cluster PRIVATE support/nats_cluster.c)
target_link_libraries(test_nats_cluster PRIVATE PkgConfig::NATS)

# Forged coordination data: a progress record past what its consumer was
# delivered, or out of form, is ignored and logged (issue 40).
kb_test(test_nats_forged TIMEOUT 120 LABELS nats)
target_link_libraries(test_nats_forged PRIVATE PkgConfig::NATS)

# The contract suite as the least-privileged user of docs/security.md.
add_test(NAME least_privilege_nats COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/least_privilege.sh
         nats $<TARGET_FILE:keybus-contract>)
set_tests_properties(least_privilege_nats PROPERTIES TIMEOUT 300 LABELS nats
                     ENVIRONMENT "${KB_TEST_ENV}")

# Membership changes under load (issue 38): a node lost for good (stream
# leader, lease bucket leader, neither), a rolling restart, a join; 0 lost,
# per-key order, the longest partition pause bounded.
kb_test(test_nats_membership ARGS $<TARGET_FILE:kb_membership_proc> TIMEOUT 600 LABELS nats)
target_sources(test_nats_membership PRIVATE support/nats_cluster.c)
target_link_libraries(test_nats_membership PRIVATE PkgConfig::NATS)
add_dependencies(test_nats_membership kb_membership_proc)
# Three servers and three processes under load, their pauses measured: alone.
set_tests_properties(test_nats_membership PROPERTIES RUN_SERIAL ON)

