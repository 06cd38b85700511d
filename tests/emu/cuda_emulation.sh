#!/bin/sh
# cuda_emulation.sh: the CUDA backend's own kernels, run on the host.
#
# tests/emu/cuda/build/bin holds the CUDA kernel tests and the apps built
# from the real .cu files against the host emulation of the CUDA kernels
# (tests/emu/cuda, doc/gpu.md "Host emulation of the CUDA kernels"):
# threads as fibers under random schedules, barriers and shuffles checked,
# WMMA, cuBLAS, cuBLASLt and CUB as checked host loops, device memory
# filled with NaN bytes when allocated (MT_EMU_POISON).  Here:
#  - tests/backend/cuda/test_cuda_kernels and tests/backend/cuda/test_cuda_bf16, exactly the
#    programs tests/gpu/run.sh runs on a GPU, must pass;
#  - one rank trains 3 steps with distributed.device cuda (every kernel of
#    the table, the tensor-core attention at head dim 64, cuBLAS through
#    the emulation) and must reproduce the CPU run: dense fp32 (1e-5),
#    dense bf16 at head dim 64 and a MoE in bf16 with activation
#    checkpointing (2e-3: bf16 values one rounding apart move by 2^-8);
#  - the same bf16 runs with MESHTRAIN_BF16_PASSES=1 (every rounding a
#    pass of the model's, none in the kernels' stores and loads) give
#    the same bits: dense at head dim 64 (tensor-core
#    attention) and 16 with qk_norm (the fp32 fallback), and the MoE; on
#    two ranks tp 2 + SP, cp 2, a MoE under tp 2 and one under ep 2;
#  - bf16 storage (the cuda_bf16_storage table, the default for bf16 on
#    cuda; the other runs set MESHTRAIN_BF16_STORAGE=0) gives the dense
#    head-dim-64 bf16 run's bits, with and without
#    activation checkpointing, the head-dim-16 qk_norm run's (the CUDA-core
#    attention on bf16 bits), and on two ranks its collectives of bf16
#    bits: fsdp2 and megatron_fsdp zero 1 on emulated NCCL, fsdp2 staged
#    (MPI), tp 2 with SP on NCCL and tp 2 staged, pp 2 and cp 2 (the ring
#    on bf16 bits, float32 sums) on NCCL and staged, and the MoE on 1
#    rank and under ep 2 on NCCL (the rows as bf16 bits);
#  - two ranks on emulated NCCL with these kernels against the 1-rank CPU
#    runs: tp 2 with sequence parallelism and cp 2 (the ring-attention
#    block kernels) in fp32 (1e-5), the MoE under ep 2 in bf16 (2e-3);
#  - every linear's bias with head_dim apart from hidden / heads: fp32
#    against the CPU (1e-5), and in bf16 the fused run's bits in passes,
#    on bf16 storage and, on two ranks, under tp 2 with SP;
#  - the Hugging Face families' features in fp32 against the CPU (1e-5):
#    llama3 RoPE scaling, Mistral's sliding window, Mixtral, OLMoE.
# What it cannot check: the hardware (timing, fragment layouts, tensor-core
# rounding, FMA contraction), and anything the schedules drawn here do not
# expose.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
emu="$abs_top_builddir/tests/emu/cuda/build/bin"
[ -x "$emu/test_cuda_kernels" ] || { echo "no $emu/test_cuda_kernels: make check builds it"; exit 99; }
gpu_args= # the host emulation, never the GPUs
MT_EMU_POISON=1
export MT_EMU_POISON
# bf16 compute on device cuda takes bf16 storage by default; the runs
# here are float32 storage's unless they say otherwise
MESHTRAIN_BF16_STORAGE=0
export MESHTRAIN_BF16_STORAGE

for t in test_cuda_kernels test_cuda_bf16; do
    t0=$(date +%s)
    expect_rc 0 "$emu/$t"
    echo "$t: $(printf '%s\n' "$out" | tail -n 1) ($(( $(date +%s) - t0 )) s)"
