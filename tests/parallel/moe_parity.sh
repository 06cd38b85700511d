#!/bin/sh
# moe_parity.sh: meshtrain-moe trains (the loss falls), and expert
# parallelism computes the single-rank run.
#
# A 2-layer MoE (4 experts, top 2, norm_topk_prob, aux coefficient 0.01)
# trains 20 steps of one-sequence micro-batches on 1 rank; then ep 2 on 2
# ranks (dp 2), ep 2 x ep_shard 2 on 4 ranks (experts FSDP-sharded over
# ep_shard: the optimizer state halves, as planned), the same with
# moe.reshard_after_forward, activation checkpointing and HSDP, ep 4 on 4
# ranks with activation checkpointing and moe.ignore_router_for_ac, and
# ep 1 on 2 ranks (experts FSDP-sharded over dp, as fsdp2 shards every
# parameter, and resharded after forward); and with a shared expert,
# capacity factor 0.75 (tokens dropped, the same ones on both meshes) and
# bias balancing at ep 2 against its own 1-rank run, resumed from ep 2 on
# 1 rank; ep 8 (8 experts, one per rank) against its own 1-rank run.
# Ties to the lowest expert index make the routing
# mesh-independent, so every run must reproduce the 1-rank losses and
# gradient norms (step 1 to 1e-6 relative, every step to 1e-5) and its
# final parameters (5e-5 per tensor, norm-wise: the expert GEMMs see the
# same rows grouped differently).  The step log and metrics carry the aux
# loss and the expert load.  Checkpoints hold every expert under its
# Hugging Face name: ep 2 and sharded ep 2 x ep_shard 2 checkpoints resume
# on 1 rank and a 1-rank one under ep 2 x ep_shard 2, matching the
# uninterrupted run; a Qwen3-MoE checkpoint exports to Hugging Face and
# imports back identically.  What this release refuses is refused with a
# message.  (MoE with tensor, sequence, pipeline and context parallelism:
# moe_mesh.sh.)
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
app="$bindir/meshtrain-moe"
cfg="$small_cfg"
common="$parity_common model.num_experts=4 model.num_experts_per_tok=2
 model.moe_intermediate_size=32 model.norm_topk_prob=true model.router_aux_loss_coef=0.01"
parity1() { # parity1 NAME LABEL: against the 1-rank run r1
    compare_losses "$workdir/r1.jsonl" "$workdir/$1.jsonl" "$2"
    params_close "$(final r1)" "$(final "$1")" "$2: final parameters" 5e-5
    python3 - "$workdir/r1.jsonl" "$workdir/$1.jsonl" <<'PY' # the figure for the record
import json, sys
a, b = ({json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f)} for f in sys.argv[1:])
print(f"worst relative loss difference {max(abs(a[s] - b[s]) / abs(a[s]) for s in a):.2e}")
PY
}

train r1 1
expect_in "$out" "| aux 2.0" "the step line shows the aux loss"
expect_in "$out" "expert load " "the step line shows the expert load"
checks=$((checks + 1))
python3 - "$workdir/r1.jsonl" <<'PY' || fail "1 rank: loss does not fall or MoE metrics missing"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first, last = rows[0], rows[-1]
assert last["loss"] < first["loss"] - 1.0, (first["loss"], last["loss"])
for r in rows:
    assert 1.0 <= r["aux_loss"] < 4.0, r          # K = 2 for a uniform router
    assert r["expert_load_min"] <= r["expert_load_max"], r
    # 2 MoE layers x 512 tokens x top 2 over 4 experts: mean 512
    assert abs(r["expert_load_imbalance"] - r["expert_load_max"] / 512) < 1e-6, r
print(f"loss {first['loss']:.4f} -> {last['loss']:.4f}, aux {last['aux_loss']:.4f}")
PY
checks=$((checks + 1))
h5ls -r "$(final r1)/model" | grep -q "layers.1.mlp.experts.3.down_proj.weight.*{64, 32}" ||
    fail "checkpoint lacks expert 3 of layer 1 as [64, 32]"

