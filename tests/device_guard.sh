#!/bin/sh
# device_guard.sh: the one-rank trainer keeps its hands off device memory.
#
# distributed.device=cpu_guarded trains with the CPU kernels on memory
# that host code may not touch (mmap'd, PROT_NONE outside the backend's
# calls; kernels_cpu_guard.c): any host access to a parameter, gradient,
# optimizer moment or activation by the model, the optimizer, clipping,
# the checkpoint I/O or the MoE bookkeeping kills the run with the
# address and the allocation it hit.  A GPU run needs exactly this
# discipline, so this is the CPU-side proof that one rank can train on
# the CUDA backend.  Each guarded run must reproduce its plain CPU run
# bit for bit (losses and gradient norms, tolerance 0), and so must a
# guarded resume from a guarded checkpoint (staged through host copies):
#  - the dense small model with a validation set;
#  - a MoE (4 experts, top 2, a shared expert, bias balancing) with
#    activation checkpointing that keeps the router;
#  - more than one rank is refused (the collectives are not on the device).
. "${abs_top_srcdir:-$(dirname "$0")/..}/tests/lib.sh"
cfg="$small_cfg"
val="dataset.validation_path=$data step_scheduler.val_every_steps=10"
common="$parity_common $val step_scheduler.max_steps=12"
g="distributed.device=cpu_guarded"

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

expect_rc 1 np 2 "$app" --config "$cfg" $common $g checkpoint.enabled=false
expect_in "$err" "cpu_guarded trains on one rank in this release" "more ranks refused"
finish
