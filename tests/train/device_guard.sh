#!/bin/sh
# device_guard.sh: the trainer keeps its hands off device memory.
#
# distributed.device=cpu_guarded trains with the CPU kernels on memory
# that host code may not touch (mmap'd, PROT_NONE outside the backend's
# calls; kernels_cpu_guard.c): any host access to a parameter, gradient,
# optimizer moment or activation by the model, the optimizer, clipping,
# the checkpoint I/O or the MoE bookkeeping kills the run with the
# address and the allocation it hit; and strict (MESHTRAIN_GUARD_STRICT)
# so is a host array handed to a kernel.  A GPU run needs exactly this
# discipline, so this is the CPU-side proof that the trainer can run on
# the CUDA backend.  Each guarded run must reproduce its plain CPU run
# bit for bit (losses and gradient norms, tolerance 0), and so must a
# guarded resume from a guarded checkpoint (staged through host copies):
#  - the dense small model with a validation set;
#  - a MoE (4 experts, top 2, a shared expert, bias balancing) with
#    activation checkpointing that keeps the router;
#  - several ranks, whose collectives are staged through host buffers
#    (mt_stage.h): ddp, fsdp2 (with and without resharding after forward,
#    and HSDP on 4 ranks, resumed from a guarded sharded checkpoint),
#    megatron_fsdp zero 3 and tp 2 with sequence parallelism, fsdp2 and
#    megatron_fsdp zero 2 in bf16 mixed precision (bf16 wire), and pp 2
#    (1f1b, zero_bubble, and interleaved with fsdp2 over dp 2: the
#    pipeline's sends and receives are staged too), each bit for bit
#    against the plain CPU run of the same mesh (6 steps);
#  - context and expert parallelism (3 steps each): cp 2 on packed rows
#    (ring attention's K/V and dK/dV ring, document-masked block
#    skipping); a MoE under ep 2 (the token all-to-alls), under ddp over
#    2 ranks (the replicated experts' gradient all-reduce), and cp 2 x ep 2
#    on 4 ranks (ring attention in the MoE model, the experts sharded over
#    their 2 replicas, the routing totals summed over cp), bit for bit
#    with the aux loss;
#  - bf16 mixed precision, where the plain run's table (cpu_bf16) rounds
#    activations inside its kernels and the guarded one (which wraps the
#    plain cpu table) in passes after them: fsdp2, zero 2 and tp 2 above
#    (the vocabulary-parallel loss), and a 1-rank MoE with qk_norm, bit for
#    bit;
#  - the kernel profiler (MESHTRAIN_PROFILE=1, kernels_profile.c), which
#    wraps the backend too: ddp 2 profiled is bit for bit the plain run,
#    and it counts whole steps past the first: 3 steps count twice the
#    matmuls of 2, and one gradient-norm sum_squares a step.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
cfg="$small_cfg"
val="dataset.validation_path=$data step_scheduler.val_every_steps=10"
common="$parity_common $val step_scheduler.max_steps=12"
g="distributed.device=cpu_guarded"
gpu_args= # the references are CPU runs, also with MESHTRAIN_TEST_GPUS
export MESHTRAIN_GUARD_STRICT=1

train d1 1
train dg 1 $g
compare_losses "$workdir/d1.jsonl" "$workdir/dg.jsonl" "dense, guarded" 0 0
checks=$((checks + 1))
python3 - "$workdir/d1.jsonl" "$workdir/dg.jsonl" <<'PY' || fail "dense, guarded: validation losses differ"
import json, sys
a, b = ([j.get("val_loss") for j in map(json.loads, open(f))] for f in sys.argv[1:])
assert a == b and any(v is not None for v in a), (a, b)
PY
train dr 1 $g checkpoint.resume="$workdir/dg/step_00000010"
compare_losses "$workdir/d1.jsonl" "$workdir/dr.jsonl" "dense, guarded resume from a guarded checkpoint" 11 0

