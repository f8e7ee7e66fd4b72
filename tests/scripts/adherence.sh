#!/usr/bin/env bash
# The shipped model on prompts of attribute combinations held out of its training, at the default
# settings, through dp-launch with two ranks; dp-adherence then requires each attribute to be
# right at least as often as docs/built-in-model.md's measured figures, less a margin.
#   adherence.sh DP_LAUNCH DP_ADHERENCE PROMPTS MIN_BACKGROUND MIN_COLOUR MIN_KIND MIN_POSITION
set -euo pipefail
dp_launch=$1 adherence=$2 prompts=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$dp_launch" -n 2 -q -o "$out" "$prompts"
"$adherence" "$out" --min-background "$4" --min-colour "$5" --min-kind "$6" --min-position "$7"
