#!/bin/sh
# nccl_emulation.sh: the trainer's NCCL paths, run on the host.
#
# tests/emu/nccl/build/bin holds the apps built against the host emulation
# of the CUDA runtime and NCCL (tests/emu/nccl, doc/gpu.md "Host emulation
# of the NCCL paths"): distributed.device cuda then binds an emulated GPU
# per rank, the trainer takes NCCL (collectives nccl), and every
# collective goes through src/comm/nccl_comm.c on emulated streams, with the
# CPU backend's kernels.  Each mesh must log that it ran on NCCL and
# reproduce the CPU run of the same mesh, built the same way:
#  - ddp (buckets on the group stream; bf16 buckets through the pad; small
#    buckets);
#  - fsdp2 with and without resharding, HSDP on 4 ranks, megatron_fsdp
#    zero 1 and 3 (the padded all-gathers and reduce-scatters of uneven
#    shards, prefetch joined per unit), and in bf16 fsdp2, HSDP (the
#    replicas' bf16 all-reduce) and zero 2 (bf16 pads);
#  - tp 2 with sequence parallelism in fp32 and bf16, and without it in
#    bf16 (the TP hook's bf16 wire buffer: gathers, reduce-scatters,
#    all-reduces);
#  - pp 2 under 1f1b, zero_bubble and interleaved with fsdp2 over dp 2
#    (the pipeline channels: a two-rank NCCL communicator each, early
#    receives into their own buffers), pp 2 in bf16, and the V schedule
#    with 8 microbatches (16 sends a rank through 3 buffers taken in turn,
#    the device waiting for each buffer's previous transfer);
#  - cp 2 on packed rows (the ring's grouped K/V and dK/dV steps), and in
#    bf16 on 2 and 4 ranks (K/V as bf16 bits, widened after each step's
#    join; on 4 the bits received are sent on);
#  - a MoE under ep 2 (the token all-to-all-v; in bf16, rows of bf16
#    bits widened at the join), under ddp 2 (the adopted
#    replicas' communicator: default and small buckets, bf16), under tp 2
#    and cp 2 x ep 2 on 4 ranks;
# one rank on the emulated GPU, and fsdp2 with collectives auto (NCCL) and
# mpi (staged through host copies);
# all bit for bit (losses and gradient norms, tolerance 0); that most fsdp2
# gathers and reduce-scatters, ddp buckets, HSDP's replica all-reduces,
# cp ring steps, MoE token all-to-alls and the replicated experts' buckets,
# and the backward's TP re-gathers
# and input-gradient reductions, have compute
# launched between their post and their join (the overlap, in stream
# order); and the dense
# and cp meshes' device pool peaks within 5% of meshtrain-plan's device
# estimate (NCCL's wire buffers included); a checkpoint
# written by an emulated fsdp2 run resumes there bit for bit; and a hung
# collective (a data-parallel all-reduce, a pipeline channel's receive)
# ends the run through the watchdog after distributed.timeout_s.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
emu="$abs_top_builddir/tests/emu/nccl/build/bin"
[ -x "$emu/meshtrain-dense" ] || { echo "no $emu/meshtrain-dense: make check builds it"; exit 99; }
gpu_args= # the host emulation, never the GPUs
common="$parity_common step_scheduler.max_steps=4 step_scheduler.ckpt_every_steps=2"
nccl="distributed.device=cuda distributed.collectives=nccl"

