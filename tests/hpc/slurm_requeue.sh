#!/bin/sh
# slurm_requeue.sh: pre-emption under a real Slurm.  A job of the dense 8B
# jobscript (CPU variant: 2 ranks, ddp, a tiny model) trains; once it has
# logged some steps, the test sends the pre-emption signal to the batch
# script as Slurm's `--signal=B:USR1@SECS` would (`scancel --signal=USR1
# --batch`).  The script passes it to the ranks, which save a checkpoint
# and exit 0; the script requeues the job.  The requeued run resumes from
# that checkpoint and finishes max_steps, with the same loss at every step
# as an uninterrupted run.
# Slurm holds a requeued job for about two minutes (its BeginTime) before
# it may start again; the test releases it at once with
# `scontrol update StartTime=now`.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
. "$abs_top_srcdir/tests/hpc/slurm-cluster.sh"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
js="$abs_top_srcdir/jobscripts"
small="$small_cfg"
steps=200
run() { echo "dataset.path=$data distributed.strategy=ddp step_scheduler.max_steps=$steps
    step_scheduler.ckpt_every_steps=25 checkpoint.checkpoint_dir=$workdir/$1 logging.metrics_file=$workdir/$1.jsonl"; }
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1" | sort -n -k1,1 -u; }
slurm_start
export MESHTRAIN_BINDIR="$bindir"

job=$(slurm_submit "$workdir/job.out" --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=10 \
    --chdir="$workdir" "$js/dense-8b-fsdp2-tp8.sbatch" "$small" $(run B))
[ -n "$job" ] || { echo "sbatch failed"; exit 1; }

# Wait until training is under way (10 steps logged), then pre-empt.
for i in $(seq 1 1200); do
    [ "$(cat "$workdir/B.jsonl" 2>/dev/null | wc -l)" -ge 10 ] && break
    sleep 0.1
done
checks=$((checks + 1))
[ "$(cat "$workdir/B.jsonl" 2>/dev/null | wc -l)" -ge 10 ] ||
    fail "the job did not start training: $(cat "$workdir/job.out" 2>/dev/null); $(squeue 2>&1)"
scancel --signal=USR1 --batch "$job"

# The job is requeued: pending again, with one restart.
for i in $(seq 1 600); do
    line=$(scontrol -o show job "$job")
    case "$line" in *"JobState=PENDING"*"Restarts=1"*) break ;; esac
    sleep 0.1
done
checks=$((checks + 1))
# Release it only once slurmd has cleaned up the killed instance: released
# earlier, slurmd may refuse the new launch ("Job 1 already killed, do not
# launch batch job") and the job fails; seen on a loaded 2-core machine.
for i in $(seq 1 300); do
    [ -z "$(scontrol listpids "$job" 2>/dev/null | sed 1d)" ] && break
    sleep 0.1
done
sleep 2
case "$line" in
    *"JobState=PENDING"*"Restarts=1"*) scontrol update JobId="$job" StartTime=now ;;
    *) fail "job $job was not requeued: $line
$(cat "$workdir/job.out")" ;;
esac

slurm_wait "$job" 240 || true
log=$(cat "$workdir/job.out")
checks=$((checks + 1))
[ "$job_state $job_exit $job_restarts" = "COMPLETED 0:0 1" ] ||
    fail "job $job: $job_state exit $job_exit restarts $job_restarts
$log
$(slurm_dump_logs)"
expect_in "$log" "meshtrain-job: SIGUSR1 received" "the batch script took the signal"
expect_in "$log" "signal received: checkpoint written after step" "the ranks saved on the signal"
expect_in "$log" "requeueing job $job" "the script requeued the job"
expect_in "$log" "job $job (restart 1)" "the requeued run started"
stopped=$(printf '%s\n' "$log" | sed -n 's/.*checkpoint written after step \([0-9]*\).*/\1/p' | head -1)
checks=$((checks + 1))
[ -n "$stopped" ] && [ "$stopped" -lt "$steps" ] || fail "not stopped early (step '$stopped')"
expect_in "$log" "resumed from $workdir/B/step_$(printf %08d "$stopped") at step $stopped" \
    "the requeued run resumed from the pre-emption checkpoint"
expect_in "$log" "meshtrain-dense: done after step $steps" "the requeued run finished"

# The same run without pre-emption, outside Slurm: identical losses.
expect_rc 0 env -u SLURM_CONF "$MPIEXEC" $MPIEXEC_NP 2 "$bindir/meshtrain-dense" --config "$small" $(run A)
checks=$((checks + 1))
[ "$(losses "$workdir/A.jsonl" | wc -l)" -eq "$steps" ] &&
    [ "$(losses "$workdir/A.jsonl")" = "$(losses "$workdir/B.jsonl")" ] ||
    fail "the requeued run's losses differ from an uninterrupted run's:
$(diff "$workdir/A.jsonl" "$workdir/B.jsonl" | head -20)"
finish
