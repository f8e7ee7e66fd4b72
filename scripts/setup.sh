#!/usr/bin/env bash
# Installs what is missing and builds dp-launch. Idempotent: on a ready machine it only runs an
# incremental build.
#
#   DP_BUILD_DIR  build folder (default: build)
#   DP_VENV       virtual environment holding the pinned torch wheel, shared by every checkout
#                 (default: ~/.cache/dp-launch/venv)
#   DP_WITH_TORCH=0  build the launcher only: no torch wheel, no worker side
#   DP_SETUP_NO_BUILD=1  install what is missing, build nothing
#   DP_BUILD_TARGETS  build only these targets (scripts/demo.sh: dp-launch dp-worker); default: all
set -euo pipefail

TORCH_VERSION=2.15.0  # the CUDA 13 build on PyPI; LibTorch comes from inside this wheel
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
with_torch=${DP_WITH_TORCH:-1}

log() { printf '[setup] %s\n' "$*" >&2; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# 1. Debian packages.
packages=(g++ make cmake ccache hyperfine time unzip bc libcli11-dev nlohmann-json3-dev doctest-dev libicu-dev libpng-dev libssl-dev libgloo-dev libsentencepiece-dev libyaml-cpp-dev python3)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3 may come from elsewhere (pyenv); only ask Debian for it when there is none at all.
if command -v python3 >/dev/null; then missing=("${missing[@]/python3/}"); fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [[ ${#missing[@]} -gt 0 ]]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The gallery test opens index.html in a headless browser: Debian's chromium, for the tests only.
# Where it cannot be installed that test is skipped with its reason; the set-up goes on.
if [[ ${DP_TEST_BROWSER:-0} == 1 ]] && ! command -v chromium >/dev/null && ! command -v google-chrome >/dev/null; then
    log "installing chromium (for the gallery test)"
    if ! (as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq chromium >/dev/null); then
        log "chromium could not be installed; the gallery test will be skipped"
    fi
fi

# 2. The pinned torch wheel, in a virtual environment outside the checkout.
cmake_args=(-DCMAKE_BUILD_TYPE=Release)
if [[ $with_torch == 1 ]]; then
    # A stamp written after a verified install keeps later runs from importing torch (2 s).
    ready="$venv/.dp-torch-$TORCH_VERSION"
    if [[ ! -f $ready || ! -d $(cat "$ready" 2>/dev/null) ]]; then
        if ! "$venv/bin/python" -c "import numpy, torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
            if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
                log "installing python3-venv"
                as_root apt-get update -qq
                DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3-venv >/dev/null
            fi
            log "installing torch==$TORCH_VERSION into $venv (a few GB, once per machine)"
            python3 -m venv "$venv"
            # numpy is torch's optional companion; without it every rank warns at import.
            "$venv/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy
        fi
        "$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' >"$ready"
    fi
    cmake_args+=(-DDP_WITH_TORCH=ON "-DDP_TORCH_PREFIX=$(cat "$ready")" "-DDP_PYTHON=$venv/bin/python")
else
    cmake_args+=(-DDP_WITH_TORCH=OFF)
fi

# DP_SETUP_NO_BUILD=1: the packages and the wheel only (scripts/sanitize.sh builds its own tree).
if [[ ${DP_SETUP_NO_BUILD:-0} == 1 ]]; then exit 0; fi

# 3. Configure once (CMake re-configures by itself when a CMakeLists.txt changes), then build.
mkdir -p "$build"
stamp="$build/.dp-setup-args"
if [[ ! -f $build/CMakeCache.txt || ! -f $stamp || "$(cat "$stamp")" != "${cmake_args[*]}" ]]; then
    log "configuring $build"
    if ! cmake -S "$root" -B "$build" "${cmake_args[@]}" >"$build/configure.log" 2>&1; then
        cat "$build/configure.log" >&2
        exit 1
    fi
    printf '%s' "${cmake_args[*]}" >"$stamp"
fi
targets=()
for t in ${DP_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
log "building${DP_BUILD_TARGETS:+ $DP_BUILD_TARGETS} (log: $build/build.log)"
if ! cmake --build "$build" -j "$(nproc)" "${targets[@]}" >"$build/build.log" 2>&1; then
    grep -E -A8 'error|Error' "$build/build.log" | head -80 >&2
    log "build failed; the whole log is $build/build.log"
    exit 1
fi
log "ready: $build/bin/dp-launch"
