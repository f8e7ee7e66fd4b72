# Sourced by the *_can_fail.sh scripts, which prove that a check of the suite fails when it should:
# a scratch folder removed at exit, a copy of the sources to break, and the one way a check is
# expected to fail. Sets `here` (tests/), `src` (the checkout), `scratch` and `fails`.
here=$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)
src=$(cd "$here/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fails=0

# copy_sources DEST: the folders the source checks read, copied afresh to DEST.
copy_sources() {
    rm -rf "$1" && mkdir -p "$1"
    for d in launcher cli protocol strategies runtime; do cp -r "$src/$d" "$1/"; done
}

# expect_caught WHAT PATTERNS CHECK [ARGS...]: CHECK must fail, and its report contain each line of
# PATTERNS (fixed strings). A miss is said, naming WHAT, and counted in `fails`.
expect_caught() {
    local what=$1 patterns=$2 out pattern
    shift 2
    if out=$("$@"); then
        echo "not caught: $what"
        fails=1
        return
    fi
    while IFS= read -r pattern; do
        [[ -z $pattern ]] && continue
        if ! grep -qF -- "$pattern" <<<"$out"; then
            echo "caught $what, but the report does not say '$pattern': $out"
            fails=1
        fi
    done <<<"$patterns"
}
