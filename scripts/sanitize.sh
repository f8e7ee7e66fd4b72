#!/usr/bin/env bash
# The test suites under AddressSanitizer + UndefinedBehaviorSanitizer, in a build folder of their
# own (build-sanitize/): any memory error, leak or undefined behaviour fails the test it happens in.
#   scripts/sanitize.sh            the launcher side (no LibTorch): unit and integration tests
#   scripts/sanitize.sh --all      also the worker side (LibTorch is not instrumented; our code is)
# Extra arguments after the mode go to ctest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=launcher
if [[ ${1:-} == --all ]]; then mode=all; shift; fi
build=${DP_SANITIZE_BUILD_DIR:-$root/build-sanitize-$mode}
# The packages (and, for --all, the torch wheel), without building the ordinary tree.
DP_SETUP_NO_BUILD=1 DP_WITH_TORCH=$([[ $mode == all ]] && echo 1 || echo 0) "$root/scripts/setup.sh" >/dev/null
# -O1 -g1: what the sanitizers need for their reports (line tables), at half the compile time of
# -O2 -g (docs/testing.md, "Where the time goes").
args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DDP_SANITIZE=ON)
if [[ $mode == all ]]; then
    venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
    args+=(-DDP_WITH_TORCH=ON "-DDP_TORCH_PREFIX=$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')")
else
    args+=(-DDP_WITH_TORCH=OFF)
fi
mkdir -p "$build"
cmake -S "$root" -B "$build" "${args[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$build/build.log" 2>&1 || { grep -E -A8 'error' "$build/build.log" | head -60; exit 1; }
# halt_on_error: the first report fails the process. LibTorch is not built with ASan, so leaks it
# holds at exit are not ours to report there.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=$([[ $mode == all ]] && echo 0 || echo 1)}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# The tests that bound the launcher's peak memory do not apply: ASan's shadow memory and
# quarantine multiply every process's resident size.
# The unit tests (no processes beyond the test itself) as many at a time as there are cores; the
# others one at a time. A failed test runs once more: the instrumented processes start several
# times slower, which the tests' few-second waits for real processes and signals can miss under
# load; a sanitizer report is not a timing and fails again.
skip="memory stays bounded|memory is bounded"
status=0
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --repeat until-pass:2 -L unit -E "$skip" "$@" || status=1
ctest --test-dir "$build" --output-on-failure -j 1 --repeat until-pass:2 -LE "unit|gpu" -E "$skip" "$@" || status=1
exit $status
