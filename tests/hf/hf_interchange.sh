#!/bin/sh
# hf_interchange.sh: meshtrain-ckpt export and import (doc/hf-interchange.md)
# on checkpoints of two short training runs (a Llama and a tied Qwen3-style
# model, 5 steps each).  Export on 1 and 2 ranks (byte-identical), sharded
# with a tiny --max-shard-size, and as bfloat16; every file is checked by
# tests/hf/hf_check.py (standard library only) for its layout and its values
# against h5dump's.  Import back on 1 and 2 ranks, single and sharded: every
# /model dataset is identical (h5diff), the optimizer state is zero, and
# training starts from it at step 0 with the imported weights.  Import of
# files written by an independent writer (hf_check.py: F32, BF16, F16), and
# the refusals: missing, extra and misshaped tensors, unsupported
# architectures and features, a disagreeing --config, non-empty targets,
# malformed config.json, usage errors.  Skips (77) without python3, h5dump
# or h5diff.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
for tool in python3 h5dump h5diff; do
    command -v $tool >/dev/null 2>&1 || { echo "hf_interchange.sh: no $tool; skipping"; exit 77; }
done
ckpt="$bindir/meshtrain-ckpt"
check="python3 $abs_top_srcdir/tests/hf/hf_check.py"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
mpi2() { timeout 120 "$MPIEXEC" $MPIEXEC_NP 2 "$@"; }
w=$workdir

# check_py WHAT ARGS...: one hf_check.py run as one check
check_py() {
    what=$1; shift
    checks=$((checks + 1))
    $check "$@" >"$w/py.out" 2>&1 || fail "$what: $(cat "$w/py.out")"
}

# dump H5FILE DIR: every /model dataset as DIR/<name>.bin (float32 LE)
dump() {
    mkdir -p "$2"
    for d in $(h5ls -r "$1" | awk '$1 ~ /^\/model\// && $2 == "Dataset" {print $1}'); do
        h5dump -d "$d" -b LE -o "$2/${d#/model/}.bin" "$1" >/dev/null || fail "h5dump $d"
    done
}

# same_model A.h5 B.h5: every /model dataset of A is in B, identical
same_model() {
    n=0
    for d in $(h5ls -r "$1" | awk '$1 ~ /^\/model\// && $2 == "Dataset" {print $1}'); do
        checks=$((checks + 1)); n=$((n + 1))
        h5diff "$1" "$2" "$d" "$d" >/dev/null 2>&1 || fail "$d differs between $1 and $2"
    done
    checks=$((checks + 1))
    [ "$n" -eq "$(h5ls -r "$2" | awk '$1 ~ /^\/model\// && $2 == "Dataset"' | wc -l)" ] ||
        fail "$2 has a different number of /model datasets than $1 ($n)"
}

train() { # DIR [overrides...]: a 5-step run that checkpoints at step 5
    dir=$1; shift
    expect_rc 0 "$bindir/meshtrain-dense" --config "$testconfigs/train-small.yaml" \
        dataset.path="$data" checkpoint.checkpoint_dir="$dir" logging.metrics_file="$w/metrics.jsonl" \
        step_scheduler.max_steps=5 "$@"
}

train "$w/ck"
h5="$w/ck/step_00000005/model.h5"
dump "$h5" "$w/dump"

# ---- export: 1 rank, 2 ranks, sharded, bfloat16
expect_rc 0 "$ckpt" export "$w/ck" -o "$w/hf1"
expect_in "$out" "exported $w/ck/step_00000005 to $w/hf1: LlamaForCausalLM, 21 tensors, 477440 bytes of float32 in 1 file" "export summary"
check_py "1-rank export layout" check "$w/hf1"
check_py "1-rank export values" values "$w/hf1" "$w/dump"
expect_rc 0 python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); assert (c["architectures"], c["model_type"], c["vocab_size"], c["hidden_size"], c["num_key_value_heads"], c["head_dim"], c["tie_word_embeddings"], c["rope_theta"], c["torch_dtype"]) == (["LlamaForCausalLM"], "llama", 258, 64, 2, 16, False, 10000.0, "float32"), c' "$w/hf1/config.json"

