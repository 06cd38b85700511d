#!/bin/sh
# ckpt_lock.sh: one run owns a checkpoint directory (checkpoint_dir/.lock,
# doc/checkpoints.md "One run per directory").  A second run on a live
# run's directory is refused on every rank, naming the owner, and leaves
# the directory as it was; a stale lock (a dead pid on this host, an
# earlier run of the same job, a heartbeat older than
# checkpoint.lock_stale_s) is taken over with a warning; a run removes
# its lock when it ends, and the heartbeat moves while it trains.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
dense="$bindir/meshtrain-dense"
cfg="$testconfigs/train-small.yaml"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
host=$(hostname)
unset SLURM_JOB_ID SLURM_STEP_ID PBS_JOBID LSB_JOBID FLUX_JOB_ID JOB_ID
run() { # run NAME RANKS ARGS...: a short checkpointing run in $workdir/NAME
    name=$1 n=$2; shift 2
    expect_rc "${want:-0}" np "$n" "$dense" --config "$cfg" dataset.path="$data" \
        checkpoint.enabled=true checkpoint.checkpoint_dir="$workdir/$name" \
        logging.metrics_file="$workdir/$name.jsonl" step_scheduler.max_steps=2 "$@"
}
# lock DIR PID HOST JOB: a lock as another run writes it
lock() {
    mkdir -p "$1"
    printf '# meshtrain\ntoken=other\nhost=%s\npid=%s\njob=%s\nstarted=%s\n' "$3" "$2" "$4" \
        "$(date +%s)" > "$1/.lock"
}

# a run leaves no lock behind
run plain 2
checks=$((checks + 1))
[ ! -e "$workdir/plain/.lock" ] || fail "the lock outlived its run"

# a live run (this shell, on this host) keeps its directory; both ranks stop
lock "$workdir/live" $$ "$host" ""
want=1 run live 2
expect_in "$err" "checkpoint_dir $workdir/live is in use by another run: pid $$ on host $host" \
    "a live lock is refused"
checks=$((checks + 1))
[ ! -e "$workdir/live/step_00000002" ] && grep -q "token=other" "$workdir/live/.lock" ||
    fail "the refused run wrote into the live run's directory"
# ... and from another host with a fresh heartbeat
lock "$workdir/remote" 12345 "node-that-is-not-this-one" "4242"
want=1 run remote 1
expect_in "$err" "pid 12345 on host node-that-is-not-this-one, job 4242" "a remote live lock is refused"

# stale: a dead pid here
sh -c 'exit 0' & dead=$!; wait $dead
lock "$workdir/dead" $dead "$host" ""
run dead 2
expect_in "$err" "took over the lock of checkpoint_dir $workdir/dead from pid $dead" "a dead pid's lock"
expect_in "$err" "its process is gone" "why it was taken over"
checks=$((checks + 1))
[ -d "$workdir/dead/step_00000002" ] && [ ! -e "$workdir/dead/.lock" ] ||
    fail "the run on a dead pid's directory did not train or left its lock"
# stale: no heartbeat for longer than lock_stale_s, on another host
lock "$workdir/old" 12345 "node-that-is-not-this-one" ""
touch -d "@$(($(date +%s) - 120))" "$workdir/old/.lock"
want=1 run old 1 checkpoint.lock_stale_s=3600
expect_in "$err" "heartbeat 12" "the lock's age is named"
run old 1 checkpoint.lock_stale_s=60
expect_in "$err" "its heartbeat stopped" "an old heartbeat is stale"
# stale: an earlier run of this job (a requeue on another node)
lock "$workdir/requeue" 12345 "node-that-is-not-this-one" "777.0"
SLURM_JOB_ID=777 SLURM_STEP_ID=0 run requeue 1
expect_in "$err" "it is an earlier run of this job (requeued)" "a requeued job takes its lock back"
checks=$((checks + 1))
[ -d "$workdir/requeue/step_00000002" ] || fail "the requeued run did not train"

# two real runs: the second is refused while the first trains, and the
# first's heartbeat moves
"$dense" --config "$cfg" dataset.path="$data" checkpoint.enabled=true \
    checkpoint.checkpoint_dir="$workdir/two" logging.metrics_file="$workdir/two.jsonl" \
    step_scheduler.max_steps=100000 step_scheduler.ckpt_every_steps=1000000 \
    checkpoint.lock_stale_s=10 > "$workdir/first.out" 2>&1 &
first=$!
for i in $(seq 1 3000); do
    [ -s "$workdir/two.jsonl" ] && break
    sleep 0.01
done
t0=$(stat -c %Y "$workdir/two/.lock" 2>/dev/null)
want=1 run two 1
expect_in "$err" "is in use by another run: pid $first on host $host" "the second run is refused"
sleep 2.5
t1=$(stat -c %Y "$workdir/two/.lock" 2>/dev/null)
kill -TERM "$first"
wait "$first"; rc=$?
checks=$((checks + 1))
[ "$rc" -eq 0 ] || fail "the first run exited $rc after SIGTERM: $(tail -5 "$workdir/first.out")"
checks=$((checks + 1))
[ -n "$t0" ] && [ -n "$t1" ] && [ "$t1" -gt "$t0" ] || fail "the heartbeat did not move ($t0, $t1)"
checks=$((checks + 1))
[ ! -e "$workdir/two/.lock" ] || fail "the first run kept its lock after it ended"
finish