mesh() { # mesh NAME NP [key=value ...]: the CPU run and the emulated NCCL run
    mesh_name=$1 mesh_np=$2; shift 2
    app="$emu/${mesh_app:-meshtrain-dense}"
    train "$mesh_name" "$mesh_np" "$@"
    MT_EMU_OVERLAP="$workdir/$mesh_name.overlap"; export MT_EMU_OVERLAP
    train "${mesh_name}n" "$mesh_np" "$@" $nccl
    unset MT_EMU_OVERLAP
    expect_in "$(cat "$workdir/${mesh_name}n.log")" "collectives NCCL" "$mesh_name: on NCCL"
    compare_losses "$workdir/$mesh_name.jsonl" "$workdir/${mesh_name}n.jsonl" \
        "$mesh_name, $mesh_np ranks, emulated NCCL" 0 0
    [ "$plan_tol" = none ] || plan_checked "$workdir/${mesh_name}n.log" "$mesh_name" "$plan_tol"
}
plan_tol=0.05
# plan_checked LOG NAME TOL: the device pool's peak (the largest rank's)
# within TOL of meshtrain-plan's device estimate (NCCL's buffers included)
plan_checked() {
    checks=$((checks + 1))
    python3 - "$1" "$3" <<'PY' || fail "$2: device memory peak against the plan"
import re, sys
m = re.search(r"device memory peak \(MiB, the largest of the ranks\): ([0-9.]+), plan estimate ([0-9.]+)",
              open(sys.argv[1]).read())
assert m, "no device memory peak line"
peak, plan = float(m.group(1)), float(m.group(2))
assert abs(peak - plan) <= float(sys.argv[2]) * plan, f"peak {peak} MiB, plan {plan} MiB"
print(f"device memory peak {peak} MiB, plan {plan} MiB ({100 * (peak / plan - 1):+.1f}%)")
PY
}
bf="distributed.mp_policy.param_dtype=bfloat16 distributed.mp_policy.reduce_dtype=bfloat16"
mesh ddp 2 distributed.strategy=ddp
mesh ddpbf 2 distributed.strategy=ddp $bf
mesh fsdp2 2
mesh fsdp2nr 2 distributed.reshard_after_forward=false
mesh hsdp 4 distributed.dp_replicate_size=2
mesh mz1 2 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=1
mesh mz3 2 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=3
mesh fsdp2bf 2 $bf
mesh hsdpbf 4 distributed.dp_replicate_size=2 $bf
mesh mz2bf 2 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=2 $bf
mesh tpsp 2 distributed.tp_size=2 distributed.sequence_parallel=true
mesh tpspbf 2 distributed.tp_size=2 distributed.sequence_parallel=true $bf
mesh tpbf 2 distributed.tp_size=2 $bf
pipe="distributed.pp_size=2 step_scheduler.local_batch_size=4 distributed.pipeline.pp_schedule"
mesh pp 2 $pipe=1f1b
mesh ppzb 2 $pipe=zero_bubble
mesh ppdp 4 $pipe=interleaved_1f1b model.num_hidden_layers=4
mesh ppbf 2 $pipe=1f1b $bf
mesh ppv 2 $pipe=v_schedule model.num_hidden_layers=4 step_scheduler.local_batch_size=8

# Overlap (MT_EMU_OVERLAP: per kind of NCCL operation, how many the
# compute stream joined with compute kernels launched between the
# operation's post and its join, the work it can hide behind on a GPU):
# overlapped KIND MESH MIN: on rank 0 of MESH's NCCL run, at least MIN of
# the joined operations of KIND had work to hide behind
overlapped() {
    checks=$((checks + 1))
    python3 - "$workdir/$2.overlap.0" "$1" "$3" <<'PY' || fail "$2: $1 overlap"
import sys
rows = {l.split()[0]: [int(x) for x in l.split()[2::2]] for l in open(sys.argv[1])}
posted, joined, hidden, kernels = rows[sys.argv[2]]
assert joined > 0 and hidden >= float(sys.argv[3]) * joined, rows[sys.argv[2]]
print(f"{sys.argv[2]}: {hidden} of {joined} joined overlapped ({kernels} kernels behind them)")
PY
}
overlapped all_gather fsdp2 0.75    # prefetch: the next unit's gather behind this one
overlapped reduce_scatter fsdp2 0.5 # behind the backward of the units before
mesh ddpb 2 distributed.strategy=ddp distributed.ddp_bucket_cap_mb=0.05
overlapped all_reduce ddpb 0.5      # buckets behind the rest of backward (several buckets)
overlapped all_reduce hsdp 0.5      # the replicas' all-reduce of each final shard
overlapped all_gather tpsp 0.25     # a norm output's re-gather behind the input-gradient GEMMs
overlapped reduce_scatter tpsp 0.35 # dh's reduce-scatter behind the weight-gradient GEMMs
overlapped all_reduce tpbf 0.25     # dh's all-reduce, likewise

