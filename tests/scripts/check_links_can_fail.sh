#!/usr/bin/env bash
# The link check must catch a broken link and pass good ones: in scratch trees, a README.md with a
# link to a file that does not exist must fail naming it, and a tree whose README.md and docs/
# page hold only good links (a page, an image, a link with an anchor, a link back up, an external
# URL, a pure anchor, a link inside code) must pass.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/can_fail.sh"

good=$scratch/good
mkdir -p "$good/docs"
printf 'png' >"$good/docs/picture.png"
cat >"$good/README.md" <<'MD'
# Good

![A picture](docs/picture.png) and [the guide](docs/guide.md#a-section), [the guide again](docs/guide.md?plain=1),
[the site](https://example.com/missing.md), [mail](mailto:someone@example.com), [above](#good).
Code is not a link: `[x](nowhere.md)`.

```
[not a link either](nowhere.md)
```
MD
cat >"$good/docs/guide.md" <<'MD'
# Guide

## A section

Back to the [README](../README.md), and the [picture](picture.png "a title").
MD
if ! out=$("$here/check_links.sh" "$good"); then
    echo "good links reported broken: $out"
    fails=1
elif ! grep -qF "links resolve under $good" <<<"$out"; then
    echo "good links passed without the success line: $out"
    fails=1
fi

bad=$scratch/bad
cp -r "$good" "$bad"
printf '\nSee [the missing page](docs/missing.md#somewhere) too.\n' >>"$bad/README.md"
expect_caught "a link to docs/missing.md" "README.md:11: docs/missing.md#somewhere" "$here/check_links.sh" "$bad"

broken_image=$scratch/broken_image
cp -r "$good" "$broken_image"
rm "$broken_image/docs/picture.png"
expect_caught "image links to a missing docs/picture.png" "README.md:3: docs/picture.png"$'\n'"docs/guide.md:5: picture.png" \
    "$here/check_links.sh" "$broken_image"

"$here/check_links.sh" "$src" >/dev/null || { echo "the real README or docs/ have a broken link"; fails=1; }
[[ $fails == 0 ]] && echo "the link check catches a broken link and passes good ones"
exit $fails
