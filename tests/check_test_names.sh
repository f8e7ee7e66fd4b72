#!/usr/bin/env bash
# ctest's doctest discovery splits test names on ';', which would register a test that runs
# nothing and passes. This check keeps every doctest name free of it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bad=$(grep -n 'TEST_CASE("[^"]*;' */*.cpp || true)
if [[ -n $bad ]]; then
    echo "test names must not contain ';' (ctest would split them):"
    echo "$bad"
    exit 1
fi
echo "all test names are safe for ctest"
