#!/bin/sh
# moe_arch_parity.sh: the Mixtral and OLMoE architectures (doc/hf-models.md)
# train the same on every mesh that applies them as on one rank, and their
# checkpoints hold their Hugging Face names.
#
# Mixtral: every layer MoE, softmax top-2 renormalised, no q/k norm, the
# experts under block_sparse_moe.experts.E.w1/w3/w2: against 1 rank on ep 2,
# tp 2 with sequence parallelism, pp 2 and cp 2.  OLMoE: q/k norm over
# the whole projection (q_norm [nh * head_dim]), top-2 without
# renormalisation: against 1 rank on ep 2, pp 2, cp 2, tp 2 (the norm's
# row sums added over the TP group), tp 2 with sequence parallelism and
# activation checkpointing, tp 2 x ep 2, tp 2 on bf16 storage and on the
# guarded table; its checkpoints resume across 1 rank and tp 2.  20 steps as the other parity tests:
# step 1 within 1e-6, every step within 1e-5, final parameters within 5e-5.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
app="$bindir/meshtrain-moe"
cfg="$small_cfg"
moe="model.hidden_size=32 model.intermediate_size=32 dataset.seq_length=32 optimizer.lr=1e-3
 model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32
 model.router_aux_loss_coef=0.01"
# pp 2: micro-steps of 2 sequences as 2 microbatches of one, as the
# 1-rank run's micro-batches (the aux loss is per micro-batch)
pp2="distributed.pp_size=2 distributed.pipeline.pp_schedule=1f1b step_scheduler.local_batch_size=2"

# ---- Mixtral
common="$parity_common $moe model.architecture=MixtralForCausalLM model.norm_topk_prob=true"
train x1 1
train xe2 2 distributed.ep_size=2
train xt2 2 distributed.tp_size=2 distributed.sequence_parallel=true
train xc2 2 distributed.cp_size=2
parity x1 xe2 "Mixtral, ep 2"
parity x1 xt2 "Mixtral, tp 2 (sequence parallel)"
parity x1 xc2 "Mixtral, cp 2"
common="$common checkpoint.enabled=false"
train xp2 2 $pp2
compare_losses "$workdir/x1.jsonl" "$workdir/xp2.jsonl" "Mixtral, pp 2"
checks=$((checks + 1))
h5ls -r "$(final x1)/model" >"$workdir/x1.ls"
for t in "layers.1.block_sparse_moe.experts.3.w2.weight.*{32, 32}" \
         "layers.0.block_sparse_moe.gate.weight.*{4, 32}"; do
    grep -q "$t" "$workdir/x1.ls" || fail "Mixtral checkpoint lacks $t"
done
! grep -q "q_norm\|mlp.experts" "$workdir/x1.ls" || fail "Mixtral checkpoint has Qwen3-MoE tensors"

# ---- OLMoE
common="$parity_common $moe model.architecture=OlmoeForCausalLM model.qk_norm=true"
train o1 1
train oe2 2 distributed.ep_size=2
train oc2 2 distributed.cp_size=2
train ot2 2 distributed.tp_size=2
train ots2 2 distributed.tp_size=2 distributed.sequence_parallel=true \
    distributed.activation_checkpointing=true
train ote4 4 distributed.tp_size=2 distributed.ep_size=2
parity o1 oe2 "OLMoE, ep 2"
parity o1 oc2 "OLMoE, cp 2"
parity o1 ot2 "OLMoE, tp 2"
parity o1 ots2 "OLMoE, tp 2 (sequence parallel, activation checkpointing)"
parity o1 ote4 "OLMoE, tp 2 x ep 2"
# resume across meshes: the tp 2 checkpoint (q_norm split by heads) on
# 1 rank, the 1-rank checkpoint on tp 2, and 1 rank on itself bit for bit
train or1 1 checkpoint.resume="$workdir/ot2/step_00000010"
compare_losses "$workdir/o1.jsonl" "$workdir/or1.jsonl" "OLMoE: tp 2 checkpoint on 1 rank, steps 11-20" 11
train ort2 2 distributed.tp_size=2 checkpoint.resume="$workdir/o1/step_00000010"
compare_losses "$workdir/o1.jsonl" "$workdir/ort2.jsonl" "OLMoE: 1-rank checkpoint on tp 2, steps 11-20" 11
train orr 1 checkpoint.resume="$workdir/o1/step_00000010"
compare_losses "$workdir/o1.jsonl" "$workdir/orr.jsonl" "OLMoE: resumed at step 10, bit for bit" 11 0
common="$common checkpoint.enabled=false"
train op2 2 $pp2
compare_losses "$workdir/o1.jsonl" "$workdir/op2.jsonl" "OLMoE, pp 2"
checks=$((checks + 1))
h5ls -r "$(final o1)/model" | grep -q "layers.0.self_attn.q_norm.weight.*{32}" ||
    fail "OLMoE checkpoint lacks its whole-projection q_norm [4 heads x 8]"
# the norm over the whole projection is not Qwen3's per-head norm
common="$parity_common $moe model.qk_norm=true"
train q1 1
checks=$((checks + 1))
python3 - "$workdir/o1.jsonl" "$workdir/q1.jsonl" <<'PY' || fail "OLMoE's norm is the per-head one"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:])
assert abs(a[-1] - b[-1]) > 1e-4 * abs(b[-1]), (a[-1], b[-1])
print(f"step 20: OLMoE {a[-1]:.6f}, per-head q/k norm {b[-1]:.6f}")
PY
# bf16 storage (as on CUDA): the norm's kernels read and write bf16 bits;
# tp 2 against 1 rank, both on bf16 storage, and on the guarded table
# (every tensor the kernels touch is backend memory)
common="$parity_common $moe model.architecture=OlmoeForCausalLM model.qk_norm=true
 distributed.mp_policy.param_dtype=bfloat16 checkpoint.enabled=false"
MESHTRAIN_BF16_STORAGE=1
export MESHTRAIN_BF16_STORAGE
train ob1 1
train otb2 2 distributed.tp_size=2
unset MESHTRAIN_BF16_STORAGE
compare_losses "$workdir/ob1.jsonl" "$workdir/otb2.jsonl" "OLMoE, tp 2 on bf16 storage" 0 2e-3 2e-3
expect_in "$(cat "$workdir/otb2.log")" "bf16 storage" "OLMoE tp 2 ran on bf16 storage"
common="$parity_common $moe model.architecture=OlmoeForCausalLM model.qk_norm=true checkpoint.enabled=false"
train otg2 2 distributed.tp_size=2 distributed.device=cpu_guarded
compare_losses "$workdir/o1.jsonl" "$workdir/otg2.jsonl" "OLMoE, tp 2 on the guarded table"
finish
