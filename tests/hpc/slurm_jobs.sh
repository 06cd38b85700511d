#!/bin/sh
# slurm_jobs.sh: the jobscripts run under a real (private, one-node) Slurm.
# Each script is submitted with sbatch as its CPU variant: its own #SBATCH
# header (GPUs per node, requeue, signal), with --nodes=1, as many tasks as
# fit the node's 8 declared CPUs, and a tiny model:
#  - dense 8B script: 8 ranks train with strategy ddp (srun --mpi=pmi2),
#    one GPU per rank from CUDA_VISIBLE_DEVICES;
#  - dense 70B script: 4 ranks train and write a checkpoint that verifies;
#  - MoE and CP scripts: the shipped configs validate on 8 ranks
#    (--dry-run), and the MoE script trains moe-tiny.yaml at ep 2;
#  - dry-run.sbatch; the mpiexec fallback inside an allocation
#    (MESHTRAIN_LAUNCHER=mpiexec) and outside Slurm.
# Skips (77) when Slurm cannot start here (see tests/hpc/slurm-cluster.sh).
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
. "$abs_top_srcdir/tests/hpc/slurm-cluster.sh"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
js="$abs_top_srcdir/jobscripts"
small="$small_cfg"
slurm_start
export MESHTRAIN_BINDIR="$bindir" MESHTRAIN_SHOW_BINDING=1
# --time=30: beyond the 70B script's 10-minute pre-emption lead
common="--nodes=1 --cpus-per-task=1 --time=30 --chdir=$workdir"
train="dataset.path=$data distributed.strategy=ddp step_scheduler.local_batch_size=1"

# Submit everything, then wait: the jobs queue on the one node.
d8=$(slurm_submit "$workdir/d8.out" $common --ntasks-per-node=8 "$js/dense-8b-fsdp2-tp8.sbatch" \
    "$small" $train step_scheduler.max_steps=6 checkpoint.enabled=false \
    logging.metrics_file="$workdir/d8.jsonl")
d70=$(slurm_submit "$workdir/d70.out" $common --ntasks-per-node=4 "$js/dense-70b-tp8-pp4.sbatch" \
    "$small" $train step_scheduler.max_steps=4 checkpoint.checkpoint_dir="$workdir/ck70" \
    logging.metrics_file="$workdir/d70.jsonl")
moe=$(slurm_submit "$workdir/moe.out" $common --ntasks-per-node=8 "$js/moe-ep16.sbatch" \
    "$configs/moe-ep16.yaml" --dry-run distributed.ep_size=8)
# the corpus is the build's (a VPATH build has none beside the config)
moet=$(slurm_submit "$workdir/moet.out" $common --ntasks-per-node=2 "$js/moe-ep16.sbatch" \
    "$configs/moe-tiny.yaml" distributed.ep_size=2 step_scheduler.max_steps=3 \
    dataset.path="$data" checkpoint.enabled=false logging.metrics_file="$workdir/moet.jsonl")
cp=$(slurm_submit "$workdir/cp.out" $common --ntasks-per-node=8 "$js/long-context-cp8.sbatch" \
    "$configs/long-context-cp8.yaml" --dry-run)
dry=$(slurm_submit "$workdir/dry.out" --ntasks=4 --chdir="$workdir" "$js/dry-run.sbatch" \
    "$configs/tiny.yaml" dense)
hyd=$(MESHTRAIN_LAUNCHER=mpiexec slurm_submit "$workdir/hyd.out" $common --ntasks-per-node=2 \
    "$js/dense-8b-fsdp2-tp8.sbatch" "$configs/tiny.yaml" --dry-run)
for j in d8 d70 moe moet cp dry hyd; do
    eval "id=\$$j"
    checks=$((checks + 1))
    [ -n "$id" ] || { fail "sbatch of $j failed"; eval "$j=none"; }
done

# expect_job NAME ID WANT_STATE WANT_EXIT: wait for it; $log is its output.
expect_job() {
    checks=$((checks + 1))
    slurm_wait "$2" 240 || true
    log=$(cat "$workdir/$1.out" 2>/dev/null)
    [ "$job_state $job_exit $job_restarts" = "$3 $4 0" ] ||
        fail "job $1 ($2): $job_state exit $job_exit restarts $job_restarts, expected $3 $4 0
--- job output ---
$log
--- slurm errors ---
$(slurm_dump_logs)"
}