done

common="$parity_common step_scheduler.max_steps=3 step_scheduler.global_batch_size=2
 dataset.seq_length=32 checkpoint.enabled=false"
bf16=distributed.mp_policy.param_dtype=bfloat16
hd64="model.hidden_size=128 model.num_attention_heads=2 model.num_key_value_heads=1
 model.intermediate_size=256"
moe="model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32
 model.num_shared_experts=1 model.router_aux_loss_coef=0.01 distributed.activation_checkpointing=true"

# pair NAME APP TOL [key=value ...]: the CPU run and the emulated GPU run
pair() {
    pname=$1 app="$emu/$2" tol=$3
    shift 3
    train "$pname" 1 "$@"
    train "${pname}-cuda" 1 "$@" distributed.device=cuda
    table="cuda"
    case "$*" in *param_dtype=bfloat16*) table="cuda_bf16" ;; esac
    expect_in "$(cat "$workdir/${pname}-cuda.log")" "device: $table backend" \
        "$pname: on the $table table"
    compare_losses "$workdir/$pname.jsonl" "$workdir/${pname}-cuda.jsonl" "$pname" 0 "$tol" "$tol"
}
pair dense meshtrain-dense 1e-5
# shellcheck disable=SC2086
pair dense-bf16-hd64 meshtrain-dense 2e-3 $hd64 $bf16
# shellcheck disable=SC2086
pair moe-bf16 meshtrain-moe 2e-3 $moe $bf16

# same NAME APP REF RANKS [key=value ...]: with MESHTRAIN_BF16_PASSES=1 the
# model rounds every activation in a pass of its own and the kernels'
# roundings (in their stores and their loads) meet bf16 values: REF's bits
# exactly.  Two ranks run on emulated NCCL; there the passes the model
# keeps because a collective reads the tensor (TP sums, the CP ring, the
# EP rows) are checked too: the emulated FAST_16BF GEMM rounds its own
# operands, so a pass wrongly left out shows only where a collective, a
# copy or a GEMM's C operand reads it.
same() {
    sname=$1 app="$emu/$2" ref=$3 ranks=$4
    shift 4
    nccl=
    [ "$ranks" -gt 1 ] && nccl=distributed.collectives=nccl
    MESHTRAIN_BF16_PASSES=1
    export MESHTRAIN_BF16_PASSES
    train "$sname" "$ranks" "$@" distributed.device=cuda $nccl
    unset MESHTRAIN_BF16_PASSES
    expect_in "$(cat "$workdir/$sname.log")" "rounding in passes" "$sname: rounding in passes"
    compare_losses "$workdir/$ref.jsonl" "$workdir/$sname.jsonl" "$sname" 0 0 0
}
# shellcheck disable=SC2086
same dense-bf16-hd64-passes meshtrain-dense dense-bf16-hd64-cuda 1 $hd64 $bf16
# shellcheck disable=SC2086
same moe-bf16-passes meshtrain-moe moe-bf16-cuda 1 $moe $bf16
# bf16 storage (the default for bf16 on device cuda; the runs above set
# MESHTRAIN_BF16_STORAGE=0): activations and weights as bf16 bits, the
# kernels instantiated on bf16, the GEMMs cuBLASLt's bf16 ones, give the
# float32-storage run's bits here (the emulated bf16 GEMM sums in the
# order of the emulated FAST_16BF one; on a GPU the two differ, and
# tests/gpu/run.sh compares to bf16 tolerance), with activation
# checkpointing too
app="$emu/meshtrain-dense"
unset MESHTRAIN_BF16_STORAGE # the default
# shellcheck disable=SC2086
train dense-bf16-hd64-storage 1 $hd64 $bf16 distributed.device=cuda
expect_in "$(cat "$workdir/dense-bf16-hd64-storage.log")" "device: cuda_bf16_storage backend" \
    "bf16 storage by default on cuda: the cuda_bf16_storage table"