train e2 2 distributed.ep_size=2
parity1 e2 "ep 2 (dp 2)"
checks=$((checks + 1))
python3 - "$workdir/e2.jsonl" <<'PY' || fail "ep 2: no all-to-all traffic recorded"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert all(r["a2a_bytes"] > 0 for r in rows), rows[0]
PY
train e2s2 4 distributed.ep_size=2
parity1 e2s2 "ep 2 x ep_shard 2 (experts sharded)"
# experts resharded after forward, under activation checkpointing, with
# the other parameters in HSDP (2 replicas of 2 shards)
train e2r 4 distributed.ep_size=2 distributed.moe.reshard_after_forward=true \
    distributed.activation_checkpointing=true distributed.dp_replicate_size=2
parity1 e2r "ep 2 x ep_shard 2, moe.reshard_after_forward, activation checkpointing, HSDP"
smaller_as_planned "$workdir/e2.log" "$workdir/e2s2.log" "optimizer state" 0.75 0.10 \
    "sharded experts"
train e4 4 distributed.ep_size=4 distributed.activation_checkpointing=true \
    distributed.moe.ignore_router_for_ac=true
parity1 e4 "ep 4, activation checkpointing without recomputing the router"
train m2 2 distributed.moe.reshard_after_forward=true
parity1 m2 "ep 1 on 2 ranks (experts FSDP-sharded over dp, resharded after forward)"
# shared experts (data-parallel like the router), a capacity factor that
# drops tokens (decided on each rank's micro-batch, so mesh-free) and
# aux-loss-free bias balancing (the bias is checkpointed)
sc="model.num_shared_experts=1 model.moe_capacity_factor=0.75 model.moe_router_bias_update_rate=0.01"
train s1 1 $sc
expect_in "$out" " dropped " "the step line counts dropped tokens"
train s2 2 $sc distributed.ep_size=2
compare_losses "$workdir/s1.jsonl" "$workdir/s2.jsonl" "shared experts, capacity 0.75, ep 2"
params_close "$(final s1)" "$(final s2)" "shared experts, capacity 0.75, ep 2: final parameters" 5e-5
checks=$((checks + 1))
h5ls -r "$(final s2)/model" | grep -q "layers.1.mlp.gate.e_score_correction_bias.*{4}" ||
    fail "checkpoint lacks layer 1's balancing bias"
train rs1 1 $sc checkpoint.resume="$workdir/s2/step_00000010"
compare_losses "$workdir/s1.jsonl" "$workdir/rs1.jsonl" "bias balancing: ep 2 -> 1 rank" 11
checks=$((checks + 1))
python3 - "$workdir/s1.jsonl" "$workdir/s2.jsonl" <<'PY' || fail "capacity factor: dropped counts differ or none dropped"
import json, sys
a, b = ([json.loads(l)["tokens_dropped"] for l in open(f)] for f in sys.argv[1:])
assert a == b and sum(a) > 0, (a, b)
print(f"dropped per step: {a[:5]}...")
PY
checks=$((checks + 1))
h5ls -r "$(final s2)/model" | grep -q "layers.0.mlp.shared_experts.down_proj.weight.*{64, 32}" ||
    fail "checkpoint lacks layer 0's shared expert"

# Checkpoints are mesh-independent: ep 2 -> 1 rank, 1 rank -> ep 2 x ep_shard 2
train re1 1 checkpoint.resume="$workdir/e2/step_00000010"
expect_in "$out" "resumed from $workdir/e2/step_00000010 at step 10" "ep 2 checkpoint on 1 rank"
compare_losses "$workdir/r1.jsonl" "$workdir/re1.jsonl" "ep 2 -> 1 rank, steps 11-20" 11
train res 1 checkpoint.resume="$workdir/e2s2/step_00000010"
compare_losses "$workdir/r1.jsonl" "$workdir/res.jsonl" "sharded ep 2 x ep_shard 2 -> 1 rank" 11
train re2 4 distributed.ep_size=2 checkpoint.resume="$workdir/r1/step_00000010"
compare_losses "$workdir/r1.jsonl" "$workdir/re2.jsonl" "1 rank -> ep 2 x ep_shard 2, steps 11-20" 11

