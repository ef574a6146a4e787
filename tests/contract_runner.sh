#!/usr/bin/env bash
# keybus-contract's own promises (docs/transports.md): a failing case is
# named and makes the exit status 1, a usage error makes it 2, and -l lists
# the cases. A case is made to fail by a setting that breaks it:
# limits.max_headers below the 3 headers the headers case sends.
#   tests/contract_runner.sh KEYBUS_CONTRACT
set -uo pipefail
contract=$1
# a failed case leaves its bus open (the check jumps out of it): not a leak
# to report in sanitizer builds, where it would change the exit status
export ASAN_OPTIONS=detect_leaks=0
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$contract" -c headers_travel_with_events -X limits.max_headers=2 mem://)
rc=$?
echo "$out"
[ "$rc" -eq 1 ] || fail "a failing case exited $rc, not 1"
grep -q '^\[   FAILED \] headers_travel_with_events' <<<"$out" || fail "the failed case is not named"
grep -q 'mem:// contract: 0 passed, 0 skipped, 1 failed' <<<"$out" || fail "no summary"

"$contract" -c no_such_case mem:// && fail "an unknown case was accepted"
[ $? -eq 2 ] || fail "an unknown case did not exit 2"
"$contract" -X novalue mem:// && fail "-X without = was accepted"
"$contract" nosuch://x; [ $? -eq 2 ] || fail "an unknown scheme did not exit 2"
[ "$("$contract" -l | wc -l)" -eq 10 ] || fail "-l does not list the 10 cases"
echo "ok"
