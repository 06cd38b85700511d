#!/bin/sh
# hf_lora_more.sh: LoRA (doc/lora.md) under sequence parallelism: tp_size
# 2 with distributed.sequence_parallel against the 1-rank run, on the
# small random llama3 (untied) and qwen25 (q/k/v biases, tied embedding,
# with activation checkpointing) models of tests/hf/make_model.py: the
# losses and gradient norms of 3 steps (compare_losses) and the final
# adapters within 5e-5.  The adapters read the whole (all-gathered)
# sequence as the base's linears do, and o_proj, down_proj's adapter
# output is added to this rank's tokens alone.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MESHTRAIN_BF16_STORAGE=0
export OMP_NUM_THREADS OPENBLAS_NUM_THREADS MESHTRAIN_BF16_STORAGE
src="$abs_top_srcdir/tests/hf"
w=$workdir

cat > "$w/lora.yaml" <<'YAML'
dataset:
  seq_length: 64
  shuffle: false
step_scheduler:
  global_batch_size: 2
  local_batch_size: 1
  max_steps: 3
optimizer:
  lr: 2.0e-3
  weight_decay: 0.1
  max_grad_norm: 1.0
checkpoint:
  enabled: true
logging:
  log_every_steps: 1
peft:
  target_modules: ["*_proj"]
  dim: 4
  alpha: 8
  lora_A_init: uniform
YAML
expect_rc 0 python3 "$src/make_model.py" llama3 "$w/llama3/hf" qwen25 "$w/qwen25/hf"

# run NAME FAMILY NP [key=value ...]
run() {
    name=$1 fam=$2 n=$3; shift 3
    expect_rc 0 np "$n" "$bindir/meshtrain-dense" --config "$w/lora.yaml" \
        model.pretrained_model_name_or_path="$w/$fam/hf" dataset.path="$w/$fam/hf/tokens.bin" \
        checkpoint.checkpoint_dir="$w/$name" logging.metrics_file="$w/$name.jsonl" "$@"
}
last() { echo "$w/$1/step_00000003/model.h5"; }

sp="distributed.tp_size=2 distributed.sequence_parallel=true"
run llama3-1 llama3 1
# shellcheck disable=SC2086
run llama3-sp llama3 2 $sp
compare_losses "$w/llama3-1.jsonl" "$w/llama3-sp.jsonl" "tp 2 + sp"
params_close "$(last llama3-1)" "$(last llama3-sp)" "tp 2 + sp: final adapters" 5e-5
run qwen25-1 qwen25 1
# shellcheck disable=SC2086
run qwen25-sp qwen25 2 $sp distributed.activation_checkpointing=true
compare_losses "$w/qwen25-1.jsonl" "$w/qwen25-sp.jsonl" "tp 2 + sp with biases, tied, AC"
params_close "$(last qwen25-1)" "$(last qwen25-sp)" "tp 2 + sp, AC: final adapters" 5e-5
# attention only: the MLP's norm output is then gathered for the base alone
# shellcheck disable=SC2086
run llama3-1a llama3 1 "peft.target_modules=[q_proj, o_proj]"
# shellcheck disable=SC2086
run llama3-spa llama3 2 $sp "peft.target_modules=[q_proj, o_proj]"
compare_losses "$w/llama3-1a.jsonl" "$w/llama3-spa.jsonl" "tp 2 + sp, q and o only"
finish
