#!/usr/bin/env bash
# Installs the Debian packages keybus needs, only those missing.
# Used by both README commands and by .ci/run, so the list lives here only.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libck-dev liburcu-dev libhiredis-dev libnats-dev
  libcmocka-dev libbenchmark-dev
  redis-server redis-sentinel nats-server
  clang libclang-rt-dev
  gnuplot-nox jq
  tmux   # test_cli_ops drives `keybus top` in a terminal
  stunnel4 openssl   # redis_tls: keybus through a local TLS tunnel to a TLS-only redis-server
  libcjson-dev libmicrohttpd-dev systemtap-sdt-dev prometheus bpftrace
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done

# The JSON Schema validator of tests/check_formats.sh: any copy python3 imports will do.
python3 -c 'import jsonschema' 2>/dev/null || missing+=(python3-jsonschema)
# Node reads keybus-written Redis frames in test_redis_frames: any node on PATH will do.
command -v node >/dev/null 2>&1 || missing+=(nodejs)

if [ "${#missing[@]}" -gt 0 ]; then
  echo "keybus: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# redis-server, nats-server and prometheus packages may start system services; the tests
# run their own servers on free ports, so the system ones are left alone.
