#!/bin/sh
# recipes.sh: every recipe YAML of an AutoModel checkout through
# meshtrain-plan at the world size it is launched on, against a local
# Hugging Face cache that holds only config.json files
# (bench/recipes_cache.py), and the counts by outcome.  Not part of
# `make check`: it needs a checkout of NVIDIA-NeMo/Automodel.
#
#   bench/recipes.sh AUTOMODEL_DIR [MESHTRAIN_PLAN] [--list]
#
# World size: the recipe's own "--nproc-per-node N" (times "--nnodes M"),
# else the product of its numeric distributed sizes, else 8.  The LLM
# subset is the recipes whose model is one the cache holds (Llama 3.x,
# Qwen2/2.5/3, Qwen3-MoE, Mistral, Mixtral).  --list prints one line per
# recipe: outcome, world size, path, first message line.
set -u
dir=${1:?usage: recipes.sh AUTOMODEL_DIR [MESHTRAIN_PLAN] [--list]}
here=$(cd "$(dirname "$0")" && pwd)
plan=${2:-meshtrain-plan}
list=${3:-}
[ "$plan" = --list ] && { plan=meshtrain-plan; list=--list; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
python3 "$here/recipes_cache.py" "$tmp/hub" || exit 1
python3 "$here/recipes_cache.py" --list > "$tmp/models"
export HF_HUB_CACHE="$tmp/hub" HF_HUB_OFFLINE=1

find "$dir/examples" "$dir/tests/functional_tests" "$dir/tutorials" -name '*.yaml' 2>/dev/null |
    sort > "$tmp/files"
: > "$tmp/results"
while IFS= read -r f; do
    n=$(grep -o 'nproc[-_]per[-_]node[ =]*[0-9][0-9]*' "$f" | head -1 | grep -o '[0-9]*$')
    m=$(grep -o 'nnodes[ =]*[0-9][0-9]*' "$f" | head -1 | grep -o '[0-9]*$')
    if [ -z "$n" ]; then
        n=1
        for k in dp_size tp_size pp_size cp_size; do
            v=$(grep -E "^  $k: *[0-9]+ *(#.*)?$" "$f" | head -1 | grep -oE '[0-9]+' | head -1)
            [ -n "$v" ] && [ "$v" -gt 0 ] && n=$((n * v))
        done
        [ "$n" -le 1 ] && n=8
    fi
    w=$((n * ${m:-1}))
    per=$n
    [ "$per" -gt 8 ] && per=8
    "$plan" --config "$f" --world-size "$w" --ranks-per-node "$per" >/dev/null 2>"$tmp/err"
    rc=$?
    llm=other
    name=$(grep -E '^\s*pretrained_model_name_or_path:' "$f" | head -1 | sed 's/.*: *//; s/["'\'' ]//g; s/#.*//')
    # an LLM recipe: a model the cache holds, trained by next-token prediction
    grep -qxF "$name" "$tmp/models" &&
        ! grep -qE '^recipe:.*(Distill|Eagle|DFlash|DSpark|Encoder|Classification|VLM|Diffusion)' "$f" &&
        llm=llm
    if [ $rc -eq 0 ]; then
        out=plans
        msg=$(grep -m1 'training refuses' "$tmp/err" | sed 's/.*training refuses it: //')
        [ -n "$msg" ] && out=plans-data-refused
    else
        out=refused
        grep -v '^note:\|ignored (AutoModel\|^warning:\|is not valid for\|^distributed.device: auto is' \
            "$tmp/err" > "$tmp/why"
        msg=$(head -1 "$tmp/why")
        [ "$(grep -c . "$tmp/why")" -gt 3 ] && out=refused-over-3-lines
    fi
    # the message without file and line, for counting by reason
    reason=$(printf '%s' "$msg" | sed -E 's#^[^ ]*\.yaml:[0-9]+:[0-9]+: ##; s#^line [0-9]+: ##; s#(_target_ |model |recipe )[^ :]*#\1X#; s#[0-9]+#N#g' | cut -c1-110)
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$llm" "$out" "$w" "$f" "$reason" "$msg" >> "$tmp/results"
done < "$tmp/files"

if [ "$list" = --list ]; then
    cut -f1-4,6 "$tmp/results"
    echo
fi
total=$(wc -l < "$tmp/results")
for subset in all llm; do
    if [ $subset = all ]; then sel=$(cat "$tmp/results"); else sel=$(grep '^llm	' "$tmp/results"); fi
    k=$(printf '%s\n' "$sel" | grep -c .)
    printf '%s recipes (%s): %s\n' "$k" "$subset" \
        "$(printf '%s\n' "$sel" | cut -f2 | sort | uniq -c | sort -rn | awk '{printf "%s%s %s", s, $1, $2; s=", "}')"
    printf '%s\n' "$sel" | grep -v '	plans	' | cut -f2,5 | sort | uniq -c | sort -rn | head -40 |
        sed 's/^/   /'
done
echo "($total recipe files under $dir)"