compare_losses "$workdir/dense-bf16-hd64-cuda.jsonl" "$workdir/dense-bf16-hd64-storage.jsonl" \
    "bf16 storage on the emulated GPU" 0 0 0
MESHTRAIN_BF16_STORAGE=1
export MESHTRAIN_BF16_STORAGE
# shellcheck disable=SC2086
train dense-bf16-hd64-storage-ac 1 $hd64 $bf16 distributed.device=cuda \
    distributed.activation_checkpointing=true
compare_losses "$workdir/dense-bf16-hd64-cuda.jsonl" "$workdir/dense-bf16-hd64-storage-ac.jsonl" \
    "bf16 storage with checkpointing on the emulated GPU" 0 0 0
MESHTRAIN_BF16_STORAGE=0
# two ranks: the sharded gathers land bf16 bits (fsdp2: from the float32
# shards; zero 1: the arena's own rows as they are), on NCCL and staged;
# tp 2 with SP sends the bf16 bits as they are, its loss the
# vocabulary-parallel passes on bf16 logits (4 heads of 64, 2 kv heads);
# pp 2's messages are the bits of the stage outputs and gradients; cp 2's
# ring shifts K/V bits and sums blocks in float32
hd64tp="model.hidden_size=256 model.num_attention_heads=4 model.num_key_value_heads=2
 model.intermediate_size=256"
for c in "fsdp2-nccl|$hd64 distributed.strategy=fsdp2 distributed.collectives=nccl" \
    "zero1-nccl|$hd64 distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=1 \
distributed.collectives=nccl" \
    "fsdp2-mpi|$hd64 distributed.strategy=fsdp2 distributed.collectives=mpi" \
    "tp2-sp-nccl|$hd64tp distributed.tp_size=2 distributed.sequence_parallel=true \
distributed.collectives=nccl" \
    "tp2-mpi|$hd64tp distributed.tp_size=2 distributed.collectives=mpi" \
    "pp2-nccl|$hd64 distributed.pp_size=2 distributed.pipeline.pp_microbatch_size=1 \
distributed.collectives=nccl" \
    "pp2-mpi|$hd64 distributed.pp_size=2 distributed.pipeline.pp_microbatch_size=1 \
distributed.collectives=mpi" \
    "cp2-nccl|$hd64 distributed.cp_size=2 distributed.collectives=nccl" \
    "cp2-mpi|$hd64 distributed.cp_size=2 distributed.collectives=mpi"; do
    cname=${c%%|*} cargs=${c#*|}
    # shellcheck disable=SC2086
    train "dense-bf16-hd64-$cname" 2 $bf16 $cargs distributed.device=cuda
    MESHTRAIN_BF16_STORAGE=1
    export MESHTRAIN_BF16_STORAGE
    # shellcheck disable=SC2086
    train "storage-$cname" 2 $bf16 $cargs distributed.device=cuda
    MESHTRAIN_BF16_STORAGE=0
    want="collectives NCCL"
    case $cname in *mpi) want="MPI on host copies (staged)" ;; esac
    expect_in "$(cat "$workdir/storage-$cname.log")" "$want" "storage-$cname: $want"
    compare_losses "$workdir/dense-bf16-hd64-$cname.jsonl" "$workdir/storage-$cname.jsonl" \
        "bf16 storage, $cname, on the emulated GPU" 0 0 0
