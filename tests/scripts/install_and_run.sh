#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then the installed dp-launch, found on PATH, runs the main
# job on the shipped default model from an unrelated folder, says its commit, and a copy of the
# binary without its share/ folder says where it looked for the model.
#
#   install_and_run.sh CMAKE BUILD_DIR SOURCE_DIR
set -euo pipefail
cmake=$1 build=$2 src=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$cmake" --install "$build" --prefix "$work/prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
for f in bin/dp-launch bin/dp-worker share/dp-launch/models/shapes-sd3/model_index.json; do
    [[ -e $work/prefix/$f ]] || fail "$f was not installed"
done

mkdir -p "$work/elsewhere"
cd "$work/elsewhere"
export PATH="$work/prefix/bin:$PATH"
[[ $(command -v dp-launch) == "$work/prefix/bin/dp-launch" ]] || fail "dp-launch on PATH is $(command -v dp-launch)"
out=$(dp-launch -n 2 --prompt "a red circle" --prompt "a blue square" --steps 2 -q -o imgs) || fail "the job: $out"
[[ $out == "dp-launch: 2 images, 0 failed, 0 invalid, 0 not run"* ]] || fail "summary: $out"
[[ $(ls imgs/*.png | wc -l) == 2 ]] || fail "images: $(ls imgs)"
grep -q "/share/dp-launch/models/shapes-sd3" imgs/manifest.jsonl || fail "the model is not the installed one"

# --version names the commit the tree was built from.
version=$(dp-launch --version)
if git -C "$src" rev-parse --short=12 HEAD >/dev/null 2>&1; then
    head=$(git -C "$src" rev-parse --short=12 HEAD)
    [[ $version == "dp-launch "*"(commit $head"* ]] || fail "--version says '$version', HEAD is $head"
fi

# A binary copied alone: missing input (66) naming where it looked, never a crash.
cp "$work/prefix/bin/dp-launch" "$work/alone"
set +e
err=$("$work/alone" --prompt x -q -o imgs2 2>&1)
code=$?
set -e
[[ $code == 66 ]] || fail "a lone binary exited $code (66: missing input): $err"
[[ $err == *"share/dp-launch/models/shapes-sd3"* && $err == *"DP_MODELS_DIR"* ]] || fail "lone binary: $err"
echo "installed, ran from $work/elsewhere: $out"