# Hugging Face interchange: a Qwen3-MoE (qk_norm, layer 0 dense) trained
# at ep 2 exports on 2 ranks as Qwen3MoeForCausalLM with every expert under
# its transformers name, and imports back to the same tensors
train q 2 distributed.ep_size=2 model.qk_norm=true model.mlp_only_layers=0 \
    step_scheduler.max_steps=2
ckpt="$bindir/meshtrain-ckpt"
expect_rc 0 np 2 "$ckpt" export "$workdir/q" -o "$workdir/hfq"
expect_in "$out" "Qwen3MoeForCausalLM, 35 tensors" "MoE export summary"
checks=$((checks + 1))
python3 - "$workdir/hfq" <<'PY' || fail "MoE export: config.json or tensors wrong"
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
want = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [0], "intermediate_size": 160}
assert all(c[k] == v for k, v in want.items()), c
f = open(d + "/model.safetensors", "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
shapes = {k: v["shape"] for k, v in h.items() if k != "__metadata__"}
assert shapes["model.layers.1.mlp.gate.weight"] == [4, 64], shapes
assert shapes["model.layers.1.mlp.experts.3.down_proj.weight"] == [64, 32]
assert shapes["model.layers.0.mlp.down_proj.weight"] == [64, 160]
assert not any(k.startswith("model.layers.0.mlp.experts") for k in shapes)
print(f"{len(shapes)} tensors, config.json as transformers reads it")
PY
expect_rc 0 "$ckpt" import "$workdir/hfq" -o "$workdir/impq"
expect_in "$out" "meshtrain-moe --config" "MoE import names the MoE trainer"
checks=$((checks + 1))
h5diff "$workdir/q/step_00000002/model.h5" "$workdir/impq/step_00000000/model.h5" /model /model \
    >/dev/null || fail "MoE export and import: /model differs"
expect_rc 1 "$ckpt" export "$workdir/r1" -o "$workdir/hfr"
expect_in "$err" "not a Hugging Face Qwen3MoeForCausalLM (it has no qk_norm)" "export refuses MoE without qk_norm"

# ep 8: 8 experts, one per rank, against their own 1-rank run (losses)
common="$common model.num_experts=8 checkpoint.enabled=false"
train x1 1
train x8 8 distributed.ep_size=8
compare_losses "$workdir/x1.jsonl" "$workdir/x8.jsonl" "ep 8 (one expert per rank)"
common="$parity_common model.num_experts=4 model.num_experts_per_tok=2
 model.moe_intermediate_size=32 model.norm_topk_prob=true model.router_aux_loss_coef=0.01"

# Refused, with the reason
refuse() { # refuse NP NEEDLE OVERRIDES...
    n=$1 needle=$2; shift 2
    expect_rc 1 np "$n" "$app" --config "$cfg" $common checkpoint.enabled=false \
        step_scheduler.max_steps=1 "$@"
    expect_in "$out$err" "$needle" "refused: $*"
}
refuse 2 "ddp is data parallelism only" distributed.ep_size=2 distributed.strategy=ddp
refuse 2 "megatron_fsdp does not support expert parallelism" distributed.ep_size=2 \
    distributed.strategy=megatron_fsdp
refuse 4 "not divisible by ep_size 3" distributed.ep_size=3
refuse 2 "4 experts do not split evenly over ep_size 8" distributed.ep_size=8 \
    distributed.dp_size=8
refuse 2 "nothing to reshard" distributed.ep_size=2 distributed.moe.reshard_after_forward=true
refuse 2 "which is off" distributed.ep_size=2 distributed.moe.ignore_router_for_ac=true
refuse 2 "do not split over tp_size 2" distributed.tp_size=2 dataset.seq_length=33
refuse 1 "expected comma-separated layer indices in [0, 2)" model.mlp_only_layers=0,7
refuse 1 "must not be negative (0 is dropless)" model.moe_capacity_factor=-1
refuse 1 "must not be negative (0 is off)" model.moe_router_bias_update_rate=-0.1
finish
