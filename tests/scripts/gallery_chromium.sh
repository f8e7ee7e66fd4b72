#!/usr/bin/env bash
# Opens a job's index.html in headless Chromium and checks that every image loaded
# (naturalWidth > 0) and that the page shows one item per manifest record. Exit 77 (skipped, with
# the reason) where no Chromium is installed.
#   gallery_chromium.sh DP_LAUNCH
set -euo pipefail
dp_launch=$1
browser=""
for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null; then browser=$b; break; fi
done
if [[ -z $browser ]]; then
    echo "SKIP: no Chromium here (scripts/test.sh installs Debian's chromium when it can; apt-get install chromium)"
    exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Two ranks, a prompt with characters HTML must escape, and an invalid line kept in the manifest.
cat >"$out/p.jsonl" <<'JSONL'
{"prompt": "a small red circle on the left on a blue background"}
{"prompt": "a <b>green</b> \"square\" & more", "seed": 7}
{"prompt": ""}
{"prompt": "black background, white circle, large, in the middle"}
JSONL
"$dp_launch" -n 2 -q --steps 4 --skip-invalid --model "${DP_GALLERY_MODEL:-tiny-random-sd3}" -o "$out/run" "$out/p.jsonl" >/dev/null
# DP_GALLERY_BREAK=1 removes an image first: the check must then fail (a test of the test).
[[ ${DP_GALLERY_BREAK:-0} == 1 ]] && rm "$(ls "$out"/run/*.png | head -1)"
records=$(wc -l <"$out/run/manifest.jsonl")
ok=$(grep -c '"status":"ok"' "$out/run/manifest.jsonl" || true)
dom=$(timeout 60 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
      --virtual-time-budget=10000 --dump-dom "file://$out/run/index.html" 2>/dev/null)
attr() { grep -o "data-$1=\"[0-9]*\"" <<<"$dom" | head -1 | grep -o '[0-9]*'; }
loaded=$(attr images-loaded || true) images=$(attr images || true) items=$(attr items || true)
echo "manifest: $records records, $ok images; page: $items items, $images images, $loaded loaded"
[[ -n $loaded && -n $images && -n $items ]] || { echo "FAIL: the page's load check did not run"; exit 1; }
[[ $items -eq $records ]] || { echo "FAIL: $items items on the page, $records records in the manifest"; exit 1; }
[[ $images -eq $ok && $loaded -eq $ok ]] || { echo "FAIL: $loaded of $images images loaded, $ok expected"; exit 1; }
grep -q '&lt;b&gt;green&lt;/b&gt;' <<<"$dom" || { echo "FAIL: the prompt was not escaped"; exit 1; }
echo "PASS"
