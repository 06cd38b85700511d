#!/bin/sh
# shipped_configs.sh: every config under share/configs validates at the
# scale its header names, and the tiny one builds a mesh on 1, 2 and 4
# real ranks (dense app, --dry-run); moe-tiny and cp-tiny do the same with
# their apps on 2 ranks.  Every config under share/configs must be listed.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
plan="$bindir/meshtrain-plan"
# name, world size, ranks per node: the scale each config's header names
shipped="tiny 8 4|llama3-8b-fsdp2-tp8 16 8|llama3-70b-tp8-pp4 64 8|moe-ep16 16 8|long-context-cp8 8 8
moe-tiny 4 4|cp-tiny 4 4|llama3.2-1b-fsdp2 8 8|llama3.1-8b-fsdp2-tp4 8 8|qwen3-14b-tp4-pp2 16 8
llama3.1-405b-tp8-pp8 256 8|olmoe-1b-7b-ep8 8 8|qwen3-30b-a3b-ep8 16 8
qwen3-235b-a22b-pp8-ep8 128 8|llama3.1-8b-128k-cp8 16 8|qwen3-8b-by-name 16 8
llama3-8b-from-config 16 8"
# the configs that name a model by hub id find its config.json (as
# published) in a hub cache: models--ORG--NAME/refs/main and its snapshot
hub() { # ORG/NAME JSON
    r="$workdir/hub/models--$(printf '%s' "$1" | sed 's,/,--,')"
    mkdir -p "$r/refs" "$r/snapshots/0123456789abcdef0123456789abcdef01234567"
    printf '0123456789abcdef0123456789abcdef01234567' > "$r/refs/main"
    printf '%s\n' "$2" > "$r/snapshots/0123456789abcdef0123456789abcdef01234567/config.json"
}
hub Qwen/Qwen3-8B '{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
 "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
 "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 40960,
 "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": null, "attention_bias": false,
 "use_sliding_window": false, "sliding_window": null, "tie_word_embeddings": false}'
hub meta-llama/Meta-Llama-3-8B '{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
 "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
 "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
 "attention_bias": false, "mlp_bias": false, "tie_word_embeddings": false}'
export HF_HUB_CACHE="$workdir/hub"
IFS='|
'
for c in $shipped; do
    IFS=' '
    set -- $c
    expect_rc 0 "$plan" --config "$configs/$1.yaml" --world-size "$2" --ranks-per-node "$3"
    expect_in "$out" "is valid" "$1 at $2 ranks"
    # the scale the header names is the one checked here
    checks=$((checks + 1))
    grep -q -- "--world-size $2 --ranks-per-node $3\|--world-size $2\$" "$configs/$1.yaml" ||
        [ "$1" = tiny ] || fail "$1.yaml: its header does not name --world-size $2"
done
unset IFS
for f in "$configs"/*.yaml; do
    checks=$((checks + 1))
    case "|$(printf '%s' "$shipped" | tr '\n' '|')" in
        *"|$(basename "$f" .yaml) "*) ;;
        *) fail "$(basename "$f") is shipped but not checked here" ;;
    esac
done
for np in 1 2 4; do
    expect_rc 0 timeout 120 "$MPIEXEC" $MPIEXEC_NP "$np" "$bindir/meshtrain-dense" \
        --config "$configs/tiny.yaml" --dry-run
    expect_in "$out" "the config and the $np-rank mesh are valid" "tiny dry run on $np"
done
for app in moe cp; do
    expect_rc 0 timeout 120 "$MPIEXEC" $MPIEXEC_NP 2 "$bindir/meshtrain-$app" \
        --config "$configs/$app-tiny.yaml" --dry-run
    expect_in "$out" "meshtrain-$app: dry run: the config and the 2-rank mesh are valid" "$app-tiny dry run"
done
finish
