#!/bin/sh
# moe_mesh.sh: MoE training with tensor, sequence, pipeline and context
# parallelism (alone and with expert parallelism) computes the
# single-rank run.
#
# A 4-layer MoE (layer 1 dense, 4 experts top 2, one shared expert, aux
# coefficient 0.01, aux-loss-free bias balancing) trains 20 steps of
# one-sequence micro-batches on 1 rank.  The load-balancing loss is a
# product of sums over every MoE layer and every token of a micro-batch,
# so the meshes that spread a micro-batch must combine its routing totals
# exactly: over TP ranks (each routes its own half of the tokens), over CP
# ranks (each holds half of every row) and along the pipeline (each stage
# holds some of the layers; the totals ride with the activations and come
# back with the gradients).  Every run must reproduce the 1-rank losses,
# gradient norms and aux losses (step 1 to 1e-6 relative, every step to
# 1e-5), and the expert load per step exactly:
#  - tp 2; tp 2 with sequence parallelism and activation checkpointing;
#  - cp 2; ep 2 over the cp ranks;
#  - pp 2 under 1f1b, interleaved_1f1b (2 stages per rank), zero_bubble
#    (split backward) and v_schedule (local hand-overs), each rank's
#    micro-step of 4 sequences cut into 4 microbatches of 1; gpipe with
#    one microbatch per micro-step and a validation loss through the
#    pipeline;
#  - ep 2 x tp 2 (experts sharded over ep_shard x tp), ep 2 x pp 2,
#    ep 2 x pp 2 x cp 2, and pp 2 x dp 2 x tp 2 with ep 2, sequence
#    parallelism and activation checkpointing that keeps the router;
#  - final parameters within 5e-5 per tensor (norm-wise);
#  - checkpoints under global layer names: an ep 2 x pp 2 checkpoint
#    resumes on 1 rank, a 1-rank one under pp 2 x tp 2 x ep 2.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
app="$bindir/meshtrain-moe"
cfg="$small_cfg"
model="model.num_hidden_layers=4 model.hidden_size=32 model.intermediate_size=64
 dataset.seq_length=32 optimizer.lr=1e-3 model.num_experts=4 model.num_experts_per_tok=2
 model.moe_intermediate_size=32 model.norm_topk_prob=true model.router_aux_loss_coef=0.01
 model.num_shared_experts=1 model.mlp_only_layers=1 model.moe_router_bias_update_rate=0.001"
val="dataset.validation_path=$data step_scheduler.val_every_steps=20"
common="$parity_common $model"
pipe() { # pipe SCHEDULE: pp 2, micro-steps of 4 sequences as 4 microbatches
    echo "distributed.pp_size=2 distributed.pipeline.pp_schedule=$1
 step_scheduler.local_batch_size=4"
}
# same NAME LABEL: losses, gradient norms, aux losses and expert loads of
# NAME against the 1-rank run r1
same() {
    compare_losses "$workdir/r1.jsonl" "$workdir/$1.jsonl" "$2"
    checks=$((checks + 1))
    python3 - "$workdir/r1.jsonl" "$workdir/$1.jsonl" <<'PY' || fail "$2: aux loss or expert load differ"
import json, sys
a, b = ({j["step"]: j for j in map(json.loads, open(f))} for f in sys.argv[1:])
assert sorted(a) == sorted(b)
for s in a:
    x, y = a[s], b[s]
    assert abs(x["aux_loss"] - y["aux_loss"]) <= 1e-5 * x["aux_loss"], (s, x["aux_loss"], y["aux_loss"])
    for k in ("expert_load_min", "expert_load_max"):
        assert x[k] == y[k], (s, k, x[k], y[k])
print(f"aux losses and expert loads agree; worst loss difference "
      f"{max(abs(a[s]['loss'] - b[s]['loss']) / a[s]['loss'] for s in a):.2e}")
PY
}

train r1 1 $val
checks=$((checks + 1))
python3 - "$workdir/r1.jsonl" <<'PY' || fail "1 rank: loss does not fall or aux loss missing"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, (rows[0]["loss"], rows[-1]["loss"])
assert all(1.0 <= r["aux_loss"] < 4.0 for r in rows), rows[0]
PY

common="$common checkpoint.enabled=false"
train t2 2 distributed.tp_size=2
same t2 "tp 2"
train sp 2 distributed.tp_size=2 distributed.sequence_parallel=true \
    distributed.activation_checkpointing=true
same sp "tp 2, sequence parallel, activation checkpointing"
train c2 2 distributed.cp_size=2
same c2 "cp 2"
train e2c2 2 distributed.cp_size=2 distributed.ep_size=2
same e2c2 "ep 2 over cp 2"
for s in 1f1b interleaved_1f1b zero_bubble v_schedule; do
    train "p2-$s" 2 $(pipe $s)
    same "p2-$s" "pp 2, $s"
done
# micro-steps of one sequence, as the 1-rank run's, so that the validation
# set (64 batches of local_batch_size sequences) is the same
train pv 2 distributed.pp_size=2 distributed.pipeline.pp_schedule=gpipe $val
same pv "pp 2, gpipe, one microbatch per micro-step"
val_close r1 pv "validation loss through the pipeline"
train e2t2 4 distributed.tp_size=2 distributed.ep_size=2
same e2t2 "ep 2 x tp 2 (experts sharded over ep_shard x tp)"
train e2pc 4 $(pipe 1f1b) distributed.cp_size=2 distributed.ep_size=2
same e2pc "ep 2 x pp 2 x cp 2"

# with checkpoints: final parameters, and resumes across meshes
common="$parity_common $model"
train e2p2 4 $(pipe interleaved_1f1b) distributed.ep_size=2
same e2p2 "ep 2 x pp 2 (dp 2)"
parity r1 e2p2 "ep 2 x pp 2"
train big 8 $(pipe 1f1b) distributed.tp_size=2 distributed.ep_size=2 \
    distributed.sequence_parallel=true distributed.activation_checkpointing=true \
    distributed.moe.ignore_router_for_ac=true step_scheduler.local_batch_size=2
same big "pp 2 x dp 2 x tp 2, ep 2, sequence parallel, activation checkpointing"
parity r1 big "pp 2 x dp 2 x tp 2 x ep 2"
checks=$((checks + 1))
h5ls -r "$(final e2p2)/model" | grep -q "layers.3.mlp.experts.3.down_proj.weight.*{32, 32}" &&
    h5ls -r "$(final e2p2)/model" | grep -q "layers.3.mlp.gate.e_score_correction_bias.*{4}" ||
    fail "pipeline checkpoint lacks layer 3's experts or bias under their global names"
train rp 1 checkpoint.resume="$workdir/e2p2/step_00000010"
compare_losses "$workdir/r1.jsonl" "$workdir/rp.jsonl" "ep 2 x pp 2 -> 1 rank, steps 11-20" 11
train rb 8 $(pipe 1f1b) distributed.tp_size=2 distributed.ep_size=2 \
    step_scheduler.local_batch_size=2 checkpoint.resume="$workdir/r1/step_00000010"
compare_losses "$workdir/r1.jsonl" "$workdir/rb.jsonl" "1 rank -> pp 2 x tp 2 x ep 2, steps 11-20" 11
finish
