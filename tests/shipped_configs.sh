#!/bin/sh
# shipped_configs.sh: every config under share/configs validates at the
# scale its header names, and the tiny one builds a mesh on 1, 2 and 4
# real ranks (dense app, --dry-run).
. "${abs_top_srcdir:-$(dirname "$0")/..}/tests/lib.sh"
plan="$bindir/meshtrain-plan"
for c in "tiny 8 4" "llama3-8b-fsdp2-tp8 16 8" "llama3-70b-tp8-pp4 64 8" \
         "moe-ep16 16 8" "long-context-cp8 8 8"; do
    set -- $c
    expect_rc 0 "$plan" --config "$configs/$1.yaml" --world-size "$2" --ranks-per-node "$3"
    expect_in "$out" "is valid" "$1 at $2 ranks"
done
for np in 1 2 4; do
    expect_rc 0 timeout 120 "$MPIEXEC" $MPIEXEC_NP "$np" "$bindir/meshtrain-dense" \
        --config "$configs/tiny.yaml" --dry-run
    expect_in "$out" "the config and the $np-rank mesh are valid" "tiny dry run on $np"
done
finish
