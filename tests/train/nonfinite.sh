#!/bin/sh
# nonfinite.sh: a diverged run (lr 1e30: the loss is not finite from step
# 2) on 2 ranks, under each training.on_nonfinite.
#  stop (default): exit 1 at step 2 naming the step, the quantities and the
#    first non-finite gradient; step 1's checkpoint stays the newest.
#  skip: three steps skipped with a warning each, then exit 1 at step 5;
#    the checkpoints after skipped steps hold step 1's weights.
#  ignore: the update goes on, but the save of non-finite weights is
#    refused, so step 1's checkpoint stays the newest.
#  The same loop in meshtrain-moe (skip, experts split over ep 2) and
#  meshtrain-cp (stop, cp 2).
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
dense="$bindir/meshtrain-dense"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
run() {
    name=$1; shift
    expect_rc 1 np 2 "${app:-$dense}" --config "$small_cfg" dataset.path="$data" \
        checkpoint.checkpoint_dir="$workdir/$name" logging.metrics_file="$workdir/$name.jsonl" \
        optimizer.lr=1e30 lr_scheduler.lr_warmup_steps=0 step_scheduler.ckpt_every_steps=1 \
        checkpoint.keep_last_n=0 "$@"
    all="$out
$err"
}
steps() { (cd "$workdir/$1" && ls -d step_* 2>/dev/null | tr '\n' ' '); }
leftovers() {
    checks=$((checks + 1))
    [ -z "$(ls -a "$workdir/$1" | grep -i tmp)" ] || fail "$1: leftovers: $(ls -a "$workdir/$1")"
}

run stop
expect_in "$all" "step 2: the loss and the gradient norm are not finite" "stop: step and quantity"
expect_in "$all" "first non-finite gradient: model." "stop: the tensor"
expect_in "$all" "training.on_nonfinite is stop" "stop: the policy"
checks=$((checks + 1))
[ "$(steps stop)" = "step_00000001 " ] && [ "$(cat "$workdir/stop/latest")" = step_00000001 ] ||
    fail "stop: checkpoints $(steps stop), latest $(cat "$workdir/stop/latest")"
leftovers stop
checks=$((checks + 1))
"$bindir/meshtrain-ckpt" verify "$workdir/stop/step_00000001" >/dev/null 2>&1 ||
    fail "stop: step 1's checkpoint does not verify"

run skip training.on_nonfinite=skip
checks=$((checks + 1))
[ "$(printf '%s\n' "$out" | grep -c 'update skipped')" -eq 3 ] || fail "skip: expected 3 warnings: $out"
expect_in "$out" "warning: step 4: the loss and the gradient norm are not finite" "skip: warning"
expect_in "$out" "(3 in a row, 3 in all)" "skip: count"
expect_in "$all" "step 5: " "skip: the step that ends the run"
expect_in "$all" "4 steps in a row were not finite, more than training.max_nonfinite_skips (3)" \
    "skip: the limit"
checks=$((checks + 1))
[ "$(steps skip)" = "step_00000001 step_00000002 step_00000003 step_00000004 " ] &&
    [ "$(cat "$workdir/skip/latest")" = step_00000004 ] || fail "skip: checkpoints $(steps skip)"
leftovers skip
if command -v h5diff >/dev/null 2>&1; then
    checks=$((checks + 1))
    h5diff "$workdir/skip/step_00000001/model.h5" "$workdir/skip/step_00000004/model.h5" \
        /model /model > "$workdir/h5diff" 2>&1 ||
        fail "skip: skipped steps changed the weights: $(head -5 "$workdir/h5diff")"
fi

run ignore training.on_nonfinite=ignore
expect_in "$all" "step 2: weight model." "ignore: the refused save names the weight"
expect_in "$all" "is not finite: no checkpoint is written of it" "ignore: the refusal"
checks=$((checks + 1))
[ "$(steps ignore)" = "step_00000001 " ] && [ "$(cat "$workdir/ignore/latest")" = step_00000001 ] ||
    fail "ignore: checkpoints $(steps ignore)"
leftovers ignore

app="$bindir/meshtrain-moe" run moe training.on_nonfinite=skip model.num_experts=4 \
    model.num_experts_per_tok=2 model.moe_intermediate_size=32 distributed.ep_size=2
expect_in "$all" "4 steps in a row were not finite" "moe: skip limit"
if command -v h5diff >/dev/null 2>&1; then
    checks=$((checks + 1))
    h5diff "$workdir/moe/step_00000001/model.h5" "$workdir/moe/step_00000004/model.h5" \
        /model /model > "$workdir/h5diff" 2>&1 ||
        fail "moe: skipped steps changed the weights: $(head -5 "$workdir/h5diff")"
fi
app="$bindir/meshtrain-cp" run cp distributed.cp_size=2
expect_in "$all" "step 2: the loss and the gradient norm are not finite" "cp: stop"
checks=$((checks + 1))
[ "$(steps cp)" = "step_00000001 " ] || fail "cp: checkpoints $(steps cp)"

# an unknown policy is refused by the config
expect_rc 1 "$dense" --config "$small_cfg" dataset.path="$data" training.on_nonfinite=maybe --dry-run
expect_in "$out$err" "training.on_nonfinite" "bad policy names the key"
finish
