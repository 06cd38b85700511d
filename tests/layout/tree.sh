#!/bin/sh
# tree.sh: what the README and the tree promise a newcomer.  Every path in
# the README's code tour and documentation index exists; no source, test,
# benchmark or build file cites an issue number (nobody reading the
# repository can look one up: comments say why instead).  Each check is
# also run on a planted mistake, so that it is seen to fail.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
top=$abs_top_srcdir

# tour_paths README: the backquoted paths of the "A tour of the code"
# section, one a line
tour_paths() {
    awk '/^## A tour of the code/ { on = 1; next } /^## / { on = 0 }
         on && /^- `/ { sub(/^- `/, ""); sub(/`.*/, ""); print }' "$1"
}
# doc_paths README: the doc/ files of the "Documentation" section
doc_paths() {
    awk '/^## Documentation/ { on = 1; next } /^## / { on = 0 }
         on && /^- doc\// { sub(/^- /, ""); sub(/:.*/, ""); print }' "$1"
}
# missing ROOT PATH...: the paths not under ROOT
missing() {
    root=$1; shift
    for p in "$@"; do [ -e "$root/$p" ] || echo "$p"; done
}

n=$(tour_paths "$top/README.md" | wc -l)
checks=$((checks + 1))
[ "$n" -ge 6 ] || fail "the README's code tour names $n files, expected at least 6"
# shellcheck disable=SC2046
gone=$(missing "$top" $(tour_paths "$top/README.md") $(doc_paths "$top/README.md"))
checks=$((checks + 1))
[ -z "$gone" ] || fail "the README names paths that do not exist: $gone"

# a planted mistake: a tour entry for a file that does not exist
sed 's|^- `src/model/model.c`|- `src/model/no_such_file.c`|' "$top/README.md" > "$workdir/README.md"
# shellcheck disable=SC2046
gone=$(missing "$top" $(tour_paths "$workdir/README.md"))
checks=$((checks + 1))
[ "$gone" = "src/model/no_such_file.c" ] || fail "a planted missing tour path is not caught: '$gone'"

# tracker references: the word for a tracker entry followed by a number,
# or a number behind a hash in parentheses
word=issue
pattern="[Ii]${word#i}s? #?[0-9]|\\(#[0-9]+\\)"
cited() {
    (cd "$1" && grep -rlE "$pattern" src tests bench apps Makefile.am configure.ac .ci \
        share/install-deps.sh share/fetch-gpu-debs.sh 2>/dev/null)
}
found=$(cited "$top")
checks=$((checks + 1))
[ -z "$found" ] || fail "files that cite an issue number: $found"
mkdir -p "$workdir/plant/src" "$workdir/plant/tests"
printf '/* see %s 12 */\n' "$word" > "$workdir/plant/src/x.c"
checks=$((checks + 1))
[ "$(cited "$workdir/plant")" = "src/x.c" ] || fail "a planted issue number is not caught"
finish