done
# head dim 16 (the fp32 attention fallback) and the q/k norms
app="$emu/meshtrain-dense"
# shellcheck disable=SC2086
train dense-bf16-qk-cuda 1 $bf16 model.qk_norm=true distributed.device=cuda
# shellcheck disable=SC2086
same dense-bf16-qk-passes meshtrain-dense dense-bf16-qk-cuda 1 $bf16 model.qk_norm=true
# the same on bf16 storage: the CUDA-core attention on bf16 bits
MESHTRAIN_BF16_STORAGE=1
export MESHTRAIN_BF16_STORAGE
# shellcheck disable=SC2086
train dense-bf16-qk-storage 1 $bf16 model.qk_norm=true distributed.device=cuda
MESHTRAIN_BF16_STORAGE=0
compare_losses "$workdir/dense-bf16-qk-cuda.jsonl" "$workdir/dense-bf16-qk-storage.jsonl" \
    "bf16 storage at head dim 16 on the emulated GPU" 0 0 0
# two ranks in bf16, fused and in passes: tp 2 + SP, cp 2, and a MoE
# under tp 2 without SP (its layer gathers the rows each rank routed)
for c in "tp2-sp-bf16|meshtrain-dense|distributed.tp_size=2 distributed.sequence_parallel=true" \
    "cp2-bf16|meshtrain-dense|distributed.cp_size=2" \
    "moe-tp2-bf16|meshtrain-moe|$moe distributed.tp_size=2"; do
    cname=${c%%|*} rest=${c#*|}
    capp=${rest%%|*} cargs=${rest#*|}
    app="$emu/$capp"
    # shellcheck disable=SC2086
    train "$cname" 2 $cargs $bf16 distributed.device=cuda distributed.collectives=nccl
    # shellcheck disable=SC2086
    same "$cname-passes" "$capp" "$cname" 2 $cargs $bf16
done

# two NAME APP REF TOL [key=value ...]: 2 ranks on emulated NCCL against REF
two() {
    tname=$1 app="$emu/$2" ref=$3 tol=$4
    shift 4
    train "$tname" 2 "$@" distributed.device=cuda distributed.collectives=nccl
    expect_in "$(cat "$workdir/$tname.log")" "collectives NCCL" "$tname: on NCCL"
    compare_losses "$workdir/$ref.jsonl" "$workdir/$tname.jsonl" "$tname" 0 "$tol" "$tol"
}
two tp2-sp meshtrain-dense dense 1e-5 distributed.tp_size=2 distributed.sequence_parallel=true
two cp2 meshtrain-dense dense 1e-5 distributed.cp_size=2
# shellcheck disable=SC2086
two ep2-bf16 meshtrain-moe moe-bf16 2e-3 $moe $bf16 distributed.ep_size=2
# shellcheck disable=SC2086
same ep2-bf16-passes meshtrain-moe ep2-bf16 2 $moe $bf16 distributed.ep_size=2
# the MoE on bf16 storage (the MoE rows on bf16 bits, the combine and the
# expert input gradients summed in float32): the same bits, 1 rank and ep 2
MESHTRAIN_BF16_STORAGE=1
export MESHTRAIN_BF16_STORAGE
app="$emu/meshtrain-moe"
# shellcheck disable=SC2086
train moe-bf16-storage 1 $moe $bf16 distributed.device=cuda
compare_losses "$workdir/moe-bf16-cuda.jsonl" "$workdir/moe-bf16-storage.jsonl" \
    "MoE on bf16 storage on the emulated GPU" 0 0 0
# shellcheck disable=SC2086
train ep2-bf16-storage 2 $moe $bf16 distributed.ep_size=2 distributed.device=cuda \
    distributed.collectives=nccl
compare_losses "$workdir/ep2-bf16.jsonl" "$workdir/ep2-bf16-storage.jsonl" \
    "MoE ep 2 on bf16 storage on emulated NCCL" 0 0 0
MESHTRAIN_BF16_STORAGE=0
# every linear's bias, heads 16 wide against hidden 48 (the rank-1 GEMMs
# ones b^T and dy^T ones through the emulated cuBLAS and cuBLASLt): fp32
# against the CPU run; bf16 in passes, on bf16 storage, and tp 2 with SP
# (o_proj's and down_proj's biases added after the reduce-scatter), all
# the fused run's bits
bias="model.hidden_size=48 model.head_dim=16 model.intermediate_size=96
 model.attention_bias=true model.mlp_bias=true"
# shellcheck disable=SC2086
pair bias meshtrain-dense 1e-5 $bias
app="$emu/meshtrain-dense"
# shellcheck disable=SC2086
train bias-bf16-cuda 1 $bias $bf16 distributed.device=cuda
# shellcheck disable=SC2086
same bias-bf16-passes meshtrain-dense bias-bf16-cuda 1 $bias $bf16
MESHTRAIN_BF16_STORAGE=1
export MESHTRAIN_BF16_STORAGE
# shellcheck disable=SC2086
train bias-bf16-storage 1 $bias $bf16 distributed.device=cuda
MESHTRAIN_BF16_STORAGE=0
compare_losses "$workdir/bias-bf16-cuda.jsonl" "$workdir/bias-bf16-storage.jsonl" \
    "biases on bf16 storage on the emulated GPU" 0 0 0
tpsp="distributed.tp_size=2 distributed.sequence_parallel=true"
# shellcheck disable=SC2086
train bias-tp2-sp-bf16 2 $bias $tpsp $bf16 distributed.device=cuda distributed.collectives=nccl
# shellcheck disable=SC2086
same bias-tp2-sp-bf16-passes meshtrain-dense bias-tp2-sp-bf16 2 $bias $tpsp $bf16
# The Hugging Face families' features on the emulated GPU against the CPU:
# llama3 RoPE scaling that bites inside the rows, Mistral's sliding
# window, Mixtral's names and router, OLMoE's whole-projection q/k norm
rope="model.rope_scaling.rope_type=llama3 model.rope_scaling.factor=8.0
 model.rope_scaling.original_max_position_embeddings=16"
# shellcheck disable=SC2086
pair rope-llama3 meshtrain-dense 1e-5 $rope
pair window meshtrain-dense 1e-5 model.architecture=MistralForCausalLM model.sliding_window=7
experts="model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32
 model.router_aux_loss_coef=0.01"
# shellcheck disable=SC2086
pair mixtral meshtrain-moe 1e-5 $experts model.architecture=MixtralForCausalLM model.norm_topk_prob=true
# shellcheck disable=SC2086
pair olmoe meshtrain-moe 1e-5 $experts model.architecture=OlmoeForCausalLM model.qk_norm=true
# OLMoE under tp 2: the q/k norm's row sums (rmsnorm_rowsums) added over
# NCCL between the two emulated GPUs, against the 1-rank CPU run; and on
# bf16 storage against the rounding table's run on one emulated GPU
olmoe="$experts model.architecture=OlmoeForCausalLM model.qk_norm=true"
# shellcheck disable=SC2086
train olmoe-tp2-cuda 2 $olmoe distributed.tp_size=2 distributed.device=cuda \
    distributed.collectives=nccl
compare_losses "$workdir/olmoe.jsonl" "$workdir/olmoe-tp2-cuda.jsonl" \
    "OLMoE, tp 2 on the emulated GPUs against 1 CPU rank" 0 1e-5 1e-5
# shellcheck disable=SC2086
train olmoe-bf16-cuda 1 $olmoe $bf16 distributed.device=cuda
MESHTRAIN_BF16_STORAGE=1
export MESHTRAIN_BF16_STORAGE
# shellcheck disable=SC2086
train olmoe-tp2-bf16-storage 2 $olmoe $bf16 distributed.tp_size=2 distributed.device=cuda \
    distributed.collectives=nccl
MESHTRAIN_BF16_STORAGE=0
compare_losses "$workdir/olmoe-bf16-cuda.jsonl" "$workdir/olmoe-tp2-bf16-storage.jsonl" \
    "OLMoE, tp 2 on bf16 storage on the emulated GPUs against 1 GPU" 0 2e-3 2e-3
finish
