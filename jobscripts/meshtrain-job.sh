# meshtrain-job.sh: what every meshtrain sbatch script shares (sourced).
#
#   mt_job_run APP CONFIG [section.key=value ... | --dry-run]
#
# launches meshtrain-APP on the allocation and handles pre-emption:
#  - launcher: `srun --mpi=pmi2` (else pmix) inside a Slurm job, mpiexec
#    outside one or when srun offers neither (MESHTRAIN_LAUNCHER=srun|mpiexec
#    and MESHTRAIN_SRUN_MPI=pmi2|pmix override the choice);
#  - GPU binding: each rank sees one GPU, the SLURM_LOCALID-th of the node's
#    (meshtrain-bind.sh, run by the launcher in front of the app);
#  - environment: NCCL, OpenMP and HDF5 defaults, each explained below and
#    each kept when already set;
#  - pre-emption: the job step runs in the background while this shell
#    waits, so the shell can take SIGUSR1 (`#SBATCH --signal=B:USR1@SECS`)
#    at once.  It forwards the signal to the launcher, which passes it to
#    every rank; the ranks finish the step, write a checkpoint and exit 0;
#    then the job is requeued (`scontrol requeue`) and the next run resumes
#    from that checkpoint (checkpoint.resume: auto, the default).  SIGTERM
#    (scancel, the time limit) is forwarded the same way but does not
#    requeue: a cancelled job stays cancelled.
#
# It deliberately does not choose node or GPU counts (the #SBATCH lines of
# each script do) and does not edit configs (overrides are passed through).
# doc/jobscripts.md describes the scripts; doc/user-guide.md the NCCL and
# Lustre settings.

mt_log() { echo "meshtrain-job: $*"; }
mt_die() { echo "meshtrain-job: error: $*" >&2; exit 2; }

# ---------------------------------------------------------------- environment
mt_job_env() {
    # NCCL (read by the GPU backend; harmless on CPUs).
    # Warnings and errors only; use INFO (and NCCL_DEBUG_SUBSYS=INIT,NET)
    # to see which network and transport NCCL picked.
    export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
    # The interface for NCCL's bootstrap and socket transport.  The default
    # (NCCL picks one) usually works; pin it where nodes have several NICs
    # and NCCL picks a management or docker interface:
    #   export NCCL_SOCKET_IFNAME=ib0          # or ^lo,docker (exclude)
    # InfiniBand / RoCE adapters to use, and the verbs timeout and retry
    # count (raise the timeout on large or congested fabrics):
    #   export NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3
    #   export NCCL_IB_TIMEOUT=22
    #   export NCCL_IB_RETRY_CNT=10
    # RoCE needs the GID index of the RoCE v2 address on some clusters:
    #   export NCCL_IB_GID_INDEX=3
    # NCCL_ASYNC_ERROR_HANDLING (TORCH_NCCL_ASYNC_ERROR_HANDLING) is read by
    # PyTorch, not by NCCL, so it is not set here: meshtrain's ranks agree
    # on every error and abort together (doc/errors.md).

    # One OpenMP thread per CPU Slurm gave each task (--cpus-per-task),
    # so oversubscribed ranks do not fight over cores.
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
    # HDF5 1.10+ locks files with flock(), which Lustre and some NFS mounts
    # refuse ("unable to lock file").  A checkpoint is written once into a
    # fresh directory and then renamed (doc/checkpoints.md), so the lock
    # protects nothing here.
    export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
}

# ---------------------------------------------------------------- launcher
# Sets mt_launcher (a description) and the array mt_launch_cmd.
mt_job_launcher() {
    local want=${MESHTRAIN_LAUNCHER:-auto} mpi=${MESHTRAIN_SRUN_MPI:-}
    if [ "$want" = auto ]; then
        want=mpiexec
        if [ -n "${SLURM_JOB_ID:-}" ] && command -v srun >/dev/null 2>&1; then
            if [ -z "$mpi" ]; then
                # `srun --mpi=list` prints to stderr on some versions.
                local plugins
                plugins=$(srun --mpi=list 2>&1 || true)
                # pmi2 first: Debian's MPICH (and most MPICH builds) speak
                # PMI-1/PMI-2 but are not built with PMIx, so under pmix
                # every rank would start as a singleton of one.
                case "$plugins" in
                    *pmi2*) mpi=pmi2 ;;
                    *pmix*) mpi=pmix ;;
                esac
            fi
            [ -n "$mpi" ] && want=srun
        fi
    fi
    case "$want" in
        srun)
            [ -n "$mpi" ] || mpi=pmi2
            # --kill-on-bad-exit: one failed rank ends the step instead of
            # leaving the others blocked in a collective.
            mt_launch_cmd=(srun --mpi="$mpi" --kill-on-bad-exit=1)
            mt_launcher="srun --mpi=$mpi"
            ;;
        mpiexec)
            local np=${SLURM_NTASKS:-${NP:-1}}
            # Inside an allocation MPICH's Hydra starts its proxies with
            # srun itself and reads the node list from Slurm.
            mt_launch_cmd=("${MPIEXEC:-mpiexec}" -n "$np")
            mt_launcher="${MPIEXEC:-mpiexec} -n $np"
            ;;
        *) mt_die "MESHTRAIN_LAUNCHER=$want: expected srun, mpiexec or auto" ;;
    esac
}

