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
#
# On a fresh machine the torch wheel (about 4 GB with its CUDA libraries) downloads while the
# Debian packages install and the launcher side, which needs no LibTorch, builds: the slowest
# steps overlap (docs/building.md, "Time to a first image").
set -euo pipefail

TORCH_VERSION=2.15.0  # the CUDA 13 build on PyPI; LibTorch comes from inside this wheel
LIZARD_VERSION=1.24.3  # the function check's counter (tests/check_functions.sh)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
with_torch=${DP_WITH_TORCH:-1}

log() { printf '[setup] %s\n' "$*" >&2; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
apt_install() {  # PACKAGES...: quietly, after one update per run
    if [[ -z ${apt_updated:-} ]]; then as_root apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

# The pinned torch wheel, in a virtual environment outside the checkout. A stamp written after a
# verified install keeps later runs from importing torch (2 s).
ready="$venv/.dp-torch-$TORCH_VERSION"
torch_ready() { [[ -f $ready && -d $(cat "$ready" 2>/dev/null) ]]; }
torch_pid=""
torch_log="$venv.install.log"
start_torch_install() {  # in the background; wait_for_torch collects it
    log "installing torch==$TORCH_VERSION into $venv in the background (a few GB, once per machine)"
    mkdir -p "$(dirname "$venv")"
    (
        set -e
        if ! "$venv/bin/python" -c "import numpy, torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
            python3 -m venv "$venv"
            # numpy is torch's optional companion; without it every rank warns at import.
            "$venv/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy
        fi
        "$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' >"$ready"
    ) >"$torch_log" 2>&1 &
    torch_pid=$!
}
wait_for_torch() {
    [[ -n $torch_pid ]] || return 0
    if ! wait "$torch_pid"; then
        cat "$torch_log" >&2
        log "installing torch==$TORCH_VERSION failed (the log above is $torch_log)"
        exit 1
    fi
    torch_pid=""
    log "torch==$TORCH_VERSION is ready"
}
has_venv() { command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null; }
# A set-up that fails part-way stops its background install too (the next run starts it again).
trap '[[ -n $torch_pid ]] && kill "$torch_pid" 2>/dev/null; true' EXIT

# Started first when Python can make a virtual environment already: it downloads meanwhile.
if [[ $with_torch == 1 ]] && ! torch_ready && has_venv; then start_torch_install; fi

# 1. Debian packages.
packages=(g++ make cmake ccache clang-format hyperfine time unzip bc libcli11-dev nlohmann-json3-dev doctest-dev libicu-dev libpng-dev zlib1g-dev libjpeg62-turbo-dev libwebp-dev pkg-config libssl-dev libgloo-dev libsentencepiece-dev libyaml-cpp-dev libboost-dev libcpp-httplib-dev libsqlite3-dev curl python3)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3 may come from elsewhere (pyenv); only ask Debian for it when there is none at all.
if command -v python3 >/dev/null; then missing=("${missing[@]/python3/}"); fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [[ ${#missing[@]} -gt 0 ]]; then
    log "installing Debian packages: ${missing[*]}"
    apt_install "${missing[@]}"
fi

# The gallery test opens index.html in a headless browser: Debian's chromium, for the tests only.
# Where it cannot be installed that test is skipped with its reason; the set-up goes on.
if [[ ${DP_TEST_BROWSER:-0} == 1 ]] && ! command -v chromium >/dev/null && ! command -v google-chrome >/dev/null; then
    log "installing chromium (for the gallery test)"
    if ! apt_install chromium; then
        log "chromium could not be installed; the gallery test will be skipped"
    fi
fi

if [[ $with_torch == 1 ]] && ! torch_ready && [[ -z $torch_pid ]]; then
    if ! has_venv; then
        log "installing python3-venv"
        apt_install python3-venv
    fi
    start_torch_install
fi

# DP_SETUP_NO_BUILD=1: the packages and the wheel only (scripts/sanitize.sh builds its own tree).
if [[ ${DP_SETUP_NO_BUILD:-0} == 1 ]]; then
    wait_for_torch
    exit 0
fi

# 2. Configure (again only when the arguments change; CMake re-configures by itself when a
# CMakeLists.txt does), then build.
mkdir -p "$build"
stamp="$build/.dp-setup-args"
configure() {  # CMAKE_ARGS...
    if [[ ! -f $build/CMakeCache.txt || ! -f $stamp || "$(cat "$stamp")" != "$*" ]]; then
        log "configuring $build"
        if ! cmake -S "$root" -B "$build" "$@" >"$build/configure.log" 2>&1; then
            cat "$build/configure.log" >&2
            exit 1
        fi
        printf '%s' "$*" >"$stamp"
    fi
}
build_targets() {  # TARGETS... (none: all)
    local targets=()
    for t in "$@"; do targets+=(--target "$t"); done
    log "building${*:+ $*} (log: $build/build.log)"
    if ! cmake --build "$build" -j "$(nproc)" "${targets[@]}" >"$build/build.log" 2>&1; then
        grep -E -A8 'error|Error' "$build/build.log" | head -80 >&2
        log "build failed; the whole log is $build/build.log"
        exit 1
    fi
}
cmake_args=(-DCMAKE_BUILD_TYPE=Release)
read -r -a wanted <<<"${DP_BUILD_TARGETS:-}"
if [[ -n $torch_pid ]]; then
    # While the wheel installs: the launcher side, which needs no LibTorch. Re-configured with it
    # below, only the few files that print LibTorch's version compile again.
    configure "${cmake_args[@]}" -DDP_WITH_TORCH=OFF
    build_targets dp-launch
    wait_for_torch
fi
if [[ $with_torch == 1 ]]; then
    # lizard, which the suite's function check runs (tests/check_functions.sh), beside the wheel.
    if ! "$venv/bin/python" -m lizard --version >/dev/null 2>&1; then
        "$venv/bin/pip" install -q --disable-pip-version-check "lizard==$LIZARD_VERSION" ||
            log "lizard could not be installed; the function check will be skipped"
    fi
    cmake_args+=(-DDP_WITH_TORCH=ON "-DDP_TORCH_PREFIX=$(cat "$ready")" "-DDP_PYTHON=$venv/bin/python")
else
    cmake_args+=(-DDP_WITH_TORCH=OFF)
fi
configure "${cmake_args[@]}"
build_targets "${wanted[@]}"
log "ready: $build/bin/dp-launch"
