#!/usr/bin/env bash
# The format check must catch a file laid out otherwise: in a scratch copy of one real source file
# and .clang-format, indent a line by one more space and expect check_format.sh to fail naming it.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$(cd "$here/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/launcher"
cp "$src/.clang-format" "$scratch/"
cp "$src/launcher/port.cpp" "$scratch/launcher/"
"$here/check_format.sh" "$scratch" >/dev/null || { echo "the unchanged copy already fails"; exit 1; }
sed -i '0,/^    /s//     /' "$scratch/launcher/port.cpp"
if out=$("$here/check_format.sh" "$scratch"); then
    echo "not caught: a line indented by one more space"
    exit 1
fi
grep -qF "launcher/port.cpp is not formatted" <<<"$out" || { echo "caught, but not named: $out"; exit 1; }
echo "a file laid out otherwise is caught and named"
