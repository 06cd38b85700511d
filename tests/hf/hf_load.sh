#!/bin/sh
# hf_load.sh: a model named by model.pretrained_model_name_or_path, loaded
# at start as transformers does offline (doc/hf-interchange.md).
#
# The test builds a fake hub cache: a 2-layer Llama trained 10 steps,
# exported as sharded BF16 safetensors with an index, its step-5 weights as
# snapshot A (refs/main) and its step-10 weights as snapshot B (refs/v2),
# and a Qwen3-MoE the same way.  Loading by hub id and by directory gives
# the step-1 loss and gradient norm of `meshtrain-ckpt import` plus training
# from that checkpoint, bit for bit, on 1 rank, tp 2, pp 2, fsdp (dp 2),
# bf16 compute (master weights) and, for the MoE, ep 2; on guarded device
# memory too (staged copies).  HF_HUB_CACHE wins over HF_HOME, which wins over HOME;
# model.revision picks a branch or a commit.  model.config (AutoModel's
# from_config) takes the architecture from config.json with random weights,
# or inline fields; explicit model.* keys override config.json with a
# warning each; meshtrain-plan sizes the named model.  A config that names
# no model is refused, and so, on 2 ranks with one message, exit 1 and no
# checkpoint written, are a missing model, a broken config.json, a shard
# missing from the index, a tensor of the wrong shape and a truncated file.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
command -v python3 >/dev/null 2>&1 || { echo "hf_load.sh: no python3; skipping"; exit 77; }
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
w=$workdir
ckpt="$bindir/meshtrain-ckpt"
check="python3 $abs_top_srcdir/tests/hf/hf_check.py"
unset HF_HUB_CACHE HF_HOME XDG_CACHE_HOME
one="dataset.path=$data step_scheduler.max_steps=1 step_scheduler.local_batch_size=2"

# ---- the fake hub cache
expect_rc 0 "$bindir/meshtrain-dense" --config "$small_cfg" dataset.path="$data" \
    checkpoint.checkpoint_dir="$w/ck" logging.metrics_file="$w/ck.jsonl" step_scheduler.max_steps=10
expect_rc 0 "$ckpt" export "$w/ck/step_00000005" -o "$w/hfA" --max-shard-size 100KB --dtype bfloat16
expect_rc 0 "$ckpt" export "$w/ck/step_00000010" -o "$w/hfB" --max-shard-size 100KB --dtype bfloat16
A=0a1b2c3d4e5f60718293a4b5c6d7e8f901234567
B=fedcba9876543210fedcba9876543210fedcba98
# hub CACHE ORG/NAME REVISION COMMIT SRC: SRC as the snapshot COMMIT that refs/REVISION names
hub() {
    repo="$1/models--$(printf '%s' "$2" | sed 's,/,--,')"
    mkdir -p "$repo/refs" "$repo/snapshots"
    [ -d "$repo/snapshots/$4" ] || cp -r "$5" "$repo/snapshots/$4"
    printf '%s' "$4" > "$repo/refs/$3"
}
hub "$w/cache" org/tiny main $A "$w/hfA"
hub "$w/cache" org/tiny v2 $B "$w/hfB"
# the config without the model section: the model is named instead
sed '/^model:/,/^dataset:/{/^dataset:/!d}' "$small_cfg" > "$w/noshape.yaml"
grep -q hidden_size "$w/noshape.yaml" && fail "noshape.yaml still has the model's shape"

