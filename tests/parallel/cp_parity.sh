#!/bin/sh
# cp_parity.sh: context parallelism (ring attention over load-balanced
# causal chunks, doc/context-parallel.md) computes the single-rank run on
# the same rows.  Packed rows (meshtrain-cp, packed_sequence_size 64, whose
# documents cross the chunk boundaries): cp 2 on 2 ranks, cp 4 on 4, cp 2 x
# fsdp2 dp 2 (sharded over dp_shard_cp: 4 ranks), cp 2 x HSDP (2 replicas,
# each sharded over its 2 CP ranks), cp 2 x tp 2 with sequence parallelism
# and activation checkpointing.  Plain rows (meshtrain-dense,
# local_batch_size 2, so two rows per micro-batch): cp 2 with the
# validation loss, cp 4 with megatron_fsdp zero 0 (bucketed all-reduce over
# dp_cp), cp 2 x megatron_fsdp zero 3 dp 2.  (ddp itself refuses cp_size >
# 1 in validation.)  20 steps: step
# 1 within 1e-6, every step within 1e-5 (losses; grad norms 1e-4), final
# parameters within 5e-5 norm-wise (as tp_parity.sh: AdamW amplifies
# rounding on near-zero gradients).  A cp 2 x dp 2 run resumed from its
# step-10 checkpoint continues bit-identically, and the cp 1 checkpoint
# resumes under cp 2 (parameters are replicated over cp, so checkpoints do
# not depend on it).
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
cfg="$small_cfg"

# ---- packed rows
app="$bindir/meshtrain-cp"
common="$parity_common packed_sequence.packed_sequence_size=64"
train p1 1
train pc2 2 distributed.cp_size=2
train pc4 4 distributed.cp_size=4
train pc2d2 4 distributed.cp_size=2 distributed.strategy=fsdp2
expect_in "$out" "sharded over 4 ranks" "cp 2 x fsdp2 dp 2 shards over dp_shard_cp"
train pc2h 4 distributed.cp_size=2 distributed.dp_replicate_size=2
expect_in "$out" "sharded over 2 ranks" "cp 2 x HSDP 2 replicas: shards over cp"
train pc2t2 4 distributed.cp_size=2 distributed.tp_size=2 distributed.sequence_parallel=true \
    distributed.activation_checkpointing=true
parity p1 pc2 "packed, cp 2"
parity p1 pc4 "packed, cp 4"
parity p1 pc2d2 "packed, cp 2 x fsdp2 dp 2"
parity p1 pc2h "packed, cp 2 x HSDP (2 replicas, sharded over cp)"
parity p1 pc2t2 "packed, cp 2 x tp 2 (sequence parallel, activation checkpointing)"
train pc2d2r 4 distributed.cp_size=2 distributed.strategy=fsdp2 \
    checkpoint.resume="$workdir/pc2d2/step_00000010"
expect_in "$out" "resumed from $workdir/pc2d2/step_00000010 at step 10" "cp 2 x dp 2 resume"
compare_losses "$workdir/pc2d2.jsonl" "$workdir/pc2d2r.jsonl" "packed cp 2 x dp 2 resumed" 11 0
train pc2r1 2 distributed.cp_size=2 checkpoint.resume="$workdir/p1/step_00000010"
compare_losses "$workdir/p1.jsonl" "$workdir/pc2r1.jsonl" "cp 1 checkpoint resumed under cp 2" 11

# ---- plain rows
app="$bindir/meshtrain-dense"
common="$parity_common step_scheduler.local_batch_size=2 dataset.validation_path=$data
 step_scheduler.val_every_steps=10"
train u1 1
train uc2 2 distributed.cp_size=2
train uc4 4 distributed.cp_size=4 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=0
train uc2z3 4 distributed.cp_size=2 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=3
parity u1 uc2 "plain rows, cp 2"
parity u1 uc4 "plain rows, cp 4, megatron_fsdp zero 0"
parity u1 uc2z3 "plain rows, cp 2 x megatron_fsdp zero 3 dp 2"
checks=$((checks + 1))
python3 - "$workdir/u1.jsonl" "$workdir/uc2.jsonl" "$workdir/uc4.jsonl" <<'PY' || fail "validation loss under cp"
import json, sys
def val(p):
    return {j["step"]: j["val_loss"] for j in map(json.loads, open(p)) if "val_loss" in j}
ref = val(sys.argv[1])
assert sorted(ref) == [10, 20], ref
for p in sys.argv[2:]:
    got = val(p)
    for s in ref:
        rel = abs(got[s] - ref[s]) / ref[s]
        assert rel <= 1e-5, f"{p} step {s}: val_loss {got[s]} vs {ref[s]} ({rel:.2e})"
print("validation losses agree")
PY
# the worst loss difference over every cp run, for the log
python3 - "$workdir" <<'PY'
import json, os, sys
w = sys.argv[1]
def loss(n):
    return {j["step"]: j["loss"] for j in map(json.loads, open(os.path.join(w, n + ".jsonl")))}
for ref, runs in (("p1", ["pc2", "pc4", "pc2d2", "pc2h", "pc2t2"]), ("u1", ["uc2", "uc4", "uc2z3"])):
    a = loss(ref)
    worst = max(abs(loss(r)[s] - a[s]) / abs(a[s]) for r in runs for s in a)
    print(f"{ref}: worst relative loss difference over {', '.join(runs)}: {worst:.2e}")
PY
finish