expect_rc 0 mpi2 "$ckpt" export "$w/ck/step_00000005" -o "$w/hf2"
checks=$((checks + 1))
cmp "$w/hf1/model.safetensors" "$w/hf2/model.safetensors" >/dev/null &&
    cmp "$w/hf1/config.json" "$w/hf2/config.json" >/dev/null || fail "1-rank and 2-rank exports differ"

expect_rc 0 mpi2 "$ckpt" export "$h5" -o "$w/hfs" --max-shard-size 100KB
expect_in "$out" "in 6 files plus model.safetensors.index.json" "sharded summary"
check_py "sharded layout" check "$w/hfs"
check_py "sharded values" values "$w/hfs" "$w/dump"
checks=$((checks + 1))
for f in "$w"/hfs/model-0000?-of-00006.safetensors; do
    # data bytes per shard stay under 100 KB unless one tensor is larger
    [ "$(wc -c < "$f")" -lt 110000 ] || fail "$f is larger than the shard size"
done

expect_rc 0 mpi2 "$ckpt" export "$w/ck" -o "$w/hfb" --dtype bfloat16
expect_in "$out" "bytes of bfloat16" "bf16 summary"
check_py "bf16 layout" check "$w/hfb"
check_py "bf16 values (round to nearest even)" values "$w/hfb" "$w/dump"

# ---- import back: identical tensors, zero optimizer state, step 0
expect_rc 0 "$ckpt" import "$w/hf1" -o "$w/imp1"
expect_in "$out" "into $w/imp1/step_00000000" "import summary"
same_model "$h5" "$w/imp1/step_00000000/model.h5"
expect_rc 0 mpi2 "$ckpt" import "$w/hfs" -o "$w/imps"
expect_in "$out" "from 6 safetensors files" "sharded import"
same_model "$h5" "$w/imps/step_00000000/model.h5"
expect_rc 0 "$ckpt" verify "$w/imps"
expect_rc 0 "$ckpt" list "$w/imps"
expect_in "$out" "step              0" "imported step"
expect_in "$out" "world size        2" "imported by 2 ranks"
expect_in "$out" "optimizer state   238720" "full optimizer state"
h5dump -d /optim/model.layers.1.mlp.up_proj.weight/exp_avg_sq -b LE -o "$w/m2.bin" \
    "$w/imps/step_00000000/model.h5" >/dev/null
expect_rc 0 python3 -c 'import sys; d=open(sys.argv[1],"rb").read(); assert len(d)==160*64*4 and d.count(0)==len(d)' "$w/m2.bin"
expect_rc 0 "$ckpt" config "$w/imp1"
expect_in "$out" "hidden_size: 64" "stored config: model from config.json"
expect_in "$out" "qk_norm: false" "stored config: qk_norm"

# bf16 round trip: the imported values are the bfloat16 ones, exactly
expect_rc 0 "$ckpt" import "$w/hfb" -o "$w/impb"
dump "$w/impb/step_00000000/model.h5" "$w/dumpb"
check_py "bf16 import" decoded "$w/hfb" "$w/dumpb"

# ---- training starts from the imported checkpoint at step 0
train "$w/fresh"
fresh=$(printf '%s\n' "$out" | awk '/^step +1\/5/ {print $5}')
train "$w/ft" checkpoint.resume="$w/imp1/step_00000000"
expect_in "$out" "resumed from $w/imp1/step_00000000 at step 0 (0 samples consumed)" "resume at step 0"
expect_in "$out" "5 steps from step 0" "trains from step 0"
tuned=$(printf '%s\n' "$out" | awk '/^step +1\/5/ {print $5}')
checks=$((checks + 1))
# step 1 of the fine-tune starts from the trained weights: lower loss than a fresh start
awk -v a="$tuned" -v b="$fresh" 'BEGIN { exit !(a > 0 && a + 0.3 < b) }' ||
    fail "step-1 loss from the imported weights ($tuned) is not below a fresh start's ($fresh)"
checks=$((checks + 1))
[ -d "$w/ft/step_00000005" ] || fail "the fine-tune did not checkpoint step 5"

