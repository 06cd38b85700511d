# meshtrain-bind.sh: run one rank with its node-local GPU binding.
#
#   srun ... bash meshtrain-bind.sh APP [ARGS ...]
#
# The launcher runs this in front of every rank.  It gives the rank the
# GPU of its node-local index: the i-th entry of the CUDA_VISIBLE_DEVICES
# list Slurm set for the job, or i itself where no list is set; then it
# execs APP.  i is Hydra's MPI_LOCALRANKID when mpiexec launched the rank
# (inside an allocation Hydra starts one proxy per node with srun, so
# SLURM_LOCALID is the proxy's, 0 for every rank), else SLURM_LOCALID.
#
# Why not --gpus-per-task / --gpu-bind: with ConstrainDevices=yes those
# put each rank in a device cgroup holding only its own GPU, and NCCL then
# cannot use CUDA IPC (NVLink peer-to-peer) between the ranks of a node.
# Requesting --gpus-per-node and choosing here keeps every GPU of the node
# in every rank's cgroup.  MESHTRAIN_GPU_BIND=none leaves
# CUDA_VISIBLE_DEVICES as the launcher set it (e.g. with --gpu-bind).
# MESHTRAIN_SHOW_BINDING=1 prints one line per rank.
# It does not pin CPUs or memory: srun's --cpu-bind does that.

local_id=${MPI_LOCALRANKID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-0}}}
if [ "${MESHTRAIN_GPU_BIND:-local}" != none ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
        export CUDA_VISIBLE_DEVICES=${gpus[$((local_id % ${#gpus[@]}))]}
    else
        export CUDA_VISIBLE_DEVICES=$local_id
    fi
fi
if [ "${MESHTRAIN_SHOW_BINDING:-0}" = 1 ]; then
    echo "meshtrain-bind: rank ${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-0}}} on $(hostname), local ${local_id}: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-}"
fi
exec "$@"