expect_job d8 "$d8" COMPLETED 0:0
expect_in "$log" "launcher: srun --mpi=pmi2" "dense 8B: launched by srun with PMI-2"
expect_in "$log" "training: 119360 parameters" "dense 8B: trains"
expect_in "$log" "meshtrain-dense 0.1.0: 8 ranks" "dense 8B: 8 ranks in one MPI job"
expect_in "$log" "meshtrain-dense: done after step 6" "dense 8B: finishes"
expect_in "$log" "HDF5_USE_FILE_LOCKING=FALSE" "dense 8B: environment"
# one distinct GPU per rank, in local-rank order
checks=$((checks + 1))
bind=$(printf '%s\n' "$log" | sed -n 's/^meshtrain-bind: rank \([0-9]*\) .* local \([0-9]*\): CUDA_VISIBLE_DEVICES=\(.*\)$/\2 \3/p' | sort -n)
[ "$bind" = "$(printf '%s\n' 0 1 2 3 4 5 6 7 | sed 's/.*/& &/')" ] || fail "GPU binding: $bind"
# the loss falls from about 5.56 over the 6 steps
checks=$((checks + 1))
python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r['step'] for r in rows] == list(range(1, 7)), rows
assert rows[-1]['loss'] < rows[0]['loss'] < 6, rows
" "$workdir/d8.jsonl" || fail "dense 8B metrics: $(cat "$workdir/d8.jsonl")"

expect_job d70 "$d70" COMPLETED 0:0
expect_in "$log" "meshtrain-dense 0.1.0: 4 ranks" "dense 70B: 4 ranks"
expect_in "$log" "meshtrain-dense: done after step 4" "dense 70B: finishes"
expect_rc 0 "$bindir/meshtrain-ckpt" verify "$workdir/ck70"
expect_in "$out" "step_00000004" "dense 70B: its checkpoint verifies"

expect_job moe "$moe" COMPLETED 0:0
expect_in "$log" "meshtrain-moe: dry run: the config and the 8-rank mesh are valid" "MoE dry run"
expect_in "$log" "ep_size: 8" "MoE override reached the app"
expect_job moet "$moet" COMPLETED 0:0
expect_in "$log" "meshtrain-moe: done after step 3" "MoE script: moe-tiny trains at ep 2"
expect_in "$log" "expert load" "MoE script: the step line shows the expert load"
expect_job cp "$cp" COMPLETED 0:0
expect_in "$log" "meshtrain-cp: dry run: the config and the 8-rank mesh are valid" "CP dry run"
expect_job dry "$dry" COMPLETED 0:0
expect_in "$log" "the config and the 4-rank mesh are valid" "dry-run.sbatch"
expect_job hyd "$hyd" COMPLETED 0:0
expect_in "$log" "mpiexec -n 2; app:" "mpiexec fallback inside an allocation"
expect_in "$log" "rank 1 on $(hostname), local 1: CUDA_VISIBLE_DEVICES=1" "mpiexec fallback: binding by Hydra's local rank"
expect_in "$log" "the config and the 2-rank mesh are valid" "mpiexec fallback runs both ranks"

# Outside Slurm the script is a plain bash script launching mpiexec.
expect_rc 0 env -u SLURM_CONF NP=2 bash "$js/dense-8b-fsdp2-tp8.sbatch" "$configs/tiny.yaml" --dry-run
expect_in "$out" "mpiexec -n 2; app:" "outside Slurm: mpiexec"
expect_in "$out" "the config and the 2-rank mesh are valid" "outside Slurm: runs"
# A missing config is a clear error, before anything is launched.
expect_rc 2 env NP=1 bash "$js/dense-8b-fsdp2-tp8.sbatch" "$workdir/nope.yaml"
expect_in "$err" "cannot read config '$workdir/nope.yaml'" "missing config"
expect_rc 1 bash "$js/dense-8b-fsdp2-tp8.sbatch"
expect_in "$err" "usage: sbatch dense-8b-fsdp2-tp8.sbatch CONFIG" "usage"
finish