# ---- a Qwen3-style model with tied embeddings
train "$w/ckq" model.qk_norm=true model.tie_word_embeddings=true
expect_rc 0 mpi2 "$ckpt" export "$w/ckq" -o "$w/hfq"
expect_in "$out" "Qwen3ForCausalLM, 24 tensors" "qwen3 export: no lm_head"
check_py "qwen3 layout" check "$w/hfq"
expect_in "$(cat "$w/hfq/config.json")" '"model_type": "qwen3"' "qwen3 model_type"
expect_rc 0 mpi2 "$ckpt" import "$w/hfq" -o "$w/impq"
same_model "$w/ckq/step_00000005/model.h5" "$w/impq/step_00000000/model.h5"

# ---- files from an independent writer (sorted names, spec padding)
check_py "write F32" write "$w/hf1" "$w/py32" F32
expect_rc 0 "$ckpt" import "$w/py32" -o "$w/imp32"
same_model "$h5" "$w/imp32/step_00000000/model.h5"
check_py "write F16" write "$w/hf1" "$w/py16" F16
expect_rc 0 mpi2 "$ckpt" import "$w/py16" -o "$w/imp16"
dump "$w/imp16/step_00000000/model.h5" "$w/dump16"
check_py "F16 import" decoded "$w/py16" "$w/dump16"
# a tied model may carry lm_head; transformers ignores it, and so do we
check_py "write tied + lm_head" write "$w/hfq" "$w/pyq" BF16 extra=lm_head.weight \
    extra=model.layers.0.self_attn.rotary_emb.inv_freq
expect_rc 0 "$ckpt" import "$w/pyq" -o "$w/imppq"
expect_in "$out" "note: ignoring lm_head.weight" "tied lm_head ignored"
expect_in "$out" "note: ignoring model.layers.0.self_attn.rotary_emb.inv_freq" "inv_freq ignored"

# ---- --config: the other sections come from it, the model must agree
expect_rc 0 "$ckpt" import "$w/hf1" -o "$w/impc" --config "$testconfigs/train-small.yaml"
expect_rc 0 "$ckpt" config "$w/impc"
expect_in "$out" "seq_length: 64" "dataset section from --config"
printf 'model:\n  hidden_size: 64\n  num_attention_heads: 8\n' > "$w/bad.yaml"
expect_rc 1 "$ckpt" import "$w/hf1" -o "$w/impx" --config "$w/bad.yaml"
expect_in "$err" "$w/bad.yaml:3:24: model.num_attention_heads is 8, but $w/hf1/config.json says 4" "disagreeing --config"

