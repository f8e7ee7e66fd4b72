#!/usr/bin/env bash
# Opens a job's gallery in headless Chromium and checks that every image loaded (naturalWidth > 0):
# a short run's one index.html shows one item per manifest record; a run of more than a page
# (launcher/gallery.h: 300 cards) has index.html with the prompts that have no image first, and
# page-2.html, page-3.html, ... that each load every image. Exit 77 (skipped, with the reason)
# where no Chromium is installed.
#   gallery_chromium.sh DP_LAUNCH
set -euo pipefail
dp_launch=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
page_images() {  # PAGE [DOM_FILE]: "CARDS IMAGES LOADED", or the skip (77) with its reason
    local counted rc=0
    counted=$("$here/page_images.sh" "$@") || rc=$?
    [[ $rc -eq 77 ]] && { echo "$counted"; exit 77; }
    [[ $rc -eq 0 ]] || { echo "FAIL: page_images.sh $1 exited $rc"; exit 1; }
    echo "$counted"
}
# Reads page_images' counts into items, images and loaded; a skip or a failure ends the script with
# its code and says why (a process substitution would lose the code: Chromium missing is a skip).
count_page() {
    local counted rc=0
    counted=$(page_images "$@") || rc=$?
    [[ $rc -eq 0 ]] || { echo "$counted"; exit $rc; }
    read -r items images loaded <<<"$counted"
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Two ranks, a prompt with characters HTML must escape, and an invalid line kept in the manifest.
cat >"$out/p.jsonl" <<'JSONL'
{"prompt": "a small red circle on the left on a blue background"}
{"prompt": "a <b>green</b> \"square\" & more", "seed": 7}
{"prompt": ""}
{"prompt": "black background, white circle, large, in the middle"}
JSONL
model=${DP_GALLERY_MODEL:-tiny-random-sd3}
"$dp_launch" -n 2 -q --steps 4 --skip-invalid --model "$model" -o "$out/run" "$out/p.jsonl" >/dev/null
# DP_GALLERY_BREAK=1 removes an image first: the check must then fail (a test of the test).
[[ ${DP_GALLERY_BREAK:-0} == 1 ]] && rm "$(ls "$out"/run/*.png | head -1)"
records=$(wc -l <"$out/run/manifest.jsonl")
ok=$(grep -c '"status":"ok"' "$out/run/manifest.jsonl" || true)
count_page "$out/run/index.html" "$out/dom.html"
echo "manifest: $records records, $ok images; page: $items items, $images images, $loaded loaded"
[[ $loaded != - && $images != - && $items != - ]] || { echo "FAIL: the page's load check did not run"; exit 1; }
[[ $items -eq $records ]] || { echo "FAIL: $items items on the page, $records records in the manifest"; exit 1; }
[[ $images -eq $ok && $loaded -eq $ok ]] || { echo "FAIL: $loaded of $images images loaded, $ok expected"; exit 1; }
grep -q '&lt;b&gt;green&lt;/b&gt;' "$out/dom.html" || { echo "FAIL: the prompt was not escaped"; exit 1; }
[[ ! -e $out/run/page-2.html ]] || { echo "FAIL: a run of 4 prompts has a page-2.html"; exit 1; }

# 700 lines, the 650th empty (invalid): index.html and page-2.html of 300 cards, page-3.html of 100.
awk 'BEGIN { for (i = 0; i < 700; i++) print (i == 649 ? "{\"prompt\": \"\"}" : "{\"prompt\": \"a red circle " i "\"}") }' \
    >"$out/long.jsonl"
"$dp_launch" -n 2 -q --steps 1 --skip-invalid --model "$model" -o "$out/long" "$out/long.jsonl" >/dev/null
[[ ${DP_GALLERY_BREAK:-0} == 2 ]] && rm "$out/long/00400-"*.png
for page in index.html page-2.html page-3.html; do
    count_page "$out/long/$page" "$out/$page.dom"
    echo "$page: $items items, $images images, $loaded loaded"
    [[ $loaded != - ]] || { echo "FAIL: $page: the page's load check did not run"; exit 1; }
    case $page in
        index.html) want_items=301 want_images=300 ;;  # the invalid line first, then the first page
        page-2.html) want_items=300 want_images=300 ;;
        page-3.html) want_items=100 want_images=99 ;;
    esac
    [[ $items -eq $want_items && $images -eq $want_images ]] ||
        { echo "FAIL: $page: $items items and $images images, $want_items and $want_images expected"; exit 1; }
    [[ $loaded -eq $images ]] || { echo "FAIL: $page: $loaded of $images images loaded"; exit 1; }
done
[[ ! -e $out/long/page-4.html ]] || { echo "FAIL: 700 records make a page-4.html"; exit 1; }
problems=$(grep -bo 'Without an image: 1' "$out/index.html.dom" | head -1 | cut -d: -f1)
first=$(grep -bo 'Page 1 of 3' "$out/index.html.dom" | head -1 | cut -d: -f1)
[[ -n $problems && -n $first && $problems -lt $first ]] ||
    { echo "FAIL: index.html does not list the invalid prompt before the first page's cards"; exit 1; }
grep -q 'href="page-3.html"' "$out/index.html.dom" || { echo "FAIL: index.html has no link to page-3.html"; exit 1; }
echo "PASS"
