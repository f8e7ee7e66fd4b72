#!/usr/bin/env bash
# Every C++ file under ROOT (default: this checkout) is as .clang-format lays it out. Lists each
# file that differs, with clang-format's first complaint, and exits 1; 2 without clang-format.
# Fix with: git ls-files '*.cpp' '*.h' '*.cu' | xargs clang-format -i
set -uo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root" || exit 2
format=${CLANG_FORMAT:-clang-format}
if ! command -v "$format" >/dev/null; then
    echo "clang-format is not installed (scripts/setup.sh installs it: apt-get install clang-format)"
    exit 2
fi
if [[ -d .git || -f .git ]] && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.cpp' '*.h' '*.cu' '*.hpp')
else
    mapfile -t files < <(find . -path ./build -prune -o -path './build-*' -prune -o \
        \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.hpp' \) -print | sed 's|^\./||')
fi
# One run over every file; each complaint starts "FILE:LINE:COL: error:".
out=$(printf '%s\0' "${files[@]}" | xargs -0 -r "$format" --dry-run --Werror 2>&1)
bad=$(grep -oE '^[^:]+:[0-9]+:[0-9]+: error' <<<"$out" | cut -d: -f1 | sort -u)
if [[ -n $bad ]]; then
    while read -r f; do
        echo "$f is not formatted as .clang-format says, first at:"
        grep -m1 -A2 -F "$f:" <<<"$out" | sed 's/^/  /'
    done <<<"$bad"
    exit 1
fi
echo "${#files[@]} files are formatted as .clang-format says"
