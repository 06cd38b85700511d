#!/bin/sh
# mixed_precision.sh: distributed.mp_policy.param_dtype bfloat16 on the CPU
# (bf16 values in float32 storage, fp32 master weights and gradients;
# doc/mixed-precision.md).
#  - bf16 really rounds: its step-1 loss differs from the fp32 run's, and
#    its 12 losses stay within 2e-3 of them;
#  - ddp 2, megatron_fsdp zero 1 on 4, fsdp2 on 2 and pp 2 compute the
#    1-rank bf16 run: the step-1 loss to 1e-6 and grad norm to 1e-5, every
#    step to 2e-4 (a one-ulp fp32 difference in a sum can move an element
#    one bf16 step, 2^-8, so later steps drift further apart than in fp32);
#  - pp 2 sends its activations and gradients as bf16: half the float32
#    run's bytes per micro-step (the log's "pipeline messages" line);
#  - tp 2 with sequence parallelism rounds its partial sums (bf16 on the
#    wire): step-1 loss to 1e-4, every step to 2e-3 (grad norms 10x);
#  - MoE (2 layers of 4 experts and a shared one): bf16 against fp32, and
#    ep 2 under fsdp2 (sharded experts) and ddp 2 (replicated experts)
#    against 1 rank, as the dense meshes;
#  - a bf16 run resumed from its checkpoint continues bit for bit, and the
#    checkpoint holds the fp32 master weights, not bf16 values;
#  - bf16 storage (MESHTRAIN_BF16_STORAGE=1) gives the same bits, the same
#    checkpoints and a bit-for-bit resume, on 1 rank, ddp 2, fsdp2 2 and
#    megatron_fsdp zero 1 on 4, tp 2 + SP, pp 2 (the wire's bf16 bits
#    sent as they are, the same bytes), cp 2 and fsdp2 accumulating over
#    micro-steps, and the MoE on 1 rank and ep 2, with half the parameter
#    bytes (the gathered units' under fsdp2) and about half the
#    activations', as meshtrain-plan estimates them;
#  - activation checkpointing keeps its layer inputs as bf16 bits (but a
#    stage's first): the run is bit for bit the one without it, and on 4
#    layers its measured activations are 3 inputs of [128, 64] x 2 bytes
#    below the fp32 run's with checkpointing.
# Every rank runs one thread, so the 1-rank reference sums like each rank.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# float32 storage but where bf16 storage is asked for (it is the default
# for bf16 on device cuda, as under make check MESHTRAIN_TEST_GPUS=N)
MESHTRAIN_BF16_STORAGE=0
export OMP_NUM_THREADS OPENBLAS_NUM_THREADS MESHTRAIN_BF16_STORAGE
common="dataset.path=$data step_scheduler.max_steps=12 step_scheduler.ckpt_every_steps=6
 step_scheduler.local_batch_size=2 checkpoint.keep_last_n=0"
bf=distributed.mp_policy.param_dtype=bfloat16

# close REF OTHER LABEL STEP1_TOL ALL_TOL: step 1's loss within STEP1_TOL
# (grad norm 10x), every step's within ALL_TOL (grad norm 10x).
close() { compare_losses "$workdir/$1.jsonl" "$workdir/$2.jsonl" "$3" 0 "$5" "$4"; }

train f32 1 distributed.strategy=ddp
train r1 1 distributed.strategy=ddp $bf
expect_in "$out" "mixed precision: bf16" "the log names the precision"
checks=$((checks + 1))
python3 - "$workdir/f32.jsonl" "$workdir/r1.jsonl" <<'PY' || fail "bf16 vs fp32"
import json, sys
a, b = ([j["loss"] for j in map(json.loads, open(p))] for p in sys.argv[1:])
d = [abs(x - y) / x for x, y in zip(a, b)]
assert d[0] > 1e-6, f"step 1 loss equal to fp32's ({d[0]:.2e}): nothing was rounded"
assert max(d) < 2e-3, f"bf16 strays from fp32: {max(d):.2e}"
print(f"bf16 vs fp32: step 1 {d[0]:.2e}, worst {max(d):.2e}")
PY

