#!/usr/bin/env bash
# Opens an HTML page of a dp-launch gallery in headless Chromium and prints what its load check
# counted: "CARDS IMAGES LOADED" (the .item cards, the <img> elements, those that loaded with
# naturalWidth > 0), or "- - -" when the check did not run. With DOM_FILE, the page's DOM after
# loading is written there. Exit 77 (with the reason) where no Chromium is installed.
#   page_images.sh PAGE.html [DOM_FILE]
set -euo pipefail
page=$1
browser=""
for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null; then browser=$b; break; fi
done
if [[ -z $browser ]]; then
    echo "SKIP: no Chromium here (scripts/test.sh installs Debian's chromium when it can; apt-get install chromium)"
    exit 77
fi
dom=$(timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
      --virtual-time-budget=10000 --dump-dom "file://$(realpath "$page")" 2>/dev/null || true)
[[ -n ${2:-} ]] && printf '%s\n' "$dom" >"$2"
attr() { grep -o "data-$1=\"[0-9]*\"" <<<"$dom" | head -1 | grep -o '[0-9]*' || echo -; }
echo "$(attr items) $(attr images) $(attr images-loaded)"
