#!/bin/sh
# hf_consolidated.sh: checkpoint.save_consolidated (doc/checkpoints.md),
# the Hugging Face directory step_NNNNNNNN/model/consolidated/ that a
# training run writes beside its checkpoint, in parallel.
#
# A run whose weights are a Hugging Face model (imported, resumed at step
# 0, with model.pretrained_model_name_or_path the source) writes at step 0
# exactly the source's tensors (F16 single file, BF16 shards), its
# config.json fields (torch_dtype set) and its generation and tokenizer
# files: checked by tests/hf/hf_same.py, independently of meshtrain's
# reader.  The directory written on tp2, pp2 and fsdp2 is byte-identical
# to the 1-rank one.  Without a source it equals meshtrain-ckpt export of
# the same step (float32, and bfloat16 under param_dtype bfloat16; a
# Qwen3-MoE and a Mixtral at ep 2), and what it cannot write is refused
# before training.  final writes at the last step only, every at each
# save.  A failure half-way (a tokenizer file that cannot be read) stops
# every rank and leaves no directory, a bad source is refused by name,
# and validation refuses torch_save and hdf5.  Skips (77) without
# python3.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
command -v python3 >/dev/null 2>&1 || { echo "hf_consolidated.sh: no python3; skipping"; exit 77; }
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
ckpt="$bindir/meshtrain-ckpt"
same="python3 $abs_top_srcdir/tests/hf/hf_same.py"
check="python3 $abs_top_srcdir/tests/hf/hf_check.py"
w=$workdir
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# py WHAT ARGS...: one Python check as one check
py() {
    what=$1; shift
    checks=$((checks + 1))
    "$@" >"$w/py.out" 2>&1 || fail "$what: $(cat "$w/py.out")"
}

# run NP DIR [overrides...]: train-small into checkpoint_dir DIR (on the
# GPUs under make check MESHTRAIN_TEST_GPUS=N: the blocks are staged from
# device memory)
run() {
    n=$1 dir=$2; shift 2
    # shellcheck disable=SC2086
    expect_rc 0 np "$n" "$bindir/meshtrain-dense" --config "$small_cfg" dataset.path="$data" \
        checkpoint.checkpoint_dir="$dir" logging.metrics_file="$dir.jsonl" \
        step_scheduler.local_batch_size=2 checkpoint.keep_last_n=0 $gpu_args "$@"
}

# from SRC IMPORTED NP DIR [overrides...]: step 0 of a run on the imported
# weights, with SRC as the source model; consolidated at every save
from() {
    src=$1 imp=$2 n=$3 dir=$4; shift 4
    run "$n" "$dir" checkpoint.resume="$imp/step_00000000" checkpoint.save_initial=true \
        step_scheduler.max_steps=1 checkpoint.save_consolidated=every \
        model.pretrained_model_name_or_path="$src" "$@"
}

# same_dir A B WHAT: the same files, byte for byte
same_dir() {
    checks=$((checks + 1))
    [ "$(ls "$1")" = "$(ls "$2")" ] || fail "$3: files differ: $(ls "$1") / $(ls "$2")"
    for f in "$1"/*; do
        cmp "$f" "$2/${f##*/}" >/dev/null 2>&1 || fail "$3: ${f##*/} differs"
    done
}

# ---- a Hugging Face source: F16 in one file, with the files a hub model has
run 1 "$w/base" step_scheduler.max_steps=1
expect_rc 0 "$ckpt" export "$w/base" -o "$w/hf32"
py "write the F16 source" $check write "$w/hf32" "$w/src16" F16 'config=torch_dtype:"float16"' \
    'config=bos_token_id:1' 'config=eos_token_id:2' 'config=transformers_version:"4.57.1"'
printf '{\n  "bos_token_id": 1,\n  "eos_token_id": 2,\n  "max_new_tokens": 32\n}\n' \
    > "$w/src16/generation_config.json"
printf '{"version": "1.0", "model": {"type": "BPE"}}\n' > "$w/src16/tokenizer.json"
printf '{"bos_token": "<s>", "eos_token": "</s>"}\n' > "$w/src16/tokenizer_config.json"
expect_rc 0 "$ckpt" import "$w/src16" -o "$w/imp16"

# ---- step 0 on 1 rank: the source's tensors, config and files
from "$w/src16" "$w/imp16" 1 "$w/r1"
c1="$w/r1/step_00000000/model/consolidated"
py "F16 tensors are the source's" $same tensors "$w/src16" "$c1"
py "config.json is the source's" $same config "$w/src16" "$c1" 'torch_dtype="float16"'
for f in generation_config.json tokenizer.json tokenizer_config.json; do
    checks=$((checks + 1))
    cmp "$w/src16/$f" "$c1/$f" >/dev/null 2>&1 || fail "$f is not the source's"
