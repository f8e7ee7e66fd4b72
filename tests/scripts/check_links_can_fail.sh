#!/usr/bin/env bash
# The link check must catch a broken link and pass good ones: in scratch trees, a README.md with a
# link to a file that does not exist must fail naming it, and a tree whose README.md and docs/
# page hold only good links (a page, an image, a link with an anchor, a link back up, an external
# URL, a pure anchor, a link inside code) must pass.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fails=0

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
if out=$("$here/check_links.sh" "$bad"); then
    echo "not caught: a link to docs/missing.md"
    fails=1
elif ! grep -qF "README.md:11: docs/missing.md#somewhere" <<<"$out"; then
    echo "caught, but the report does not name README.md:11 and docs/missing.md#somewhere: $out"
    fails=1
fi

broken_image=$scratch/broken_image
cp -r "$good" "$broken_image"
rm "$broken_image/docs/picture.png"
if out=$("$here/check_links.sh" "$broken_image"); then
    echo "not caught: image links to a missing docs/picture.png"
    fails=1
elif ! grep -qF "README.md:3: docs/picture.png" <<<"$out" || ! grep -qF "docs/guide.md:5: picture.png" <<<"$out"; then
    echo "caught, but the report does not name both image links: $out"
    fails=1
fi

"$here/check_links.sh" "$(cd "$here/.." && pwd)" >/dev/null || { echo "the real README or docs/ have a broken link"; fails=1; }
[[ $fails == 0 ]] && echo "the link check catches a broken link and passes good ones"
exit $fails
