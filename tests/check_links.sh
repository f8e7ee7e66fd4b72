#!/usr/bin/env bash
# Every relative link of the documentation names a file that exists, checked under ROOT (default:
# this checkout): in README.md and docs/*.md, each [text](target) and ![alt](target) outside code
# (fenced blocks and `inline code` are skipped), less http:, https:, mailto: and pure #anchor
# links, with a #anchor suffix and a ?query stripped, resolves from the folder of the file that
# holds it. Anchors themselves are not checked.
# Exits 1 listing every broken link as file:line: target.
set -uo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root" || exit 2
status=0
files=()
[[ -f README.md ]] && files+=(README.md)
for f in docs/*.md; do [[ -f $f ]] && files+=("$f"); done
for file in "${files[@]}"; do
    dir=$(dirname "$file")
    # file:line<TAB>target for every link outside code.
    hits=$(awk '
        /^[[:space:]]*(```|~~~)/ { fenced = !fenced; next }
        fenced { next }
        {
            line = $0
            gsub(/`[^`]*`/, "", line)
            while (match(line, /!?\[[^]]*\]\([^)]*\)/)) {
                link = substr(line, RSTART, RLENGTH)
                line = substr(line, RSTART + RLENGTH)
                sub(/^!?\[[^]]*\]\(/, "", link)
                sub(/\)$/, "", link)
                sub(/^[[:space:]]+/, "", link)
                sub(/[[:space:]].*$/, "", link)   # a title: [text](target "title")
                sub(/^</, "", link); sub(/>$/, "", link)
                print FNR "\t" link
            }
        }' "$file")
    while IFS=$'\t' read -r line target; do
        [[ -z $target ]] && continue
        case $target in
            http:* | https:* | mailto:* | '#'*) continue ;;
        esac
        path=${target%%#*}
        path=${path%%\?*}
        [[ -z $path ]] && continue
        if [[ $path == /* ]]; then resolved=.$path; else resolved=$dir/$path; fi  # /x: from ROOT, as GitHub reads it
        if [[ ! -e $resolved ]]; then
            echo "$file:$line: $target"
            status=1
        fi
    done <<<"$hits"
done
if [[ $status == 0 ]]; then echo "links resolve under $root"; fi
exit $status