# one rank on the emulated GPU (no collectives); two with collectives auto
# (each rank has its own GPU: NCCL) and mpi (host copies)
app="$emu/meshtrain-dense"
train one 1
train onen 1 distributed.device=cuda
compare_losses "$workdir/one.jsonl" "$workdir/onen.jsonl" "1 rank, emulated GPU" 0 0
train auto 2 distributed.device=cuda
expect_in "$(cat "$workdir/auto.log")" "collectives NCCL" "collectives auto with a GPU per rank"
compare_losses "$workdir/fsdp2.jsonl" "$workdir/auto.jsonl" "fsdp2, collectives auto" 0 0
train staged 2 distributed.device=cuda distributed.collectives=mpi
expect_in "$(cat "$workdir/staged.log")" "collectives MPI on host copies" "collectives mpi"
compare_losses "$workdir/fsdp2.jsonl" "$workdir/staged.jsonl" "fsdp2, staged on the GPU" 0 0

# resume from the emulated fsdp2 run's step-2 checkpoint
app="$emu/meshtrain-dense"
train fsdp2r 2 $nccl checkpoint.resume="$workdir/fsdp2n/step_00000002"
compare_losses "$workdir/fsdp2.jsonl" "$workdir/fsdp2r.jsonl" "fsdp2, emulated NCCL resume" 3 0

# the watchdog: a rank whose K-th NCCL operation never completes
# (MT_EMU_HANG=rank:K) leaves its peers waiting; after distributed.timeout_s
# a rank names the collective and the axis, aborts and exits with 3.  The
# launcher's status is usually that 3; once, under load, it was 1 after both
# ranks' watchdogs had reported (a rank ending another way once its peer
# was gone), so 1 is accepted too: what is checked is that the run ends
# (np gives it 300 s) and that the report is there.
hang() { # hang RANK:K NEEDLE [key=value ...]
    h=$1 needle=$2; shift 2
    checks=$((checks + 1))
    MT_EMU_HANG=$h np 2 "$emu/meshtrain-dense" --config "$small_cfg" $common \
        checkpoint.enabled=false logging.metrics_file="$workdir/hang.jsonl" $nccl \
        distributed.timeout_s=2 "$@" \
        >"$workdir/out" 2>"$workdir/err"
    rc=$?
    err=$(cat "$workdir/err")
    case $rc in 3 | 1) ;; *) fail "hang $h: exit $rc, expected 3 (or 1): $err" ;; esac
    expect_in "$err" "$needle" "hang $h: the watchdog's report"
    expect_in "$err" "did not complete in 2 s (distributed.timeout_s)" "hang $h: the timeout"
}
hang 1:2 "NCCL all_reduce on axis dp_shard" distributed.strategy=ddp
hang 0:4 "on axis pp activations 0->1" $pipe=1f1b

mesh_app=meshtrain-cp
common="$parity_common step_scheduler.max_steps=3 step_scheduler.ckpt_every_steps=3"
mesh cp 2 distributed.cp_size=2 packed_sequence.packed_sequence_size=64
overlapped send_recv cp 0.45        # the next K/V shift behind this block's attention
mesh cpbf 2 distributed.cp_size=2 packed_sequence.packed_sequence_size=64 $bf
mesh cpbf4 4 distributed.cp_size=4 packed_sequence.packed_sequence_size=64 $bf # passes received bits on

mesh_app=meshtrain-moe
plan_tol=0.10 # dropless routing grows its row buffers past the plan (doc/plan.md)
common="$common model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32
 model.norm_topk_prob=true model.router_aux_loss_coef=0.01 model.num_shared_experts=1
 model.moe_router_bias_update_rate=0.001"
mesh mep 2 distributed.ep_size=2
mesh mddp 2 distributed.strategy=ddp
mesh mtp 2 distributed.tp_size=2
mesh mcpep 4 distributed.cp_size=2 distributed.ep_size=2
overlapped send_recv mep 0.7        # the shared experts and the router behind the dispatch
mesh mddpb 2 distributed.strategy=ddp distributed.ddp_bucket_cap_mb=0.01
overlapped all_reduce mddpb 0.8     # dense and expert buckets behind the rest of backward
mesh mddpbf 2 distributed.strategy=ddp $bf
mesh mepbf 2 distributed.ep_size=2 $bf
overlapped send_recv mepbf 0.7      # bf16 rows: packed before, widened at the join
finish
