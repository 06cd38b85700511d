#!/bin/sh
# rope_parity.sh: RoPE scaling (model.rope_scaling, doc/rope-scaling.md)
# trains the same on every mesh as on one rank.  The small dense model
# (head_dim 16) on rows of 32 tokens, 20 steps of 2-row micro-batches:
#  - llama3 with original_max_position_embeddings 16, so that the rows
#    reach past the original context and every band of the table is in
#    use: tp 2 with sequence parallelism, pp 2 and cp 2 against 1 rank;
#    and its losses are not default RoPE's (the scaling reaches the
#    kernels);
#  - dynamic NTK with max_position_embeddings 16: cp 2 against 1 rank, on
#    plain rows (the CP ranks' own positions end at different places, so
#    the table must come from the whole row's, gathered over the CP
#    group) and on packed rows (meshtrain-cp, one packed row of 32 a
#    micro-batch), whose documents reach different lengths (the table
#    follows each micro-batch);
#  - yarn (attention factor 0.1 ln 4 + 1 on cos and sin) under tp 2.
# Tolerances are the parity tests' (compare_losses, params_close 5e-5).
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
cfg="$small_cfg"
common="$parity_common dataset.seq_length=32 step_scheduler.local_batch_size=2"
llama3="model.rope_scaling.rope_type=llama3 model.rope_scaling.factor=4.0
 model.rope_scaling.original_max_position_embeddings=16"
dynamic="model.rope_scaling.rope_type=dynamic model.rope_scaling.factor=4.0
 model.max_position_embeddings=16"
yarn="model.rope_scaling.rope_type=yarn model.rope_scaling.factor=4.0
 model.rope_scaling.original_max_position_embeddings=8"

train l1 1 $llama3
train lt2 2 $llama3 distributed.tp_size=2 distributed.sequence_parallel=true
train lp2 2 $llama3 distributed.pp_size=2 distributed.pipeline.pp_schedule=1f1b
train lc2 2 $llama3 distributed.cp_size=2
parity l1 lt2 "llama3, tp 2, sequence parallel"
parity l1 lp2 "llama3, pp 2"
parity l1 lc2 "llama3, cp 2"
train d1 1
checks=$((checks + 1))
python3 - "$workdir/d1.jsonl" "$workdir/l1.jsonl" <<'PY' || fail "llama3 trains as default RoPE"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
worst = max(abs(x - y) / x for x, y in zip(a, b))
assert worst > 1e-4, worst
print(f"llama3 against default RoPE: losses differ by up to {worst:.2e}")
PY

train n1 1 $dynamic
train nc2 2 $dynamic distributed.cp_size=2
parity n1 nc2 "dynamic NTK, cp 2, plain rows"
app="$bindir/meshtrain-cp"
packed="packed_sequence.packed_sequence_size=32 step_scheduler.local_batch_size=1"
train np1 1 $dynamic $packed
train npc2 2 $dynamic $packed distributed.cp_size=2
parity np1 npc2 "dynamic NTK, cp 2, packed rows"
app=

train y1 1 $yarn
train yt2 2 $yarn distributed.tp_size=2
parity y1 yt2 "yarn, tp 2"
finish
