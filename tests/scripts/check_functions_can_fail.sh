#!/usr/bin/env bash
# The function check must catch a function too long and one too complex: in a scratch copy of the
# sources, add one of each and expect check_functions.sh to fail naming it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/can_fail.sh"
python=${1:-python3}
"$python" -m lizard --version >/dev/null 2>&1 || { echo "skipped: $python has no lizard"; exit 77; }
long() {  # a function of $1 statements
    printf 'int dp_long_function(int x) {\n'
    for ((i = 0; i < $1; ++i)); do printf '    x = x * 3 + %d;\n' "$i"; done
    printf '    return x;\n}\n'
}
complex() {  # a function of $1 branches
    printf 'int dp_complex_function(int x) {\n'
    for ((i = 0; i < $1; ++i)); do printf '    if (x == %d) return %d;\n' "$i" "$((i + 1))"; done
    printf '    return 0;\n}\n'
}
copy_sources "$scratch/tree"
long 120 >>"$scratch/tree/launcher/port.cpp"
expect_caught "a 120-line function" "dp_long_function" "$here/check_functions.sh" "$scratch/tree" "$python"
copy_sources "$scratch/tree"
complex 45 >>"$scratch/tree/strategies/mesh.cpp"
expect_caught "a function of complexity 46" "dp_complex_function" "$here/check_functions.sh" "$scratch/tree" "$python"
[[ $fails == 0 ]] && echo "a function too long or too complex is caught and named"
exit $fails
