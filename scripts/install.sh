#!/usr/bin/env bash
# Installs dp-launch under PREFIX (default ~/.local): PREFIX/bin/dp-launch and dp-worker, and the
# shipped models in PREFIX/share/dp-launch/models, where dp-launch finds them from any folder.
# Builds first what is missing (scripts/setup.sh: Debian packages, the pinned torch wheel, the
# build of dp-launch and dp-worker), then runs `cmake --install`.
#
#   scripts/install.sh [PREFIX]
#
# dp-worker keeps using the LibTorch of the torch wheel it was built against (DP_VENV, default
# ~/.cache/dp-launch/venv): leave that environment in place.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
prefix=${1:-$HOME/.local}
if [[ $# -gt 1 || $prefix == -* ]]; then
    echo "usage: scripts/install.sh [PREFIX]   (default ~/.local)" >&2
    exit 2
fi
DP_BUILD_TARGETS=${DP_BUILD_TARGETS:-dp-launch dp-worker} "$root/scripts/setup.sh"
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
cmake --install "$build" --prefix "$prefix" >"$build/install.log" || { cat "$build/install.log" >&2; exit 1; }
echo "installed: $prefix/bin/dp-launch ($("$prefix/bin/dp-launch" --version))"
case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) echo "put it on PATH: export PATH=\"$prefix/bin:\$PATH\"   (e.g. in ~/.bashrc)" ;;
esac