# run CONFIG NAME NP [key=value ...]: 1 step of $app (meshtrain-dense)
app="$bindir/meshtrain-dense"
run() {
    c=$1 name=$2 n=$3; shift 3
    expect_rc 0 np "$n" "$app" --config "$c" $one checkpoint.checkpoint_dir="$w/$name" \
        logging.metrics_file="$w/$name.jsonl" "$@"
    printf '%s\n' "$out" > "$w/$name.log"
}
# named NAME NP [key=value ...]: the same on the config that names no model
named() { run "$w/noshape.yaml" "$@"; }
loaded() { expect_in "$out" "loaded $1: " "$2"; }
same() { compare_losses "$w/$1.jsonl" "$w/$2.jsonl" "$3" 0 0; }
differ() { # the step-1 losses of two runs are not equal
    checks=$((checks + 1))
    python3 -c 'import json,sys; a,b=(json.loads(open(p).readline())["loss"] for p in sys.argv[1:3]); sys.exit(a == b)' \
        "$w/$1.jsonl" "$w/$2.jsonl" || fail "$3: the step-1 losses are equal"
}

# ---- by hub id against import + training from the imported checkpoint
export HF_HUB_CACHE="$w/cache"
snapA="$w/cache/models--org--tiny/snapshots/$A"
expect_rc 0 "$ckpt" import org/tiny -o "$w/impA"
expect_in "$out" "imported $snapA" "import by hub id"
run "$small_cfg" i1 1 checkpoint.resume="$w/impA/step_00000000"
named n1 1 model.pretrained_model_name_or_path=org/tiny
loaded "$snapA" "1 rank: snapshot of refs/main"
expect_in "$out" "21 tensors from 3 safetensors files" "1 rank: every shard"
same i1 n1 "by name = import, 1 rank"
named g1 1 model.pretrained_model_name_or_path=org/tiny distributed.device=cpu_guarded
same n1 g1 "guarded device memory: the weights staged through host copies"
run "$small_cfg" fresh 1
differ fresh n1 "the loaded weights are not the random ones"
for mesh in "tp2|distributed.tp_size=2" \
    "pp2|distributed.pp_size=2 distributed.pipeline.pp_microbatch_size=1" \
    "fsdp2|distributed.strategy=fsdp2" \
    "bf16|distributed.mp_policy.param_dtype=bfloat16 distributed.mp_policy.output_dtype=bfloat16"; do
    m=${mesh%%|*} o=${mesh#*|}
    run "$small_cfg" "i$m" 2 $o checkpoint.resume="$w/impA/step_00000000"
    named "n$m" 2 $o model.pretrained_model_name_or_path=org/tiny
    loaded "$snapA" "$m: loaded"
    same "i$m" "n$m" "by name = import, $m"
done

# ---- by directory, F16 written by an independent writer
$check write "$snapA" "$w/dir16" F16 >/dev/null || fail "hf_check.py write F16"
expect_rc 0 "$ckpt" import "$w/dir16" -o "$w/imp16"
run "$small_cfg" i16 1 checkpoint.resume="$w/imp16/step_00000000"
named d16 1 model.pretrained_model_name_or_path="$w/dir16"
loaded "$w/dir16" "by directory"
same i16 d16 "by directory (F16) = import"

# ---- revisions: a branch, a commit, and the cache each setting chooses
named v2 1 model.pretrained_model_name_or_path=org/tiny model.revision=v2
loaded "$w/cache/models--org--tiny/snapshots/$B" "revision v2"
differ n1 v2 "revision v2 is other weights"
# which snapshot: meshtrain-plan notes what the name resolved to
is() { # WHAT DIR [key=value ...]: the named model resolves to DIR
    what=$1 dir=$2; shift 2
    expect_rc 0 "$bindir/meshtrain-plan" --config "$w/noshape.yaml" --world-size 1 "$@"
    expect_in "$err" "note: model.pretrained_model_name_or_path org/tiny is $dir" "$what"
}
is "revision as a commit" "$w/cache/models--org--tiny/snapshots/$B" \
    model.pretrained_model_name_or_path=org/tiny model.revision=$B
hub "$w/home/hub" org/tiny main $B "$w/hfB"
hub "$w/user/.cache/huggingface/hub" org/tiny main $B "$w/hfB"
home=$HOME
export HF_HOME="$w/home" HOME="$w/user"
is "HF_HUB_CACHE wins over HF_HOME" "$snapA" model.pretrained_model_name_or_path=org/tiny
unset HF_HUB_CACHE
is "HF_HOME/hub without HF_HUB_CACHE" "$w/home/hub/models--org--tiny/snapshots/$B" \
    model.pretrained_model_name_or_path=org/tiny
unset HF_HOME
is "~/.cache/huggingface/hub" "$w/user/.cache/huggingface/hub/models--org--tiny/snapshots/$B" \
    model.pretrained_model_name_or_path=org/tiny
export HF_HUB_CACHE="$w/cache" HOME="$home"

# ---- a Qwen3-MoE by name, ep 2
moe="model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32
 model.norm_topk_prob=true model.qk_norm=true model.mlp_only_layers=0"
expect_rc 0 np 2 "$bindir/meshtrain-moe" --config "$small_cfg" dataset.path="$data" $moe \
    distributed.ep_size=2 checkpoint.checkpoint_dir="$w/ckm" logging.metrics_file="$w/ckm.jsonl" \
    step_scheduler.max_steps=5
expect_rc 0 "$ckpt" export "$w/ckm" -o "$w/hfm" --max-shard-size 60KB --dtype bfloat16
hub "$w/cache" org/tiny-moe main $A "$w/hfm"
expect_rc 0 np 2 "$ckpt" import org/tiny-moe -o "$w/impm"
app="$bindir/meshtrain-moe"
run "$small_cfg" im 2 $moe distributed.ep_size=2 checkpoint.resume="$w/impm/step_00000000"
named nm 2 distributed.ep_size=2 model.pretrained_model_name_or_path=org/tiny-moe
loaded "$w/cache/models--org--tiny-moe/snapshots/$A" "MoE by name"
expect_in "$out" "35 tensors" "every expert"
same im nm "by name = import, MoE ep 2"
app="$bindir/meshtrain-dense"

# ---- model.config: from_config (architecture only, random weights) and inline fields
printf 'model:\n  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_config\n  config:\n    _target_: transformers.AutoConfig.from_pretrained\n    pretrained_model_name_or_path: org/tiny\n' > "$w/fc.yaml"
cat "$w/noshape.yaml" >> "$w/fc.yaml"
run "$w/fc.yaml" fc 1
checks=$((checks + 1))
case "$out" in *"loaded "*) fail "from_config loaded weights: $out" ;; esac
same fresh fc "from_config: the config.json's model, randomly initialised"
{ printf 'model:\n  config:\n    _target_: transformers.LlamaConfig\n    vocab_size: 258\n    hidden_size: 64\n'
  printf '    intermediate_size: 160\n    num_hidden_layers: 2\n    num_attention_heads: 4\n'
  printf '    num_key_value_heads: 2\n    architectures: [LlamaForCausalLM]\n    rope_scaling: null\n'
  printf '    max_position_embeddings: 4096\n'
  cat "$w/noshape.yaml"; } > "$w/inline.yaml"
