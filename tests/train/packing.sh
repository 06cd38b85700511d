#!/bin/sh
# packing.sh: meshtrain-cp trains packed sequences (packed_sequence_size
# 64 over the shipped corpus, whose documents end at the end-of-document
# token).  1 rank, fsdp2 on 2 ranks and ddp on 4 compute the same run
# (step 1 within 1e-6, 20 steps within 1e-5); a run resumed from its step
# 10 continues bit-identically, and the packing log line is printed.
# Context parallelism over packed rows: tests/parallel/cp_parity.sh.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
app="$bindir/meshtrain-cp"
cfg="$small_cfg"
common="$parity_common packed_sequence.packed_sequence_size=64"

train p1 1
expect_in "$out" "documents (" "packing reported"
expect_in "$out" "rows of 64 tokens" "rows of packed_sequence_size"
train p2 2 distributed.strategy=fsdp2
train p4 4 distributed.strategy=ddp
compare_losses "$workdir/p1.jsonl" "$workdir/p2.jsonl" "packed, fsdp2 x2"
compare_losses "$workdir/p1.jsonl" "$workdir/p4.jsonl" "packed, ddp x4"
train p2r 2 distributed.strategy=fsdp2 checkpoint.resume="$workdir/p2/step_00000010"
expect_in "$out" "resumed from $workdir/p2/step_00000010 at step 10" "packed resume"
compare_losses "$workdir/p2.jsonl" "$workdir/p2r.jsonl" "packed fsdp2 x2 resumed" 11 0
# packing changes the run: the plain rows give other losses
expect_rc 0 "$bindir/meshtrain-dense" --config "$cfg" dataset.path="$data" \
    step_scheduler.max_steps=2 checkpoint.enabled=false logging.metrics_file="$workdir/plain.jsonl"
checks=$((checks + 1))
python3 - "$workdir/p1.jsonl" "$workdir/plain.jsonl" <<'PY' || fail "packed and plain rows gave the same loss"
import json, sys
a = json.loads(open(sys.argv[1]).readline())["loss"]
b = json.loads(open(sys.argv[2]).readline())["loss"]
assert abs(a - b) > 1e-6 * abs(a), (a, b)
PY

# local_batch_size must be 1 with packing
expect_rc 1 "$app" --config "$cfg" $common step_scheduler.local_batch_size=2
expect_in "$err" "packed sequences need local_batch_size 1" "local_batch_size refused"
finish