# ---------------------------------------------------------------- the app
mt_job_app() {
    local app=$1
    case "$app" in
        dense|moe|cp) ;;
        *) mt_die "unknown app '$app' (dense, moe or cp)" ;;
    esac
    local bin="meshtrain-$app"
    if [ -n "${MESHTRAIN_BINDIR:-}" ]; then
        bin="$MESHTRAIN_BINDIR/$bin"
        [ -x "$bin" ] || mt_die "$bin not found (MESHTRAIN_BINDIR=$MESHTRAIN_BINDIR)"
    else
        bin=$(command -v "$bin") ||
            mt_die "meshtrain-$app is not on PATH: module load meshtrain, or set MESHTRAIN_BINDIR"
    fi
    mt_app_bin=$bin
}

# ---------------------------------------------------------------- signals
mt_signals=0
mt_preempted=0
mt_step_pid=
mt_forward() {
    local sig=$1
    mt_signals=$((mt_signals + 1))
    [ "$sig" = USR1 ] && mt_preempted=1
    mt_log "SIG$sig received: forwarding it to the job step (the ranks finish the step and save)"
    # srun and Hydra's mpiexec both pass SIGUSR1 and SIGTERM on to every rank.
    [ -n "$mt_step_pid" ] && kill -s "$sig" "$mt_step_pid" 2>/dev/null
    return 0
}

mt_job_run() {
    [ $# -ge 2 ] || mt_die "usage: mt_job_run APP CONFIG [section.key=value ...]"
    local app=$1 config=$2
    shift 2
    [ -r "$config" ] || mt_die "cannot read config '$config'"
    mt_job_env
    mt_job_app "$app"
    mt_job_launcher
    local bind
    bind="$(dirname "${BASH_SOURCE[0]}")/meshtrain-bind.sh"
    [ -r "$bind" ] || mt_die "$bind is missing (it belongs beside meshtrain-job.sh)"

    mt_log "job ${SLURM_JOB_ID:-none} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NUM_NODES:-1} node(s): ${SLURM_JOB_NODELIST:-$(hostname)}"
    mt_log "launcher: $mt_launcher; app: $mt_app_bin; config: $config"
    mt_log "environment: OMP_NUM_THREADS=$OMP_NUM_THREADS HDF5_USE_FILE_LOCKING=$HDF5_USE_FILE_LOCKING NCCL_DEBUG=$NCCL_DEBUG${NCCL_SOCKET_IFNAME:+ NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME}"

    # The job's log, to read back what the ranks said when a signal came
    # (its size now: with --open-mode=append it holds earlier runs too).
    local joblog= logstart=0
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        joblog=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdOut=//p')
        logstart=$(stat -c %s "$joblog" 2>/dev/null || echo 0)
    fi

    trap 'mt_forward USR1' USR1
    trap 'mt_forward TERM' TERM
    # The step runs in the background: bash runs a trap only between
    # commands, so a foreground step would delay the forward until it ends.
    "${mt_launch_cmd[@]}" bash "$bind" "$mt_app_bin" --config "$config" "$@" &
    mt_step_pid=$!
    local rc seen
    while :; do
        seen=$mt_signals
        rc=0
        wait "$mt_step_pid" || rc=$?   # `|| rc=$?`: the scripts run under set -e
        # A trap interrupted the wait: the step is still running (or its
        # status is still held for us), so wait again.
        [ "$mt_signals" -ne "$seen" ] && [ "$rc" -gt 128 ] && continue
        break
    done
    trap - USR1 TERM
    mt_log "job step exited with status $rc"

    if [ "$mt_preempted" -eq 1 ] && [ "$rc" -eq 0 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
        # Requeue only a run the signal stopped with a checkpoint: not one
        # that had finished (or was a dry run) before the signal took
        # effect, nor one without checkpoints, which would start over.
        # Where the log cannot be read, requeue: a finished run that is
        # requeued just finds its last checkpoint at max_steps.
        local said=
        [ -r "$joblog" ] && said=$(tail -c +"$((logstart + 1))" "$joblog" | grep -m1 "^signal received: ")
        case "$said" in
            *"checkpoint written"*) ;;
            "")
                if [ -r "$joblog" ]; then
                    mt_log "SIGUSR1 came, but the run ended without stopping for it: not requeueing"
                    return 0
                fi ;;
            *)
                mt_log "pre-empted, but nothing was saved (checkpoint.enabled is false): not requeueing"
                return 0 ;;
        esac
        local max=${MESHTRAIN_MAX_REQUEUES:-50}
        if [ "${SLURM_RESTART_COUNT:-0}" -ge "$max" ]; then
            mt_log "pre-empted, but this job was requeued $max times already (MESHTRAIN_MAX_REQUEUES): not requeueing"
            return 0
        fi
        mt_log "pre-empted: checkpoint written; requeueing job $SLURM_JOB_ID (the next run resumes from it)"
        # Requeueing ends this script; nothing after it runs.
        scontrol requeue "$SLURM_JOB_ID" ||
            mt_log "scontrol requeue failed: submit with --requeue (and JobRequeue allowed), or resubmit by hand"
    fi
    return "$rc"
}