run "$w/inline.yaml" inl 1
same fresh inl "inline model.config fields"
sed 's/    pretrained_model_name_or_path: org\/tiny/&\n    num_hidden_layers: 1/' "$w/fc.yaml" > "$w/fc1.yaml"
expect_rc 0 "$bindir/meshtrain-plan" --config "$w/fc1.yaml" --world-size 1 --print-config
expect_in "$out" "num_hidden_layers: 1" "model.config fields over its config.json"

# strings of the block are JSON-escaped: the message quotes the value whole
printf 'model:\n  config:\n    model_type: llama\n    hidden_act: "gelu \\"tanh\\"\\\\"\n' > "$w/esc.yaml"
cat "$w/noshape.yaml" >> "$w/esc.yaml"
expect_rc 1 "$bindir/meshtrain-plan" --config "$w/esc.yaml" --world-size 1
expect_in "$err" 'hidden_act gelu "tanh"\ is not supported' "model.config strings escaped"

# ---- explicit keys override config.json, each with a warning
named ov 1 model.pretrained_model_name_or_path=org/tiny model.rope_theta=20000 model.hidden_size=64
expect_in "$err" "warning: override 'model.rope_theta=20000': model.rope_theta = 20000 overrides 10000 from $snapA/config.json" "override warning"
checks=$((checks + 1))
[ "$(printf '%s\n' "$err" | grep -c 'overrides')" -eq 1 ] || fail "a key equal to config.json's was warned about: $err"
differ n1 ov "the override changes the run"

