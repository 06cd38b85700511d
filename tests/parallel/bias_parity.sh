#!/bin/sh
# bias_parity.sh: a model whose heads are not hidden / heads wide (hidden
# 48, 4 heads of head_dim 16: q and the attention output 64 wide) with
# every linear's bias (Llama's attention_bias and mlp_bias), and a
# Qwen2-style one (q/k/v biases alone), train on a mesh as on one rank:
# tp 2 with and without sequence parallelism (column-parallel biases split
# with their rows, o_proj's and down_proj's whole and added once after
# the TP sum), pp 2 under zero_bubble (the biases' gradients in the
# weight-gradient pass W), cp 2 and fsdp2 dp 2.  The biases start at 0
# and are nonzero from step 1 on, so steps 2-20 run them forward.  20
# steps: step 1 within 1e-6, every step within 1e-5 (compare_losses),
# final parameters (the biases among them) within 2e-4 per tensor,
# norm-wise: k_proj's bias has a gradient near zero (softmax ignores a
# shift of every key by the same vector; only RoPE's rotation by position
# leaves it a gradient), and AdamW turns the different rounding of the
# parallel sums into updates of the learning rate's size there (measured
# worst 4.6e-5, in k_proj.bias; every other tensor within 2e-6 under
# cp 2).  Checkpoints hold the biases whole, 1-D, under their
# Hugging Face names; a 1-rank run resumed at step 10 is the uninterrupted
# run bit for bit, the tp 2 checkpoint resumes on 1 rank and the 1-rank
# one under tp 2.  The measured arenas agree with meshtrain-plan's
# estimate within 10%.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
cfg="$small_cfg"
model="model.hidden_size=48 model.head_dim=16 model.intermediate_size=96
 model.attention_bias=true model.mlp_bias=true"
common="$parity_common $model step_scheduler.local_batch_size=2"
tp2="distributed.tp_size=2"
sp="distributed.sequence_parallel=true"

train r1 1
train s2 2 $tp2 $sp
train t2 2 $tp2
train p2 2 distributed.pp_size=2 distributed.pipeline.pp_schedule=zero_bubble
train c2 2 distributed.cp_size=2
train f2 2
# parity REF NAME LABEL with the final parameters within 2e-4 (above)
bparity() {
    compare_losses "$workdir/$1.jsonl" "$workdir/$2.jsonl" "$3"
    params_close "$(final "$1")" "$(final "$2")" "$3: final parameters" 2e-4
}
bparity r1 s2 "head_dim 16, biases: tp 2, sequence parallel"
bparity r1 t2 "head_dim 16, biases: tp 2"
bparity r1 p2 "head_dim 16, biases: pp 2, zero_bubble"
bparity r1 c2 "head_dim 16, biases: cp 2"
bparity r1 f2 "head_dim 16, biases: fsdp2 dp 2"

# the memory line: each measured arena within 10% of the plan
checks=$((checks + 1))
python3 -c "
import re, sys
line = [l for l in open(sys.argv[1]) if l.startswith('memory per rank')][0]
pairs = re.findall(r'([a-z ]+) ([0-9.]+) / ([0-9.]+)', line)
assert len(pairs) == 4, line
for name, got, est in pairs:
    got, est = float(got), float(est)
    assert abs(got - est) <= 0.10 * got, (name, got, est)
" "$workdir/r1.log" || fail "memory estimate off by more than 10%: $(grep 'memory per rank' "$workdir/r1.log")"

# the checkpoint's biases: whole, 1-D, named as Hugging Face names them
ls=$(h5ls -r "$(final s2)/model")
for t in "self_attn.q_proj.bias Dataset {64}" "self_attn.k_proj.bias Dataset {32}" \
    "self_attn.o_proj.bias Dataset {48}" "mlp.gate_proj.bias Dataset {96}" \
    "mlp.down_proj.bias Dataset {48}" "self_attn.q_proj.weight Dataset {64, 48}" \
    "self_attn.o_proj.weight Dataset {48, 64}"; do
    expect_in "$ls" "/model.layers.1.$t" "tp 2 checkpoint: $t"
done
# ... and nonzero after 20 steps
checks=$((checks + 1))
h5dump -d "/model/model.layers.0.mlp.down_proj.bias" "$(final r1)" |
    grep -q '[1-9]' || fail "down_proj.bias still zero after 20 steps"

# resume: on 1 rank bit for bit, and the tp 2 checkpoint on 1 rank
train rr 1 checkpoint.resume="$workdir/r1/step_00000010"
compare_losses "$workdir/r1.jsonl" "$workdir/rr.jsonl" "biases: resumed at step 10, bit for bit" 11 0
checks=$((checks + 1))
h5diff "$(final r1)" "$(final rr)" /model /model >/dev/null ||
    fail "biases: the resumed run's final parameters differ from the uninterrupted run's"
train rt 1 checkpoint.resume="$workdir/s2/step_00000010"
compare_losses "$workdir/r1.jsonl" "$workdir/rt.jsonl" "biases: tp 2 checkpoint on 1 rank, steps 11-20" 11
train rs 2 $tp2 $sp checkpoint.resume="$workdir/r1/step_00000010"
compare_losses "$workdir/r1.jsonl" "$workdir/rs.jsonl" "biases: 1-rank checkpoint on tp 2, steps 11-20" 11

# Qwen2: q, k, v biases, o_proj and the MLP without (the small model:
# hidden 64, head_dim 16)
common="$parity_common step_scheduler.local_batch_size=2"
qwen="model.architecture=Qwen2ForCausalLM"
train q1 1 $qwen
train qs2 2 $qwen $tp2 $sp
train qp2 2 $qwen distributed.pp_size=2 distributed.pipeline.pp_schedule=zero_bubble
bparity q1 qs2 "Qwen2 biases: tp 2, sequence parallel"
bparity q1 qp2 "Qwen2 biases: pp 2, zero_bubble"
ls=$(h5ls -r "$(final q1)/model")
expect_in "$ls" "/model.layers.0.self_attn.v_proj.bias Dataset {32}" "Qwen2: v_proj.bias"
checks=$((checks + 1))
printf '%s\n' "$ls" | grep -E 'o_proj\.bias|mlp\.[a-z_]*\.bias' &&
    fail "Qwen2: o_proj or MLP biases in its checkpoint"
finish
