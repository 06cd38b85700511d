#!/bin/sh
# man_help.sh: every installed program has a man page that renders without
# warnings (groff -ww, when groff is here) and names the program, and
# `--help` on every program exits 0 and prints its usage.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
progs="meshtrain-dense meshtrain-moe meshtrain-cp meshtrain-plan meshtrain-data meshtrain-ckpt meshtrain-generate meshtrain-plot"
for p in $progs; do
    case $p in
        meshtrain-plot) exe="$abs_top_srcdir/apps/$p" ;;
        *) exe="$bindir/$p" ;;
    esac
    expect_rc 0 "$exe" --help
    expect_in "$out" "usage: $p" "$p --help"
    page="$abs_top_srcdir/doc/man/$p.1"
    checks=$((checks + 1))
    [ -r "$page" ] || { fail "no man page $page"; continue; }
    if command -v groff >/dev/null 2>&1; then
        expect_rc 0 env LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$page"
        checks=$((checks + 1))
        [ -z "$err" ] || fail "$p.1 renders with warnings: $err"
        expect_rc 0 env LC_ALL=C.UTF-8 groff -man -Tutf8 -P-cbou "$page"
        expect_in "$out" "$p -" "$p.1 NAME section"
        expect_in "$out" "SYNOPSIS" "$p.1 SYNOPSIS section"
    else
        expect_in "$(cat "$page")" ".TH $(echo "$p" | tr a-z A-Z) 1" "$p.1 title line"
    fi
done
# every program that make install puts in bin has a page: the list above
# is complete
checks=$((checks + 1))
for f in "$abs_top_srcdir"/apps/meshtrain-*.c "$abs_top_srcdir"/apps/meshtrain-plot; do
    n=$(basename "$f" .c)
    case " $progs " in *" $n "*) ;; *) fail "$n has no man page check" ;; esac
done
finish
