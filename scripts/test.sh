#!/usr/bin/env bash
# Build keybus and run every test. KEYBUS_SANITIZE=address|thread builds the
# sanitizer flavour in its own directory. Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh

san="${KEYBUS_SANITIZE:-}"
unset KEYBUS_SANITIZE   # a build switch, not a keybus configuration key for the tests
dir="build${san:+-$san}"
jobs="$(nproc)"
cmake -S . -B "$dir" -DKEYBUS_WERROR=ON -DKEYBUS_SANITIZE="$san" \
  -DCMAKE_BUILD_TYPE="$([ -n "$san" ] && echo Debug || echo RelWithDebInfo)" >/dev/null
cmake --build "$dir" -j"$jobs"

if [ -z "$san" ]; then
  # The README's embedding example, built only from the installed headers and pkg-config.
  prefix="$(mktemp -d /tmp/keybus-install-XXXXXX)"
  trap 'rm -rf "$prefix"' EXIT
  cmake --install "$dir" --prefix "$prefix" >/dev/null
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
  # as README.md says: the library's directory as the program's RPATH
  cc -std=c11 -Wall -Werror examples/hello.c $(pkg-config --cflags --libs keybus) \
     -Wl,-rpath,"$(pkg-config --variable=libdir keybus)" -o "$dir/hello-installed"
  # a -D as its own flag, not inside the install path (mktemp may spell "-D")
  case " $(pkg-config --cflags keybus)" in
    *" -D"*|*x86_64-linux-gnu*) echo "pkg-config --cflags keybus carries a dependency's flags" >&2; exit 1;;
  esac
  "$dir/hello-installed" | grep "handled 3 events of order-123 in order" >/dev/null \
    || { echo "examples/hello.c against the installed library: unexpected output" >&2; exit 1; }
  echo "examples/hello.c: built with pkg-config against the install and ran"
  # The long-running consumer (tests/test_drain.c signals the build's own copy).
  cc -std=c11 -Wall -Werror examples/consumer.c $(pkg-config --cflags --libs keybus) \
     -Wl,-rpath,"$prefix/lib" -o "$dir/consumer-installed"
  echo "examples/consumer.c: built with pkg-config against the install"
fi

cd "$dir"
ctest --output-on-failure -j"$jobs" --timeout 600