# ---- meshtrain-plan sizes the named model (no weights read)
expect_rc 0 "$bindir/meshtrain-plan" --config "$w/noshape.yaml" --world-size 2 --print-config \
    model.pretrained_model_name_or_path=org/tiny-moe distributed.ep_size=2
expect_in "$out" "is valid for meshtrain-moe on 2 ranks" "plan: the MoE app for the MoE's config.json"
expect_in "$out" "num_experts: 4" "plan: the MoE's config.json"

# ---- refusals on 2 ranks: one message, exit 1, no hang, nothing written
refuse() { # WHAT NEEDLE [key=value ...]
    what=$1 needle=$2; shift 2
    rm -rf "$w/refused"
    expect_rc 1 np 2 "$bindir/meshtrain-dense" --config "$w/noshape.yaml" $one \
        checkpoint.checkpoint_dir="$w/refused" logging.metrics_file="$w/refused.jsonl" \
        checkpoint.save_initial=true "$@"
    expect_in "$err" "$needle" "$what"
    checks=$((checks + 2))
    [ "$(printf '%s\n' "$err" | grep -c 'error on rank')" -eq 1 ] || fail "$what: not one message: $err"
    [ -z "$(ls "$w/refused" 2>/dev/null)" ] || fail "$what: something was written: $(ls "$w/refused")"
}
refuse "no model" "model: no model is named: set model.pretrained_model_name_or_path"
refuse "missing model" "model.pretrained_model_name_or_path 'org/nope': not found on local disk; looked in: org/nope (no such directory); $w/cache/models--org--nope (no such directory)" \
    model.pretrained_model_name_or_path=org/nope
refuse "missing revision" "$w/cache/models--org--tiny/refs/v3 (no such revision)" \
    model.pretrained_model_name_or_path=org/tiny model.revision=v3
cp -r "$snapA" "$w/badjson"
printf '{\n  "architectures": ["LlamaForCausalLM"],\n  "vocab_size": 258,\n}\n' > "$w/badjson/config.json"
refuse "broken config.json" "$w/badjson/config.json:4:1: expected a member name" \
    model.pretrained_model_name_or_path="$w/badjson"
cp -r "$snapA" "$w/noshard" && rm "$w/noshard/model-00002-of-00003.safetensors"
refuse "shard missing" "to model-00002-of-00003.safetensors, which is missing from $w/noshard" \
    model.pretrained_model_name_or_path="$w/noshard"
$check write "$snapA" "$w/shape" F32 reshape=model.norm.weight:8,8 >/dev/null
refuse "wrong shape" "$w/shape/model.safetensors: tensor model.norm.weight has shape [8, 8], expected [64] from config.json" \
    model.pretrained_model_name_or_path="$w/shape"
cp -r "$snapA" "$w/trunc"
f="$w/trunc/model-00003-of-00003.safetensors"
head -c $(($(wc -c < "$f") - 100)) "$f" > "$f.x" && mv "$f.x" "$f"
refuse "truncated" "$f: tensor " model.pretrained_model_name_or_path="$w/trunc"
expect_in "$err" "the file is truncated" "truncated: says so"
expect_rc 1 "$bindir/meshtrain-plan" --config "$w/noshape.yaml" --world-size 2 \
    model.pretrained_model_name_or_path=org/nope
expect_in "$err" "'org/nope': not found on local disk" "plan: missing model"
finish
