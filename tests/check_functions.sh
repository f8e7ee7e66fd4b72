#!/usr/bin/env bash
# Functions a reader can hold: in cli/, images/, launcher/, protocol/, runtime/, serve/ and strategies/
# under ROOT (default: this checkout), no function is over 100 lines (of code, or in all) or of
# cyclomatic complexity 40 or more, as lizard (PyPI) counts them, but the data tables listed
# below. Lists each one and exits 1; exits 77 (skipped, with the reason) when PYTHON has no lizard.
#   tests/check_functions.sh [ROOT] [PYTHON]
set -uo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
python=${2:-python3}
cd "$root" || exit 2
# Data tables: one row per option, long by nature and simple (complexity under 20).
tables='dp::cli::job_option_table|dp::cli::launch_option_table|dp::protocol::call_arguments'
if ! "$python" -m lizard --version >/dev/null 2>&1; then
    echo "skipped: $python has no lizard (scripts/setup.sh installs it beside the torch wheel: pip install lizard)"
    exit 77
fi
out=$("$python" -m lizard -l cpp -C 39 -L 100 -T nloc=100 -w cli images launcher protocol runtime serve strategies 2>/dev/null |
      grep -E ': warning: ' | grep -vE " ($tables) has ")
if [[ -n $out ]]; then
    echo "functions over 100 lines or of complexity 40 or more (split them into named steps):"
    echo "$out" | sed 's/^/  /'
    exit 1
fi
echo "no function over 100 lines or of complexity 40 in cli/ images/ launcher/ protocol/ runtime/ serve/ strategies/"
