#!/usr/bin/env bash
# The README example (examples/hello.c) reaching a TLS-only redis-server
# through a local stunnel4 tunnel, as docs/deployment.md ("Redis over TLS")
# shows: hiredis 0.14 speaks no TLS, so keybus connects to the tunnel's
# plain loopback port and stunnel verifies the server's certificate.
#   tests/redis_tls.sh EXAMPLE_HELLO
set -euo pipefail

hello=$1
dir=$(mktemp -d /tmp/keybus-tls-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# shellcheck source=support/ports.sh
. "$(dirname "$0")/support/ports.sh"

# A certificate for 127.0.0.1, signed by itself (the tunnel trusts exactly it).
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=127.0.0.1" \
  -addext "subjectAltName=IP:127.0.0.1" -keyout "$dir/server.key" -out "$dir/server.crt" 2>/dev/null

# redis-server with TLS only: no plain port.
tls_port=$(free_port)
redis-server --port 0 --tls-port "$tls_port" --bind 127.0.0.1 --dir "$dir" --save "" \
  --tls-cert-file "$dir/server.crt" --tls-key-file "$dir/server.key" \
  --tls-ca-cert-file "$dir/server.crt" --tls-auth-clients no \
  --daemonize no --logfile "$dir/redis.log" &
pids+=($!)
wait_port "$tls_port"

# The tunnel: plain on loopback for keybus, TLS with the certificate verified
# to the server.
plain_port=$(free_port)
cat >"$dir/stunnel.conf" <<EOF
foreground = yes
pid =
[redis]
client = yes
accept = 127.0.0.1:$plain_port
connect = 127.0.0.1:$tls_port
CAfile = $dir/server.crt
verifyPeer = yes
checkIP = 127.0.0.1
EOF
stunnel4 "$dir/stunnel.conf" >"$dir/stunnel.log" 2>&1 &
pids+=($!)
wait_port "$plain_port"

# Straight to the TLS port, keybus fails (it cannot speak TLS)...
if KEYBUS_TRANSPORT="redis://127.0.0.1:$tls_port" timeout 60 "$hello" >"$dir/direct.out" 2>&1; then
  echo "FAIL: the example ran against the TLS port without the tunnel" >&2
  exit 1
fi
# ...through the tunnel it runs as on a plain server.
out=$(KEYBUS_TRANSPORT="redis://127.0.0.1:$plain_port" timeout 120 "$hello")
echo "$out"
[ "$out" = "handled 3 events of order-123 in order" ] || {
  echo "FAIL: unexpected output; stunnel log:" >&2
  cat "$dir/stunnel.log" >&2
  exit 1
}
# The bytes did cross TLS: stunnel logs the verified server certificate.
grep -q "Certificate accepted" "$dir/stunnel.log" || {
  echo "FAIL: stunnel verified no certificate" >&2
  cat "$dir/stunnel.log" >&2
  exit 1
}
echo "ok: example over TLS through stunnel4 (tls-port $tls_port, tunnel $plain_port)"
