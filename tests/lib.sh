# lib.sh: helpers for the shell tests (sourced).  Exit codes follow
# Automake: 0 pass, 1 fail, 77 skip, 99 hard error.
: "${abs_top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${abs_top_srcdir:=$abs_top_builddir}"
: "${MPIEXEC:=mpiexec}"
: "${MPIEXEC_NP:=-n}"
bindir="$abs_top_builddir/apps"
configs="$abs_top_srcdir/share/configs"
testconfigs="$abs_top_srcdir/tests/configs"
failures=0
checks=0
workdir=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain-test.XXXXXX") || exit 99
trap 'rm -rf "$workdir"' EXIT

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect_rc WANT CMD...: run CMD, keep stdout/stderr in $out/$err.
expect_rc() {
    want=$1; shift
    checks=$((checks + 1))
    "$@" >"$workdir/out" 2>"$workdir/err"
    got=$?
    out=$(cat "$workdir/out"); err=$(cat "$workdir/err")
    [ "$got" -eq "$want" ] || fail "exit $got, expected $want: $*
--- stdout ---
$out
--- stderr ---
$err"
}

# expect_in TEXT NEEDLE WHAT
expect_in() {
    checks=$((checks + 1))
    case "$1" in *"$2"*) ;; *) fail "$3: expected \"$2\" in:
$1" ;; esac
}

finish() {
    echo "$(basename "$0"): $checks checks, $failures failed"
    [ "$failures" -eq 0 ] || exit 1
    exit 0
}
