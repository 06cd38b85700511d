#!/bin/sh
# config_abort.sh: a config error found by rank 0 ends all 8 ranks
# promptly, non-zero, with one message that names file, line, key and rule.
# Also: --dry-run on a valid config succeeds on 8 ranks, and a failure
# when training starts is reported once, by rank 0.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"

run8() { timeout 120 "$MPIEXEC" $MPIEXEC_NP 8 "$@"; }

for case in "bad-rule.yaml|bad-rule.yaml:15:12: distributed.tp_size: world size 8 is not divisible" \
            "bad-key.yaml|bad-key.yaml:6:3: distributed.tp_sise: unknown key; did you mean tp_size?"; do
    file=${case%%|*}; needle=${case#*|}
    start=$(date +%s)
    expect_rc 1 run8 "$bindir/meshtrain-dense" --config "$testconfigs/$file"
    elapsed=$(( $(date +%s) - start ))
    checks=$((checks + 1))
    [ "$elapsed" -le 60 ] || fail "$file: 8 ranks took ${elapsed}s to stop"
    expect_in "$err" "$needle" "$file message"
    expect_in "$err" "meshtrain-dense: error on rank 0" "$file names rank"
    checks=$((checks + 1))
    n=$(printf '%s\n' "$err" | grep -c "error on rank")
    [ "$n" -eq 1 ] || fail "$file: expected one message, got $n:
$err"
done

# Usage errors are reported once too, exit 2.
expect_rc 2 run8 "$bindir/meshtrain-dense" distributed.tp_size=2
expect_in "$err" "comes before --config FILE" "override before --config"

cfg="$configs/tiny.yaml"
expect_rc 0 run8 "$bindir/meshtrain-dense" --config "$cfg" --dry-run
expect_in "$out" "dry run: the config and the 8-rank mesh are valid" "dry run"
expect_in "$out" "--- resolved config ---" "resolved config printed"
expect_in "$out" "dp_shard      1 group of 8" "mesh printed"

# A failure when training starts (after validation and the mesh) is
# reported once, by rank 0, on 8 ranks, with its hint: here a data file
# that does not exist.
expect_rc 1 run8 "$bindir/meshtrain-dense" --config "$cfg" dataset.path="$workdir/none.bin"
expect_in "$err" "none.bin: cannot open dataset: No such file or directory" "training-time error"
expect_in "$err" "hint: make token files with meshtrain-data" "its hint"
checks=$((checks + 1))
[ "$(printf '%s\n' "$err" | grep -c "error on rank")" -eq 1 ] || fail "one message expected:
$err"

# The MoE app refuses a dense model before anything starts.
expect_rc 1 timeout 60 "$MPIEXEC" $MPIEXEC_NP 2 "$bindir/meshtrain-moe" --config "$cfg" --dry-run
expect_in "$err" "meshtrain-moe trains MoE models" "moe app rule"
finish
