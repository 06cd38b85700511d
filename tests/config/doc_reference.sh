#!/bin/sh
# doc_reference.sh: doc/config-reference.md is exactly what the schema
# generates, so the documented keys, types and defaults cannot drift.
# Regenerate with: apps/meshtrain-plan --config-reference > doc/config-reference.md
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
expect_rc 0 "$bindir/meshtrain-plan" --config-reference
printf '%s\n' "$out" > "$workdir/ref.md"
checks=$((checks + 1))
diff -u "$abs_top_srcdir/doc/config-reference.md" "$workdir/ref.md" >"$workdir/diff" ||
    fail "doc/config-reference.md is stale; regenerate it:
$(head -40 "$workdir/diff")"
finish