# the mesh runs: staged collectives, the CPU run of the same mesh as reference
dense="$common"
common="$parity_common step_scheduler.max_steps=6 step_scheduler.ckpt_every_steps=3"
mesh() { # mesh NAME NP [key=value ...] (train sets $name and $n: own names here)
    mesh_name=$1 mesh_np=$2; shift 2
    train "$mesh_name" "$mesh_np" "$@"
    train "${mesh_name}g" "$mesh_np" "$@" $g
    compare_losses "$workdir/$mesh_name.jsonl" "$workdir/${mesh_name}g.jsonl" \
        "$mesh_name, $mesh_np ranks, guarded" 0 0
}
mesh ddp 2 distributed.strategy=ddp
mesh fsdp2 2
mesh fsdp2nr 2 distributed.reshard_after_forward=false
mesh hsdp 4 distributed.dp_replicate_size=2
train hsdpr 4 distributed.dp_replicate_size=2 $g checkpoint.resume="$workdir/hsdpg/step_00000003"
compare_losses "$workdir/hsdp.jsonl" "$workdir/hsdpr.jsonl" "hsdp, guarded resume" 4 0
mesh mz3 2 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=3
mesh tpsp 2 distributed.tp_size=2 distributed.sequence_parallel=true
# bf16 mixed precision: the rounding, the master weights apart (zero 2),
# bf16 gathers and reductions through the staging buffers
bf="distributed.mp_policy.param_dtype=bfloat16 distributed.mp_policy.reduce_dtype=bfloat16"
mesh fsdp2bf 2 $bf
mesh mz2bf 2 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=2 $bf
mesh tpbf 2 distributed.tp_size=2 $bf # the vocabulary-parallel loss reads rounded logits
pipe="distributed.pp_size=2 step_scheduler.local_batch_size=4 distributed.pipeline.pp_schedule"
mesh pp 2 $pipe=1f1b
mesh ppzb 2 $pipe=zero_bubble
mesh ppdp 4 $pipe=interleaved_1f1b model.num_hidden_layers=4
app="$bindir/meshtrain-cp"
common="$parity_common step_scheduler.max_steps=3 step_scheduler.ckpt_every_steps=3"
mesh cp 2 distributed.cp_size=2 packed_sequence.packed_sequence_size=64
common="$dense"

app="$bindir/meshtrain-moe"
common="$common model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32
 model.norm_topk_prob=true model.router_aux_loss_coef=0.01 model.num_shared_experts=1
 model.moe_router_bias_update_rate=0.001 distributed.activation_checkpointing=true
 distributed.moe.ignore_router_for_ac=true"
train m1 1
train mg 1 $g
compare_losses "$workdir/m1.jsonl" "$workdir/mg.jsonl" "MoE, guarded" 0 0
train mr 1 $g checkpoint.resume="$workdir/mg/step_00000010"
compare_losses "$workdir/m1.jsonl" "$workdir/mr.jsonl" "MoE, guarded resume" 11 0

# the aux loss too: the routing totals and the experts' load
moe_mesh() {
    mesh "$@"
    checks=$((checks + 1))
    python3 - "$workdir/$mesh_name.jsonl" "$workdir/${mesh_name}g.jsonl" <<'PY' || fail "$mesh_name, guarded: aux losses or expert loads differ"
import json, sys
k = ("aux_loss", "expert_load_min", "expert_load_max")
a, b = ([tuple(j[x] for x in k) for j in map(json.loads, open(f))] for f in sys.argv[1:])
assert a == b and a and all(v[0] > 0 for v in a), (a, b)
PY
}
common="$common step_scheduler.max_steps=3 step_scheduler.ckpt_every_steps=3"
moe_mesh mep 2 distributed.ep_size=2
moe_mesh mddp 2 distributed.strategy=ddp
moe_mesh mcpep 4 distributed.cp_size=2 distributed.ep_size=2
# bf16 with qk_norm: the plain run's table rounds inside its kernels
# (cpu_bf16), the guarded one's in passes after them (the guard wraps the
# plain table), through the routed and shared experts' SwiGLU and the q/k
# norms: the same bits
moe_mesh mbf 1 $bf model.qk_norm=true

common="$parity_common checkpoint.enabled=false"
app= # meshtrain-dense again
train p3 2 distributed.strategy=ddp step_scheduler.max_steps=3
export MESHTRAIN_PROFILE=1
train p3p 2 distributed.strategy=ddp step_scheduler.max_steps=3
train p2p 2 distributed.strategy=ddp step_scheduler.max_steps=2
unset MESHTRAIN_PROFILE
compare_losses "$workdir/p3.jsonl" "$workdir/p3p.jsonl" "ddp 2, profiled" 0 0
calls() { awk -v e="$1" '$1 == e && NF == 5 { print $2 }' "$workdir/$2.log"; }
checks=$((checks + 1))
python3 - "$(calls matmul p2p)" "$(calls matmul p3p)" "$(calls sum_squares p3p)" <<'PY' || fail "kernel profile counts"
import sys
m2, m3, ss = (int(x) for x in sys.argv[1:])
assert m2 > 0 and m3 == 2 * m2, f"matmul calls: {m2} for 1 counted step, {m3} for 2"
assert ss == 2, f"{ss} sum_squares calls in 2 steps (one gradient-norm sum a step)"
print(f"profile: {m2} matmuls a step, one gradient-norm sum a step")
PY
expect_in "$(cat "$workdir/p3p.log")" "kernel profile (cpu" "the profile table"
finish
