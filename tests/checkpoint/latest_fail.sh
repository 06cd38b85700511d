#!/bin/sh
# latest_fail.sh: a save whose step directory is published but whose
# `latest` cannot be rewritten (here: `latest` is a directory, so the
# rename onto it fails, as a full disk would fail it) ends the run with an
# error that says the checkpoint is complete and names it, leaves no
# latest.tmp, and resume: auto then continues from that step.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
dense="$bindir/meshtrain-dense"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
dir="$workdir/L"
mkdir -p "$dir/latest/blocker" || exit 99
run() {
    expect_rc "$1" np 2 "$dense" --config "$small_cfg" dataset.path="$data" \
        checkpoint.checkpoint_dir="$dir" logging.metrics_file="$workdir/L.jsonl" \
        step_scheduler.ckpt_every_steps=1 step_scheduler.max_steps=2
}
run 1
expect_in "$err" "cannot rename $dir/latest.tmp to $dir/latest" "the failed update"
expect_in "$err" "checkpoint $dir/step_00000001 itself is complete" "the complete checkpoint named"
checks=$((checks + 1))
[ ! -e "$dir/latest.tmp" ] || fail "latest.tmp left behind: $(ls -a "$dir")"
checks=$((checks + 1))
"$bindir/meshtrain-ckpt" verify "$dir/step_00000001" >/dev/null 2>&1 ||
    fail "step 1 does not verify"
checks=$((checks + 1))
[ ! -e "$dir/step_00000002" ] || fail "the run went on after the failed save: $(ls "$dir")"

rm -rf "$dir/latest"
run 0
expect_in "$out" "resumed from $dir/step_00000001 at step 1" "resume after the failed update"
checks=$((checks + 1))
[ "$(cat "$dir/latest")" = step_00000002 ] || fail "latest: $(cat "$dir/latest")"
finish
