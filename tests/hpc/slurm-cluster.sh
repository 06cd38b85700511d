# slurm-cluster.sh: a private one-node Slurm for the jobscript tests
# (sourced after lib.sh).
#
#   slurm_start     munged, slurmctld and slurmd under $workdir/slurm, on
#                   free ports, with their own munge key and socket; exits
#                   77 with the reason when they cannot run here
#   slurm_stop      cancels the jobs and stops the daemons (by pid); set
#                   as the EXIT trap by slurm_start
#   slurm_wait J S  waits up to S seconds for job J to end; sets job_state,
#                   job_exit (e.g. 0:0) and job_restarts
#
# The node declares 8 CPUs and 8 GPUs whatever the machine has
# (SlurmdParameters=config_overrides).  The "GPUs" are character devices
# made with mknod as copies of /dev/null (plain files where mknod is not
# allowed), so Slurm schedules --gpus-per-node and sets
# CUDA_VISIBLE_DEVICES as on a GPU node; nothing opens them.  Nothing here
# touches the machine's own Slurm or munge configuration.

slurm_skip() { echo "SKIP: $*"; exit 77; }

slurm_start() {
    [ "$(id -u)" -eq 0 ] || slurm_skip "starting slurmd needs root (tasks run as the submitting user)"
    local b
    for b in munged munge slurmctld slurmd sbatch squeue scontrol sinfo scancel srun; do
        command -v "$b" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin
        command -v "$b" >/dev/null 2>&1 ||
            slurm_skip "$b not found (Debian: apt-get install slurm-wlm munge; share/install-deps.sh does)"
    done
    # A job of the surrounding environment must not leak into ours.
    unset $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p')
    sd="$workdir/slurm"
    mkdir -p "$sd/munge" "$sd/state" "$sd/spool" "$sd/log" || return 99
    chmod 700 "$sd" "$sd/munge"
    trap 'slurm_stop; rm -rf "$workdir"' EXIT
    trap 'exit 99' INT TERM

    head -c 1024 /dev/urandom > "$sd/munge/munge.key" && chmod 600 "$sd/munge/munge.key"
    # --force: the key and socket live under /tmp, which munged would
    # otherwise refuse as world-writable.
    munged --force --socket="$sd/munge/socket" --key-file="$sd/munge/munge.key" \
        --pid-file="$sd/munge/munged.pid" --log-file="$sd/munge/munged.log" \
        --seed-file="$sd/munge/seed" ||
        slurm_skip "munged did not start: $(tail -3 "$sd/munge/munged.log" 2>/dev/null)"

    local ports host i
    ports=$(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))') || return 99
    set -- $ports
    host=$(hostname -s)
    for i in 0 1 2 3 4 5 6 7; do
        mknod "$sd/gpu$i" c 1 3 2>/dev/null || : > "$sd/gpu$i"
    done
    cat > "$sd/slurm.conf" <<EOF
# written by tests/hpc/slurm-cluster.sh
ClusterName=meshtrain-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$1
SlurmdPort=$2
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sd/munge/socket
StateSaveLocation=$sd/state
SlurmdSpoolDir=$sd/spool
SlurmctldPidFile=$sd/slurmctld.pid
SlurmdPidFile=$sd/slurmd.pid
SlurmctldLogFile=$sd/log/slurmctld.log
SlurmdLogFile=$sd/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
JobRequeue=1
ReturnToService=2
MessageTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=600
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 Gres=gpu:8 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    echo "NodeName=$host Name=gpu File=$sd/gpu[0-7]" > "$sd/gres.conf"
    export SLURM_CONF="$sd/slurm.conf"
    # -c: a cold start, no state from an earlier run; -i: ignore state
    # files that cannot be recovered.
    slurmctld -c -i -f "$SLURM_CONF" ||
        slurm_skip "slurmctld did not start: $(tail -5 "$sd/log/slurmctld.log" 2>/dev/null)"
    slurmd -f "$SLURM_CONF" ||
        slurm_skip "slurmd did not start: $(tail -5 "$sd/log/slurmd.log" 2>/dev/null)"
    for i in $(seq 1 60); do
        [ "$(sinfo -h -n "$host" -o %T 2>/dev/null)" = idle ] && return 0
        sleep 0.5
    done
    slurm_skip "the node did not become idle: $(sinfo 2>&1 | tail -2);
$(grep -h error "$sd/log/slurmctld.log" "$sd/log/slurmd.log" 2>/dev/null | tail -5)"
}

slurm_stop() {
    [ -n "${sd:-}" ] || return 0
    if [ -n "${SLURM_CONF:-}" ] && [ -r "$sd/slurmctld.pid" ]; then
        scancel --quiet --full --user=root 2>/dev/null
        local i
        for i in $(seq 1 40); do
            [ -z "$(squeue -h -t running,completing 2>/dev/null)" ] && break
            sleep 0.25
        done
    fi
    local f
    for f in "$sd/slurmd.pid" "$sd/slurmctld.pid" "$sd/munge/munged.pid"; do
        [ -r "$f" ] && kill "$(cat "$f")" 2>/dev/null
    done
    sleep 0.5
    sd=
}

# slurm_submit OUT [sbatch options and script args]: prints the job id.
slurm_submit() {
    local out=$1
    shift
    sbatch --parsable --output="$out" "$@"
}

slurm_wait() {
    local job=$1 limit=$2 i line
    for i in $(seq 1 $((limit * 4))); do
        line=$(scontrol -o show job "$job" 2>/dev/null)
        job_state=$(printf '%s\n' "$line" | sed -n 's/.* JobState=\([A-Z_]*\).*/\1/p')
        job_exit=$(printf '%s\n' "$line" | sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p')
        job_restarts=$(printf '%s\n' "$line" | sed -n 's/.* Restarts=\([0-9]*\).*/\1/p')
        case "$job_state" in
            COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
                return 0 ;;
        esac
        sleep 0.25
    done
    scancel "$job" 2>/dev/null
    job_state="still $job_state after ${limit}s"
    return 1
}

# slurm_dump_logs: the daemons' errors, for a failing check.
slurm_dump_logs() {
    grep -h -i error "$sd/log/slurmctld.log" "$sd/log/slurmd.log" 2>/dev/null | tail -10
}
