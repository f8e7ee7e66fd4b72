#!/usr/bin/env bash
# Sets up (installs what is missing, builds) and runs the whole test suite through ctest.
# Extra arguments go to ctest, e.g. ./scripts/test.sh -L unit
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
DP_TEST_BROWSER=1 "$root/scripts/setup.sh"

status=0
# Two tests share the cores under -j: LibTorch's OpenMP threads, spinning between parallel regions
# (the default), take the other test's core. Sleeping instead cut two concurrent in-process test
# runs from 50-52 s to 40-41 s here; a job itself is left at the default.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@" || status=$?

# Say why each skipped test was skipped (GPU tests on a machine without one, for instance).
log="$build/Testing/Temporary/LastTest.log"
if [[ -f $log ]] && grep -q '^SKIPPED:' "$log"; then
    echo
    echo "Skipped tests and why:"
    awk '/^[0-9]+\/[0-9]+ Testing: /{name=$3} /^SKIPPED:/{print "  " name ": " substr($0, 10)}' "$log"
fi
# The launcher side again under AddressSanitizer + UndefinedBehaviorSanitizer (its own build
# folder; DP_TEST_SANITIZE=0 skips it).
if [[ ${DP_TEST_SANITIZE:-1} == 1 ]]; then
    echo
    echo "The launcher side under AddressSanitizer and UndefinedBehaviorSanitizer:"
    "$root/scripts/sanitize.sh" || status=1
fi
exit $status
