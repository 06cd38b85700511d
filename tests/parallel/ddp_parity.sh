#!/bin/sh
# ddp_parity.sh: strategy ddp, and megatron_fsdp with zero_dp_strategy 0
# and 1 (optimizer state sharded), on 2 and 4 ranks compute the single-rank
# run.  The global batch (8) is the same; gradient accumulation changes
# from 4 micro-steps (1 rank) to 2 and 1.  Losses must match the 1-rank
# run: step 1 to 1e-6 relative, every step of 12 to 1e-5.  The 2-rank run
# uses tiny buckets (many overlapped all-reduces).  A checkpoint saved by
# the 2-rank run at step 6 resumes on 1 rank and continues like it.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
dense="$bindir/meshtrain-dense"
cfg="$small_cfg"
common="dataset.path=$data step_scheduler.max_steps=12 step_scheduler.ckpt_every_steps=6 step_scheduler.local_batch_size=2"
run() { name=$1; shift; echo "checkpoint.checkpoint_dir=$workdir/$name logging.metrics_file=$workdir/$name.jsonl $common"; }
ddp=distributed.strategy=ddp

expect_rc 0 "$dense" --config "$cfg" $(run r1) $ddp
expect_rc 0 np 2 "$dense" --config "$cfg" $(run r2) $ddp distributed.ddp_bucket_cap_mb=0.01
expect_in "$out" "(2 micro-steps of 2 x 64)" "2 ranks: 2 micro-steps"
expect_rc 0 np 4 "$dense" --config "$cfg" $(run r4) $ddp

compare() { compare_losses "$1" "$2" "$3"; }
resumed_matches() { compare_losses "$workdir/r1.jsonl" "$1" "$2" 7; }
compare "$workdir/r1.jsonl" "$workdir/r2.jsonl" "2 ranks"
compare "$workdir/r1.jsonl" "$workdir/r4.jsonl" "4 ranks"

# megatron_fsdp: zero 1 shards AdamW state over dp (each rank updates its
# rows, then the parameters are all-gathered); zero 0 without overlap.
mf="distributed.strategy=megatron_fsdp"
expect_rc 0 np 4 "$dense" --config "$cfg" $(run z1) $mf distributed.zero_dp_strategy=1
mem=$(printf '%s\n' "$out" | grep "memory per rank")
checks=$((checks + 1))
printf '%s\n' "$mem" | python3 -c "
import re, sys
l = sys.stdin.read()
opt = [float(x) for x in re.search(r'optimizer state ([0-9.]+) / ([0-9.]+)', l).groups()]
par = float(re.search(r'parameters ([0-9.]+) /', l).group(1))
assert abs(opt[0] - 2 * par / 4) <= 0.05 * opt[0], (opt, par)   # 8 bytes/param over 4 ranks
assert abs(opt[0] - opt[1]) <= 0.10 * opt[0], opt                # plan agrees
" || fail "zero 1: optimizer state not sharded 1/4: $mem"
expect_rc 0 np 2 "$dense" --config "$cfg" $(run z0) $mf distributed.zero_dp_strategy=0 \
    distributed.overlap_grad_reduce=false
compare "$workdir/r1.jsonl" "$workdir/z1.jsonl" "megatron_fsdp zero 1, 4 ranks"
compare "$workdir/r1.jsonl" "$workdir/z0.jsonl" "megatron_fsdp zero 0, 2 ranks"

# A checkpoint with optimizer shards from 4 ranks resumes under ddp on 2.
rm -rf "$workdir/z1/step_00000012"; echo step_00000006 > "$workdir/z1/latest"
cp "$workdir/r1.jsonl" "$workdir/z1r.jsonl"
expect_rc 0 np 2 "$dense" --config "$cfg" $common $ddp checkpoint.checkpoint_dir="$workdir/z1" \
    logging.metrics_file="$workdir/z1r.jsonl"
expect_in "$out" "resumed from $workdir/z1/step_00000006 at step 6" "zero-1 checkpoint under ddp"
resumed_matches "$workdir/z1r.jsonl" "zero 1 -> ddp"

# A checkpoint written on 2 ranks continues on 1.
rm -rf "$workdir/r2/step_00000012"; echo step_00000006 > "$workdir/r2/latest"
cp "$workdir/r1.jsonl" "$workdir/resumed.jsonl"
expect_rc 0 "$dense" --config "$cfg" $common $ddp checkpoint.checkpoint_dir="$workdir/r2" \
    logging.metrics_file="$workdir/resumed.jsonl"
expect_in "$out" "resumed from $workdir/r2/step_00000006 at step 6" "2-rank checkpoint on 1 rank"
resumed_matches "$workdir/resumed.jsonl" "2 ranks -> 1 rank"

finish
