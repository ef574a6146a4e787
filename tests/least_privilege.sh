#!/usr/bin/env bash
# The contract suite (keybus-contract, contract/cases.c) as a user with the least
# privileges docs/security.md gives: on Redis an ACL user limited to kb:*
# keys and the commands keybus sends; on NATS a user of an account of its
# own, limited to keybus's subjects, the JetStream API and its KV buckets.
# The default user / other accounts keep full rights; nothing else is run.
#   tests/least_privilege.sh redis|nats KEYBUS_CONTRACT
set -euo pipefail

kind=$1
contract=$2
dir=$(mktemp -d /tmp/keybus-acl-XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# shellcheck source=support/ports.sh
. "$(dirname "$0")/support/ports.sh"
port=$(free_port)

if [ "$kind" = redis ]; then
  # docs/security.md, "Redis": the ACL line, word for word.
  # (admin only reads the ACL log afterwards)
  cat >"$dir/users.acl" <<'EOF'
user default off
user admin on >admin-secret ~* &* +@all
user keybus on >kb-secret ~kb:* resetchannels -@all +auth +ping +select +role +config|get +eval +multi +exec +watch +unwatch +exists +get +set +mget +del +pexpire +hget +hset +hsetnx +hdel +sadd +zadd +zrem +zscore +zrangebyscore +zremrangebyscore +xadd +xack +xdel +xlen +xrange +xpending +xreadgroup +xautoclaim +xgroup|create +xgroup|delconsumer +xinfo|groups +xinfo|stream +xinfo|consumers +wait
EOF
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --daemonize no \
    --logfile "$dir/server.log" --aclfile "$dir/users.acl" &
  pid=$!
  wait_port "$port"
  status=0
  "$contract" -K redis.lease_ttl_ms=1000 "redis://keybus:kb-secret@127.0.0.1:$port" || status=$?
  # nothing refused, even what keybus would get over (the ACL log names it)
  denied=$(redis-cli -p "$port" --user admin --pass admin-secret --no-auth-warning ACL LOG)
  if [ -n "$denied" ]; then
    echo "FAIL: the server refused keybus:" >&2
    echo "$denied" | head -40 >&2
    status=1
  fi
  exit "$status"
fi

# docs/security.md, "NATS": the account and the user, word for word.
cat >"$dir/server.conf" <<EOF
listen: 127.0.0.1:$port
jetstream { store_dir: "$dir/js" }
accounts {
  KEYBUS {
    jetstream: enabled
    users: [
      { user: keybus, password: kb-secret, permissions: {
          publish: { allow: ["kb.>", "\$JS.API.INFO", "\$JS.API.STREAM.>", "\$JS.API.CONSUMER.>",
                             "\$JS.API.DIRECT.GET.>", "\$JS.ACK.>", "\$KV.keybus_leases.>",
                             "\$KV.keybus_leases_runs.>"]
                   deny: ["\$JS.API.STREAM.DELETE.>", "\$JS.API.STREAM.PURGE.>"] }
          subscribe: { allow: ["_INBOX.>"] }
      } }
    ]
  }
}
EOF
nats-server -c "$dir/server.conf" -l "$dir/server.log" &
pid=$!
wait_port "$port"
status=0
"$contract" -K nats.lease_ttl_ms=1000 -K nats.ack_wait_ms=2000 \
  "nats://keybus:kb-secret@127.0.0.1:$port" || status=$?
# nothing refused, even what keybus would get over (the server logs it)
if grep -qi "permissions violation" "$dir/server.log"; then
  echo "FAIL: the server refused keybus:" >&2
  grep -i "permissions violation" "$dir/server.log" | sed 's/^.*\] //' | sort | uniq -c | head -20 >&2
  status=1
fi
exit "$status"