done
checks=$((checks + 1))
[ -f "$w/r1/step_00000001/model/consolidated/config.json" ] || fail "every: no step-1 directory"
checks=$((checks + 1))
[ ! -e "$w/r1/step_00000000/model/consolidated.tmp" ] || fail "consolidated.tmp left behind"
py "step 1 stays F16" $same dtype "$w/r1/step_00000001/model/consolidated" F16
expect_rc 0 "$ckpt" verify "$w/r1/step_00000000"

# ---- the same directory from every mesh
from "$w/src16" "$w/imp16" 2 "$w/rtp" distributed.tp_size=2
same_dir "$c1" "$w/rtp/step_00000000/model/consolidated" "tp2"
from "$w/src16" "$w/imp16" 2 "$w/rpp" distributed.pp_size=2 distributed.pipeline.pp_microbatch_size=1
same_dir "$c1" "$w/rpp/step_00000000/model/consolidated" "pp2"
from "$w/src16" "$w/imp16" 2 "$w/rfs" distributed.strategy=fsdp2
same_dir "$c1" "$w/rfs/step_00000000/model/consolidated" "fsdp2"

# ---- a BF16 source in shards, under bf16 mixed precision on tp2
expect_rc 0 "$ckpt" export "$w/base" -o "$w/srcb" --dtype bfloat16 --max-shard-size 100KB
expect_rc 0 "$ckpt" import "$w/srcb" -o "$w/impb"
from "$w/srcb" "$w/impb" 2 "$w/rb" distributed.tp_size=2 distributed.mp_policy.param_dtype=bfloat16
py "BF16 shards are the source's" $same tensors "$w/srcb" "$w/rb/step_00000000/model/consolidated"
py "BF16 config.json" $same config "$w/srcb" "$w/rb/step_00000000/model/consolidated"
py "sharded layout" $check check "$w/rb/step_00000000/model/consolidated"

# ---- no source: the param dtype and a generated config.json, as export writes them
run 2 "$w/fin" step_scheduler.max_steps=2 step_scheduler.ckpt_every_steps=1 \
    checkpoint.save_consolidated=final distributed.strategy=fsdp2
checks=$((checks + 1))
[ ! -e "$w/fin/step_00000001/model" ] || fail "final: step 1 has a consolidated directory"
expect_rc 0 "$ckpt" export "$w/fin/step_00000002" -o "$w/fin-export"
py "final: the export's tensors" $same tensors "$w/fin-export" "$w/fin/step_00000002/model/consolidated"
checks=$((checks + 1))
cmp "$w/fin-export/config.json" "$w/fin/step_00000002/model/consolidated/config.json" >/dev/null ||
    fail "final: config.json differs from the export's"
run 1 "$w/ev" step_scheduler.max_steps=2 step_scheduler.ckpt_every_steps=1 \
    checkpoint.save_consolidated=true distributed.mp_policy.param_dtype=bfloat16
checks=$((checks + 1))
[ -f "$w/ev/step_00000001/model/consolidated/config.json" ] || fail "every: no step-1 directory"
expect_rc 0 "$ckpt" export "$w/ev" -o "$w/ev-export" --dtype bfloat16
py "bf16 run: the bf16 export's tensors" $same tensors "$w/ev-export" "$w/ev/step_00000002/model/consolidated"
checks=$((checks + 1))
cmp "$w/ev-export/config.json" "$w/ev/step_00000002/model/consolidated/config.json" >/dev/null ||
    fail "bf16 run: config.json differs from the export's"

# ---- a Qwen3-MoE and a Mixtral at ep 2: every expert from the rank that holds it
moe="model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32
 model.norm_topk_prob=true model.qk_norm=true distributed.ep_size=2"
# shellcheck disable=SC2086
expect_rc 0 np 2 "$bindir/meshtrain-moe" --config "$small_cfg" dataset.path="$data" $moe \
    model.mlp_only_layers=0 step_scheduler.max_steps=1 step_scheduler.local_batch_size=2 \
    checkpoint.checkpoint_dir="$w/moe" logging.metrics_file="$w/moe.jsonl" \
    checkpoint.save_consolidated=final
expect_rc 0 "$ckpt" export "$w/moe" -o "$w/moe-export"
py "MoE: the export's tensors" $same tensors "$w/moe-export" "$w/moe/step_00000001/model/consolidated"
checks=$((checks + 1))
cmp "$w/moe-export/config.json" "$w/moe/step_00000001/model/consolidated/config.json" >/dev/null ||
    fail "MoE: config.json differs from the export's"
