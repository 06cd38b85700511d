#!/bin/sh
# comm_dtype.sh: the data-parallel collectives in distributed.mp_policy's
# dtypes (src/comm/comm_bf16.c) through the trainer, on 2 ranks, 10 steps.
#
#   - fsdp2 and ddp with reduce_dtype bfloat16 follow the float32 run
#     within a bf16 tolerance (losses 2e-2 relative, gradient norms 2e-1:
#     bf16 keeps 8 significant bits) but are not identical to it (the
#     dtype really changed what was summed);
#   - fsdp2 with param_dtype and reduce_dtype bfloat16 on the guarded CPU
#     backend (every collective staged through host buffers) is
#     bit-identical to the plain CPU backend, and so is ddp;
#   - the same bf16 layout run twice is bit-identical (a deterministic sum).
# The float32 default is covered bit for bit by ddp_parity.sh and
# fsdp_parity.sh; test_comm_bf16 checks the collectives themselves.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
cfg="$small_cfg"
common="dataset.path=$data step_scheduler.max_steps=10 step_scheduler.ckpt_every_steps=10
 step_scheduler.local_batch_size=2 checkpoint.keep_last_n=0"
f2="distributed.strategy=fsdp2"
ddp="distributed.strategy=ddp distributed.ddp_bucket_cap_mb=0.05"
rb="distributed.mp_policy.reduce_dtype=bfloat16"
pb="distributed.mp_policy.param_dtype=bfloat16"
guard="distributed.device=cpu_guarded"

# close A B LABEL: within the bf16 tolerance, and not identical
close() {
    compare_losses "$workdir/$1.jsonl" "$workdir/$2.jsonl" "$3" 0 2e-2
    checks=$((checks + 1))
    cmp -s "$workdir/$1.jsonl" "$workdir/$2.jsonl" && fail "$3: identical to float32, bf16 not used"
}
same() { compare_losses "$workdir/$1.jsonl" "$workdir/$2.jsonl" "$3" 0 0; }

train f32 2 $f2
train fb 2 $f2 $rb
train fpb 2 $f2 $rb $pb
train fpb_g 2 $f2 $rb $pb $guard
train fpb2 2 $f2 $rb $pb
close f32 fb "fsdp2 reduce_dtype bfloat16"
close f32 fpb "fsdp2 param_dtype and reduce_dtype bfloat16"
same fpb fpb_g "fsdp2 bf16, staged (cpu_guarded) against the CPU"
same fpb fpb2 "fsdp2 bf16, run twice"

train d32 2 $ddp
train db 2 $ddp $rb
train db_g 2 $ddp $rb $guard
close d32 db "ddp reduce_dtype bfloat16"
same db db_g "ddp bf16, staged (cpu_guarded) against the CPU"
finish
