#!/usr/bin/env bash
# The format check must catch a file laid out otherwise: in a scratch copy of one real source file
# and .clang-format, indent a line by one more space and expect check_format.sh to fail naming it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/can_fail.sh"
mkdir -p "$scratch/launcher"
cp "$src/.clang-format" "$scratch/"
cp "$src/launcher/port.cpp" "$scratch/launcher/"
"$here/check_format.sh" "$scratch" >/dev/null || { echo "the unchanged copy already fails"; exit 1; }
sed -i '0,/^    /s//     /' "$scratch/launcher/port.cpp"
expect_caught "a line indented by one more space" "launcher/port.cpp is not formatted" "$here/check_format.sh" "$scratch"
[[ $fails == 0 ]] && echo "a file laid out otherwise is caught and named"
exit $fails
