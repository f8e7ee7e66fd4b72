#!/usr/bin/env bash
# Copies the Debian headers and libraries the build needs into .deps/ (ignored by git), for a
# machine without network or Debian's -dev packages, such as a lent GPU box: carry .deps along
# and scripts/gpu-check.sh uses it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=$root/.deps
rm -rf "$deps" && mkdir -p "$deps/include" "$deps/lib"
for d in CLI nlohmann doctest gloo unicode; do cp -r "/usr/include/$d" "$deps/include/"; done
cp /usr/include/sentencepiece_processor.h /usr/include/sentencepiece_trainer.h "$deps/include/"
cp /usr/include/png*.h /usr/include/zlib.h /usr/include/zconf.h "$deps/include/" 2>/dev/null || true
cp -r /usr/include/openssl "$deps/include/"
cp -r /usr/include/x86_64-linux-gnu/openssl/* "$deps/include/openssl/" 2>/dev/null || true
lib=/usr/lib/x86_64-linux-gnu
for l in libicuuc libicui18n libicudata libpng16 libcrypto libsentencepiece; do cp -P "$lib/$l".so* "$deps/lib/"; done
du -sh "$deps"