# ---- refusals, each naming what is wrong
refuse() { # WHAT NEEDLE DIR [ranks]
    what=$1 needle=$2 dir=$3
    rm -rf "$w/refused"
    if [ "${4:-1}" = 2 ]; then expect_rc 1 mpi2 "$ckpt" import "$dir" -o "$w/refused"
    else expect_rc 1 "$ckpt" import "$dir" -o "$w/refused"; fi
    expect_in "$err" "$needle" "$what"
    checks=$((checks + 1))
    [ ! -e "$w/refused" ] || fail "$what: a checkpoint was written anyway"
}
$check write "$w/hf1" "$w/e1" F32 drop=model.layers.1.mlp.up_proj.weight >/dev/null
refuse "missing tensor" "tensor model.layers.1.mlp.up_proj.weight is missing" "$w/e1" 2
checks=$((checks + 1))
[ "$(printf '%s\n' "$err" | grep -c 'is missing')" -eq 1 ] || fail "2 ranks printed the error more than once: $err"
$check write "$w/hf1" "$w/e2" F32 reshape=model.layers.0.self_attn.q_proj.weight:32,128 >/dev/null
refuse "wrong shape" "tensor model.layers.0.self_attn.q_proj.weight has shape [32, 128], expected [64, 64]" "$w/e2"
$check write "$w/hf1" "$w/e3" F32 extra=model.layers.0.self_attn.q_proj.bias >/dev/null
refuse "extra tensor" "tensor model.layers.0.self_attn.q_proj.bias is not part of the LlamaForCausalLM" "$w/e3"
# what the model computes, refused by name
$check write "$w/hf1" "$w/e4" F32 'config=architectures:["DeepseekV2ForCausalLM"]' 'config=model_type:"deepseek_v2"' >/dev/null
refuse "MLA architecture" "architecture DeepseekV2ForCausalLM is not supported (multi-head latent attention is not implemented)" "$w/e4"
$check write "$w/hf1" "$w/e5" F32 'config=rope_scaling:{"rope_type": "longrope", "factor": 8.0}' >/dev/null
refuse "unknown rope_type" "rope_scaling of rope_type \"longrope\" is not supported: meshtrain computes default, linear, dynamic, llama3 and yarn" "$w/e5"
$check write "$w/hf1" "$w/e5b" F32 'config=rope_scaling:{"rope_type": "llama3", "factor": 8.0}' >/dev/null
refuse "llama3 without its original context" "\"original_max_position_embeddings\" is missing: it is required" "$w/e5b"
$check write "$w/hf1" "$w/e5c" F32 'config=hidden_act:"gelu"' >/dev/null
refuse "activation" "hidden_act gelu is not supported: meshtrain's MLP is SwiGLU (silu)" "$w/e5c"
$check write "$w/hf1" "$w/e5d" F32 'config=attention_dropout:0.1' >/dev/null
refuse "attention dropout" "\"attention_dropout\" 0.1: attention dropout in training is not supported" "$w/e5d"
$check write "$w/hf1" "$w/e5e" F32 'config=architectures:["Qwen2ForCausalLM"]' 'config=model_type:"qwen2"' 'config=use_sliding_window:true' >/dev/null
refuse "Qwen2 sliding window" "\"use_sliding_window\": true is not supported for Qwen2ForCausalLM" "$w/e5e"
$check write "$w/hf1" "$w/e5f" F32 'config=partial_rotary_factor:0.5' >/dev/null
refuse "partial rotary" "\"partial_rotary_factor\" 0.5: RoPE on part of each head is not supported" "$w/e5f"
# accepted features whose tensors the file must then have
$check write "$w/hf1" "$w/e6" F32 'config=attention_bias:true' >/dev/null
refuse "biases named by config.json" "tensor model.layers.0.self_attn.q_proj.bias is missing" "$w/e6"
$check write "$w/hf1" "$w/e7" F32 'config=head_dim:32' >/dev/null
refuse "head_dim from config.json" "tensor model.layers.0.self_attn.q_proj.weight has shape [64, 64], expected [128, 64]" "$w/e7"
mkdir "$w/e8" && cp "$w/hf1/model.safetensors" "$w/e8/"
printf '{\n  "architectures": ["LlamaForCausalLM"],\n  "vocab_size": 258,\n}\n' > "$w/e8/config.json"
refuse "malformed config.json" "$w/e8/config.json:4:1: expected a member name (a string): trailing commas are not allowed" "$w/e8"
mkdir "$w/e9" && cp "$w/hf1/config.json" "$w/e9/"
refuse "no weights" "no model.safetensors and no model.safetensors.index.json" "$w/e9"

# ---- never overwrite; usage
expect_rc 1 "$ckpt" export "$w/ck" -o "$w/hf1"
expect_in "$err" "$w/hf1 already holds" "export refuses to overwrite"
expect_rc 1 "$ckpt" import "$w/hf1" -o "$w/ck"
expect_in "$err" "$w/ck is not empty" "import refuses a used checkpoint_dir"
expect_rc 2 "$ckpt" export "$w/ck"
expect_in "$err" "export needs -o DIR" "export without -o"
expect_rc 2 "$ckpt" export "$w/ck" -o "$w/x" --dtype float16
expect_in "$err" "--dtype float16: expected float32 or bfloat16" "bad dtype"
expect_rc 2 "$ckpt" import "$w/hf1" -o "$w/x" --max-shard-size 1GB
expect_rc 0 "$ckpt" --help
expect_in "$out" "export PATH -o HF_DIR" "help lists export"
expect_in "$out" "import HF_DIR -o CHECKPOINT_DIR" "help lists import"
finish