# shellcheck disable=SC2086
expect_rc 0 np 2 "$bindir/meshtrain-moe" --config "$small_cfg" dataset.path="$data" \
    model.architecture=MixtralForCausalLM model.num_experts=4 model.num_experts_per_tok=2 \
    model.moe_intermediate_size=160 distributed.ep_size=2 step_scheduler.max_steps=1 \
    step_scheduler.local_batch_size=2 checkpoint.checkpoint_dir="$w/mix" \
    logging.metrics_file="$w/mix.jsonl" checkpoint.save_consolidated=final
expect_rc 0 "$ckpt" export "$w/mix" -o "$w/mix-export"
expect_in "$out" "MixtralForCausalLM, 41 tensors" "Mixtral export"
py "Mixtral: the export's tensors" $same tensors "$w/mix-export" "$w/mix/step_00000001/model/consolidated"
# a model transformers has no class for is refused before training, not at the save
# shellcheck disable=SC2086
expect_rc 1 np 2 "$bindir/meshtrain-moe" --config "$small_cfg" dataset.path="$data" $moe \
    model.moe_router_bias_update_rate=0.001 step_scheduler.max_steps=1 \
    checkpoint.checkpoint_dir="$w/moeb" logging.metrics_file="$w/moeb.jsonl" \
    checkpoint.save_consolidated=final
expect_in "$err" "the router's balancing bias change what the model computes and Qwen3MoeForCausalLM has neither (checkpoint.save_consolidated)" "router bias refused"
checks=$((checks + 1))
[ ! -e "$w/moeb" ] || fail "router bias: the run trained and saved before refusing"

# ---- failures: every rank stops, no directory that looks complete
mkdir "$w/bad" && cp "$w/src16"/* "$w/bad/" && rm "$w/bad/tokenizer.json" &&
    ln -s nowhere "$w/bad/tokenizer.json"
expect_rc 1 np 2 "$bindir/meshtrain-dense" --config "$small_cfg" dataset.path="$data" \
    checkpoint.checkpoint_dir="$w/rbad" logging.metrics_file="$w/rbad.jsonl" \
    checkpoint.resume="$w/imp16/step_00000000" checkpoint.save_initial=true \
    step_scheduler.max_steps=1 checkpoint.save_consolidated=every \
    model.pretrained_model_name_or_path="$w/bad"
expect_in "$err" "$w/bad/tokenizer.json: cannot read it to copy into the consolidated model" "unreadable tokenizer file"
checks=$((checks + 1))
[ ! -e "$w/rbad/step_00000000/model/consolidated" ] &&
    [ ! -e "$w/rbad/step_00000000/model/consolidated.tmp" ] || fail "a failed save left a directory"
expect_rc 0 "$ckpt" verify "$w/rbad/step_00000000"

py "a source without a tensor" $check write "$w/src16" "$w/short" F16 drop=model.norm.weight
expect_rc 1 "$bindir/meshtrain-dense" --config "$small_cfg" dataset.path="$data" \
    checkpoint.checkpoint_dir="$w/rshort" logging.metrics_file="$w/rshort.jsonl" \
    checkpoint.resume="$w/imp16/step_00000000" checkpoint.save_initial=true \
    step_scheduler.max_steps=1 checkpoint.save_consolidated=every \
    model.pretrained_model_name_or_path="$w/short"
expect_in "$err" "$w/short has no tensor model.norm.weight: the run's model is not the model of model.pretrained_model_name_or_path" "source without a tensor"
expect_rc 1 "$bindir/meshtrain-dense" --config "$small_cfg" dataset.path="$data" \
    checkpoint.checkpoint_dir="$w/rnone" logging.metrics_file="$w/rnone.jsonl" \
    step_scheduler.max_steps=1 checkpoint.save_consolidated=final \
    model.pretrained_model_name_or_path="$w/no-such-model"
expect_in "$err" "model.pretrained_model_name_or_path '$w/no-such-model': not found on local disk; looked in: $w/no-such-model (no such directory)" "missing source"

# ---- validation: the formats meshtrain does not write, by name
expect_rc 1 "$bindir/meshtrain-dense" --config "$small_cfg" --dry-run checkpoint.model_save_format=torch_save
expect_in "$err" "checkpoint.model_save_format: torch_save (AutoModel's PyTorch pickle format) is not supported" "torch_save refused"
expect_rc 1 "$bindir/meshtrain-dense" --config "$small_cfg" --dry-run checkpoint.model_save_format=hdf5 checkpoint.save_consolidated=final
expect_in "$err" "checkpoint.model_save_format: hdf5 with save_consolidated final" "hdf5 refused for the consolidated directory"
expect_rc 0 "$bindir/meshtrain-dense" --config "$small_cfg" --dry-run checkpoint.model_save_format=hdf5

echo "hf_consolidated.sh: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
