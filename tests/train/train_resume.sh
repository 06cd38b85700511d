#!/bin/sh
# train_resume.sh: a resumed run matches an uninterrupted one bit for bit.
#  A: 40 steps straight.
#  B: the same run stopped by SIGUSR1 (Slurm's pre-emption signal) part-way:
#     it finishes the step, saves, exits 0; rerun with resume: auto; then a
#     corrupted newest checkpoint is skipped with a warning and the run
#     resumes from the older one.  Losses of every step, printed to 9
#     significant digits, and the final weights (h5diff) must equal A's.
#  Also: a corrupt checkpoint named explicitly, and a bad data file, fail
#  with clear messages.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
dense="$bindir/meshtrain-dense"
cfg="$small_cfg"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
set_run() { echo "dataset.path=$data checkpoint.checkpoint_dir=$workdir/$1 logging.metrics_file=$workdir/$1.jsonl"; }
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1" | sort -n -k1,1 -u; }

# A: uninterrupted, with a validation loss every 10 steps
expect_rc 0 "$dense" --config "$cfg" $(set_run A) dataset.validation_path="$data" \
    step_scheduler.val_every_steps=10
expect_in "$out" "done after step 40" "run A"
expect_in "$out" "| val_loss " "validation loss in the log"
# measured arenas agree with meshtrain-plan's estimate within 10%
checks=$((checks + 1))
printf '%s\n' "$out" | python3 -c "
import re, sys
line = [l for l in sys.stdin if l.startswith('memory per rank')][0]
pairs = re.findall(r'([a-z ]+) ([0-9.]+) / ([0-9.]+)', line)
assert len(pairs) == 4, line
for name, got, est in pairs:
    got, est = float(got), float(est)
    assert abs(got - est) <= 0.10 * got, (name, got, est)
" || fail "memory estimate off by more than 10%: $(printf '%s\n' "$out" | grep 'memory per rank')"
checks=$((checks + 1))
[ "$(grep -c '"val_loss"' "$workdir/A.jsonl")" -eq 4 ] || fail "expected 4 val_loss entries"
checks=$((checks + 1))
python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$workdir/A.jsonl" ||
    fail "metrics.jsonl lines are not JSON"

# save_initial writes step 0 before the first update
expect_rc 0 "$dense" --config "$cfg" $(set_run S) checkpoint.save_initial=true step_scheduler.max_steps=2
checks=$((checks + 1))
[ -d "$workdir/S/step_00000000" ] && [ -d "$workdir/S/step_00000002" ] &&
    [ "$(cat "$workdir/S/latest")" = "step_00000002" ] || fail "save_initial: $(ls "$workdir/S")"

# B: stopped by SIGUSR1 once step 7 is logged, then resumed
"$dense" --config "$cfg" $(set_run B) > "$workdir/B1.out" 2>&1 &
pid=$!
for i in $(seq 1 3000); do
    [ "$(cat "$workdir/B.jsonl" 2>/dev/null | wc -l)" -ge 7 ] && break
    sleep 0.01
done
kill -USR1 "$pid"
wait "$pid"; rc=$?
checks=$((checks + 1))
[ "$rc" -eq 0 ] || fail "SIGUSR1 run exited $rc: $(cat "$workdir/B1.out")"
b1=$(cat "$workdir/B1.out")
expect_in "$b1" "signal received: checkpoint written after step" "signal handling"
stopped=$(sed -n 's/.*checkpoint written after step \([0-9]*\).*/\1/p' "$workdir/B1.out")
checks=$((checks + 1))
[ -n "$stopped" ] && [ "$stopped" -lt 40 ] || fail "run B was not stopped early (step '$stopped')"
expect_rc 0 "$dense" --config "$cfg" $(set_run B)
expect_in "$out" "resumed from $workdir/B/step_$(printf %08d "$stopped") at step $stopped" "resume auto"
checks=$((checks + 1))
[ "$(losses "$workdir/A.jsonl")" = "$(losses "$workdir/B.jsonl")" ] ||
    fail "resumed losses differ:
$(diff "$workdir/A.jsonl" "$workdir/B.jsonl")"
if command -v h5diff >/dev/null 2>&1; then
    checks=$((checks + 1))
    h5diff "$workdir/A/step_00000040/model.h5" "$workdir/B/step_00000040/model.h5" /model /model \
        > "$workdir/h5diff" 2>&1 || fail "final weights differ: $(head -20 "$workdir/h5diff")"
fi
checks=$((checks + 1))
[ "$(ls -d "$workdir"/B/step_* | wc -l)" -eq 2 ] || fail "keep_last_n 2: $(ls "$workdir/B")"

# Corrupt the newest checkpoint: auto-resume warns, falls back to step 35,
# and recomputes steps 36..40 identically.
printf 'garbage' | dd of="$workdir/B/step_00000040/model.h5" bs=1 seek=4096 conv=notrunc 2>/dev/null
expect_rc 0 "$dense" --config "$cfg" $(set_run B)
expect_in "$out" "step_00000040" "warning names the corrupt checkpoint"
expect_in "$out" "resumed from $workdir/B/step_00000035 at step 35" "fallback to older checkpoint"
checks=$((checks + 1))
[ "$(losses "$workdir/A.jsonl")" = "$(losses "$workdir/B.jsonl")" ] || fail "losses after fallback differ"

# Naming a corrupt checkpoint explicitly is an error, not a silent load.
printf 'garbage' | dd of="$workdir/B/step_00000035/model.h5" bs=1 seek=4096 conv=notrunc 2>/dev/null
expect_rc 1 "$dense" --config "$cfg" $(set_run B) checkpoint.resume="$workdir/B/step_00000035"
expect_in "$err" "SHA-256" "explicit corrupt checkpoint"

# A checkpoint of a different model is refused, naming the tensor: resume
# the 2-layer run's checkpoint into a 1-layer model (an extra tensor) and
# into a wider one (a wrongly shaped tensor).
expect_rc 1 "$dense" --config "$cfg" $(set_run A) model.num_hidden_layers=1 \
    checkpoint.resume="$workdir/A/step_00000040"
expect_in "$err" "the checkpoint has tensor /model/model.layers.1." "extra tensor named"
expect_rc 1 "$dense" --config "$cfg" $(set_run A) model.intermediate_size=192 \
    checkpoint.resume="$workdir/A/step_00000040"
expect_in "$err" "has shape [160, 64] in the checkpoint, expected [192, 64]" "wrong shape named"

# A truncated data file names the file and the problem.
head -c 3000 "$data" > "$workdir/short.bin"
expect_rc 1 "$dense" --config "$cfg" $(set_run C) dataset.path="$workdir/short.bin"
expect_in "$err" "$workdir/short.bin" "data error names the file"
expect_in "$err" "truncated" "data error says what is wrong"
finish