train ddp2 2 distributed.strategy=ddp $bf
# activation checkpointing: the inputs kept as bf16 bits change no bit,
# and take half the bytes
train r1ac 1 distributed.strategy=ddp $bf distributed.activation_checkpointing=true
compare_losses "$workdir/r1.jsonl" "$workdir/r1ac.jsonl" "bf16 with activation checkpointing" 0 0
train f32ac4 1 distributed.activation_checkpointing=true model.num_hidden_layers=4
train bfac4 1 $bf distributed.activation_checkpointing=true model.num_hidden_layers=4
checks=$((checks + 1))
python3 - "$workdir/f32ac4.log" "$workdir/bfac4.log" <<'PY' || fail "bf16 layer inputs' memory"
import re, sys
f, b = (float(re.search(r"activations ([0-9.]+) /", open(p).read()).group(1)) for p in sys.argv[1:])
want = 3 * 128 * 64 * 2 / 2**20  # three layers' inputs, 2 of their 4 bytes
assert abs((f - b) - want) < 2e-3, f"activations: fp32 {f} MiB, bf16 {b} MiB, want {want:.4f} less"
print(f"activation checkpointing: {f} MiB fp32, {b} MiB with bf16 layer inputs")
PY

close r1 ddp2 "ddp 2" 1e-6 2e-4
train z1 4 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=1 $bf
close r1 z1 "megatron_fsdp zero 1, 4 ranks" 1e-6 2e-4
train f2 2 distributed.strategy=fsdp2 $bf
close r1 f2 "fsdp2 2" 1e-6 2e-4
train pp2 2 distributed.pp_size=2 distributed.pipeline.pp_microbatch_size=1 $bf
close r1 pp2 "pp 2" 1e-6 2e-4
train pp2f 2 distributed.pp_size=2 distributed.pipeline.pp_microbatch_size=1
mb() { sed -n 's/^pipeline messages: \([0-9.]*\) MB.*(\(.*\))$/\1 \2/p' "$workdir/$1.log"; }
checks=$((checks + 1))
python3 - $(mb pp2f) $(mb pp2) <<'PY' || fail "pp 2 bf16 messages"
import sys
f, fd, b, bd = float(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
assert (fd, bd) == ("float32", "bf16"), (fd, bd)
assert f > 0 and b == f / 2, f"pipeline MB per micro-step: float32 {f}, bf16 {b}"
print(f"pipeline messages: {f} MB float32, {b} MB bf16 per rank per micro-step")
PY
train tp2 2 distributed.tp_size=2 distributed.sequence_parallel=true $bf
close r1 tp2 "tp 2 + SP" 1e-4 2e-3

# MoE (meshtrain-moe): the experts keep fp32 masters too.
moe="model.num_hidden_layers=2 model.num_experts=4 model.num_experts_per_tok=2
 model.moe_intermediate_size=32 model.router_aux_loss_coef=0.01 model.num_shared_experts=1"
app="$bindir/meshtrain-moe"
train m32 1 $moe
train m1 1 $moe $bf
checks=$((checks + 1))
python3 - "$workdir/m32.jsonl" "$workdir/m1.jsonl" <<'PY' || fail "MoE bf16 vs fp32"
import json, sys
a, b = ([j["loss"] for j in map(json.loads, open(p))] for p in sys.argv[1:])
d = [abs(x - y) / x for x, y in zip(a, b)]
assert d[0] > 1e-6 and max(d) < 2e-3, d
print(f"MoE bf16 vs fp32: step 1 {d[0]:.2e}, worst {max(d):.2e}")
PY
train mep 2 $moe $bf distributed.ep_size=2
close m1 mep "MoE ep 2 (fsdp2)" 1e-6 2e-4
train mddp 2 $moe $bf distributed.strategy=ddp
close m1 mddp "MoE ddp 2 (replicated experts)" 1e-6 2e-4
app=

# bf16 storage (MESHTRAIN_BF16_STORAGE=1, doc/mixed-precision.md "bf16
# storage: the plan"): bf16 bits in the activation and parameter arenas
# compute the bits of bf16 values in float32 storage, on 1 rank (with
# activation checkpointing too), ddp 2, fsdp2 2 (bf16 bits gathered into
# bf16 units) and megatron_fsdp zero 1 on 4 (the arena's own rows
# gathered as they are), tp 2 + SP, pp 2, cp 2 and the MoE (1 rank, ep 2),
# with the same checkpoints and half the parameter bytes; a resume
# continues bit for bit; float32 compute is refused.
MESHTRAIN_BF16_STORAGE=1
train s1 1 distributed.strategy=ddp $bf
expect_in "$out" "bf16 storage; MESHTRAIN_BF16_STORAGE=0 for float32" "the log names bf16 storage"
compare_losses "$workdir/r1.jsonl" "$workdir/s1.jsonl" "bf16 storage, 1 rank" 0 0
# same_ckpt REF RUN LABEL: RUN's step-12 /model and /optim are REF's (the
# /meta config names each run's directory)
same_ckpt() {
    for g in /model /optim; do
        checks=$((checks + 1))
        h5diff "$workdir/$1/step_00000012/model.h5" "$workdir/$2/step_00000012/model.h5" $g $g \
            >/dev/null || fail "$3: $g at step 12 differs from float32 storage's"
    done
}
same_ckpt r1 s1 "bf16 storage"
checks=$((checks + 1))
python3 - "$workdir/r1.log" "$workdir/s1.log" <<'PY' || fail "bf16 storage: memory"
import re, sys
def mem(p):
    m = re.search(r"parameters ([0-9.]+) / .*activations ([0-9.]+) /", open(p).read())
    return float(m.group(1)), float(m.group(2))
(p32, a32), (p16, a16) = mem(sys.argv[1]), mem(sys.argv[2])
assert abs(p16 - p32 / 2) < 2e-3, f"parameters: {p16} MiB, want half of {p32}"
assert a16 < 0.6 * a32, f"activations: {a16} MiB against {a32}"
print(f"bf16 storage: parameters {p32} -> {p16} MiB, activations {a32} -> {a16} MiB")
PY
train sac 1 distributed.strategy=ddp $bf distributed.activation_checkpointing=true
compare_losses "$workdir/r1.jsonl" "$workdir/sac.jsonl" "bf16 storage, checkpointing" 0 0
train sddp2 2 distributed.strategy=ddp $bf
compare_losses "$workdir/ddp2.jsonl" "$workdir/sddp2.jsonl" "bf16 storage, ddp 2" 0 0
train sf2 2 distributed.strategy=fsdp2 $bf
compare_losses "$workdir/f2.jsonl" "$workdir/sf2.jsonl" "bf16 storage, fsdp2 2" 0 0
train sz1 4 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=1 $bf
compare_losses "$workdir/z1.jsonl" "$workdir/sz1.jsonl" "bf16 storage, megatron_fsdp zero 1" 0 0
train stp2 2 distributed.tp_size=2 distributed.sequence_parallel=true $bf
compare_losses "$workdir/tp2.jsonl" "$workdir/stp2.jsonl" "bf16 storage, tp 2 + SP" 0 0
train spp2 2 distributed.pp_size=2 distributed.pipeline.pp_microbatch_size=1 $bf
compare_losses "$workdir/pp2.jsonl" "$workdir/spp2.jsonl" "bf16 storage, pp 2" 0 0
checks=$((checks + 1))
[ "$(mb spp2)" = "$(mb pp2)" ] || fail "bf16 storage, pp 2: messages $(mb spp2), want $(mb pp2)"
# cp 2: the ring on bf16 bits with float32 block sums; fsdp2 accumulating
# over micro-steps in its gradient shard (add_f32, not the bf16 add)
for c in "cp2|distributed.cp_size=2" \
    "f2acc|step_scheduler.global_batch_size=8 distributed.defer_fsdp_grad_sync=false"; do
    cname=${c%%|*} cargs=${c#*|}
    MESHTRAIN_BF16_STORAGE=0
    # shellcheck disable=SC2086
    train "$cname" 2 $cargs $bf
    MESHTRAIN_BF16_STORAGE=1
    # shellcheck disable=SC2086
    train "s$cname" 2 $cargs $bf
    compare_losses "$workdir/$cname.jsonl" "$workdir/s$cname.jsonl" "bf16 storage, $cname" 0 0
done
same_ckpt f2 sf2 "bf16 storage, fsdp2 2"
checks=$((checks + 1))
python3 - "$workdir/f2.log" "$workdir/sf2.log" <<'PY' || fail "bf16 storage, fsdp2: memory"
import re, sys
def mem(p):
    m = re.search(r"parameters ([0-9.]+) / ([0-9.]+), .*activations ([0-9.]+) / ([0-9.]+)",
                  open(p).read())
    return [float(g) for g in m.groups()]
(p32, _, a32, _), (p16, e16, a16, ea16) = mem(sys.argv[1]), mem(sys.argv[2])
# the float32 shard stays; the gathered units (2 slots of the largest)
# halve, and meshtrain-plan says so
assert p16 < p32 and abs(p16 - e16) < 2e-3, f"parameters: {p16} MiB (plan {e16}), fp32 {p32}"
assert a16 < 0.6 * a32 and abs(a16 - ea16) < 0.05 * a16, f"activations {a16} (plan {ea16})"
print(f"bf16 storage, fsdp2 2: parameters {p32} -> {p16} MiB, activations {a32} -> {a16} MiB")
PY
rm -rf "$workdir/s1/step_00000012"; echo step_00000006 > "$workdir/s1/latest"
cp "$workdir/s1.jsonl" "$workdir/s1r.jsonl"
train s1 1 distributed.strategy=ddp $bf logging.metrics_file="$workdir/s1r.jsonl"
expect_in "$out" "resumed from $workdir/s1/step_00000006 at step 6" "bf16 storage resume"
compare_losses "$workdir/r1.jsonl" "$workdir/s1r.jsonl" "bf16 storage resume, steps 7-12" 7 0
# MoE (2 layers of 4 experts and a shared one): 1 rank and ep 2 under
# fsdp2, the same bits and checkpoints
app="$bindir/meshtrain-moe"
train sm1 1 $moe $bf
compare_losses "$workdir/m1.jsonl" "$workdir/sm1.jsonl" "bf16 storage, MoE" 0 0
train smep 2 $moe $bf distributed.ep_size=2
compare_losses "$workdir/mep.jsonl" "$workdir/smep.jsonl" "bf16 storage, MoE ep 2" 0 0
same_ckpt mep smep "bf16 storage, MoE ep 2"
app=
# refused VAR=VALUE MESSAGE LABEL ARGS...: the dense app on one rank, with
# VAR set for it alone ("": none), stops before training, saying MESSAGE
refused() {
    setting=$1 msg=$2 label=$3
    shift 3
    # shellcheck disable=SC2086
    expect_rc 1 np 1 env $setting "$bindir/meshtrain-dense" --config "$small_cfg" $common "$@" \
        distributed.strategy=ddp checkpoint.checkpoint_dir="$workdir/srefused"
    expect_in "$out$err" "$msg" "$label"
}
refused "" "it needs mp_policy.param_dtype bfloat16" "bf16 storage refuses float32"
# shellcheck disable=SC2086
refused MESHTRAIN_BF16_PASSES=1 "MESHTRAIN_BF16_PASSES=1 rounds in passes" \
    "bf16 storage refuses MESHTRAIN_BF16_PASSES" $bf
MESHTRAIN_BF16_STORAGE=0
# the CUDA attention's kernel choice is checked before training, on any device
# shellcheck disable=SC2086
refused MESHTRAIN_ATTENTION_KERNEL=flash3 \
    "MESHTRAIN_ATTENTION_KERNEL=flash3: mma (the default) or wmma" \
    "an unknown MESHTRAIN_ATTENTION_KERNEL is refused" $bf

# resume: the step-6 checkpoint of r1 continues exactly like r1
rm -rf "$workdir/r1/step_00000012"; echo step_00000006 > "$workdir/r1/latest"
cp "$workdir/r1.jsonl" "$workdir/r1r.jsonl"
train r1 1 distributed.strategy=ddp $bf logging.metrics_file="$workdir/r1r.jsonl"
expect_in "$out" "resumed from $workdir/r1/step_00000006 at step 6" "bf16 resume"
compare_losses "$workdir/r1.jsonl" "$workdir/r1r.jsonl" "bf16 resume, steps 7-12" 7 0

# the checkpoints hold fp32 master weights, not bf16 values
masters() { # masters RUN TENSOR
    checks=$((checks + 1))
    h5dump -b LE -d "/model/$2" -o "$workdir/w.bin" "$workdir/$1/step_00000012/model.h5" \
        >/dev/null 2>&1 || { fail "h5dump of $2 in $1"; return; }
    python3 - "$workdir/w.bin" "$1 $2" <<'PY' || fail "$1: $2 is not fp32 master weights"
import array, sys
v = array.array("I"); v.frombytes(open(sys.argv[1], "rb").read())
frac = sum(1 for u in v if u & 0xffff) / len(v)
assert frac > 0.9, f"only {frac:.2f} of the saved weights have fp32 bits below bf16's"
print(f"{sys.argv[2]}: {frac:.3f} of the saved weights are not bf16 values")
PY
}
masters r1 model.layers.0.mlp.down_proj.weight
masters z1 model.layers.1.self_attn.q_proj.weight
masters f2 model.layers.1.self_attn.q_proj.weight
for run in m1 mep mddp; do masters $run model.layers.1.mlp.experts.1.up_proj.weight; done
finish
