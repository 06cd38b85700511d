#!/bin/sh
# layering.sh: the source tree keeps the architecture doc/architecture.md
# writes down.  Every #include and every call between files of src/ goes
# from a folder to itself or to a lower layer (the order is the doc's
# "layers:" line), no file stands directly in src/ but the umbrella
# header, and no set of source files calls each other round in a cycle.
# Then the check itself is checked: an upward include and a call cycle
# planted in a copy of the tree must both be refused.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
command -v python3 >/dev/null 2>&1 || { echo "no python3: skipping"; exit 77; }
deps="$abs_top_srcdir/tests/layout/deps.py"
order=$(sed -n 's/^<!-- layers: \(.*\) -->$/\1/p' "$abs_top_srcdir/doc/architecture.md")
[ -n "$order" ] || { echo "doc/architecture.md has no '<!-- layers: ... -->' line"; exit 99; }

# shellcheck disable=SC2086
expect_rc 0 python3 "$deps" layers "$abs_top_srcdir/src" $order
expect_in "$out" "0 upward arrow(s)" "the layer check's verdict"
expect_rc 0 python3 "$deps" cycles "$abs_top_srcdir/src"
expect_in "$out" "0 cycle(s)" "the cycle check's verdict"

# every folder of src/ is a layer, and every layer a folder (hidden
# folders are the build's: .deps, .libs in an in-tree build)
for d in $(cd "$abs_top_srcdir/src" && find . -mindepth 1 -name '.*' -prune -o -type d -print |
           sed 's|^\./||' | sort); do
    case " $order " in *" $d "*) ;; *) fail "src/$d is not in doc/architecture.md's layers" ;; esac
done
for l in $order; do
    [ -d "$abs_top_srcdir/src/$l" ] || fail "layer $l has no folder src/$l"
done

# the check can fail: an upward include, a call cycle, a file at the root
cp -r "$abs_top_srcdir/src" "$workdir/src"
chmod -R u+w "$workdir/src"
printf '#include "mt_train.h"\n' >> "$workdir/src/core/status.c"
# shellcheck disable=SC2086
expect_rc 1 python3 "$deps" layers "$workdir/src" $order
expect_in "$out" "core/status.c (core) uses train/mt_train.h (train), a higher layer" \
    "a planted upward include"
printf 'void mt_planted_a(void) { mt_planted_b(); }\n' >> "$workdir/src/data/data.c"
printf 'void mt_planted_b(void) { mt_planted_a(); }\n' >> "$workdir/src/data/pack.c"
expect_rc 1 python3 "$deps" cycles "$workdir/src"
expect_in "$out" "cycle: data/data.c data/pack.c" "a planted call cycle"
: > "$workdir/src/stray.h"
# shellcheck disable=SC2086
expect_rc 1 python3 "$deps" layers "$workdir/src" $order
expect_in "$out" "stray.h: stands directly in the source root" "a header at the root"
finish
