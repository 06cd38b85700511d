#!/bin/sh
# generate.sh: meshtrain-generate's greedy ids equal an independent float64
# PyTorch greedy decode that recomputes the whole sequence at every step
# (generate_ref.py, over tests/hf/hf_reference.py's model), for tiny random
# Hugging Face models (tests/hf/make_model.py) of a dense Llama, Llama 3.1
# (llama3 RoPE scaling), Qwen2.5 (q/k/v biases), Qwen3 (q/k norm, head_dim
# apart from hidden / heads, BF16 weights), Mistral with a sliding window
# (16) shorter than the 64 positions generated over (its cache holds 48
# rows, so it drops rows before the window), and the MoE families
# Qwen3-MoE (head_dim apart from hidden / heads), Mixtral and OLMoE; a
# one-token prompt too.  The reference with its window removed (a planted bug) must
# differ, so the comparison can fail.  The same models imported as
# checkpoints (meshtrain-ckpt import) give the same ids from --checkpoint,
# latest and --step 0.  Skips (77) without a python3 that imports torch
# (PYTHON_TORCH names one).
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
torch_py=
for py in ${PYTHON_TORCH:-} python3 /usr/bin/python3; do
    if "$py" -c 'import torch' >/dev/null 2>&1; then torch_py=$py; break; fi
done
[ -n "$torch_py" ] || { echo "generate.sh: no python3 with torch; skipping"; exit 77; }
w=$workdir
gen="$bindir/meshtrain-generate"
ref="$torch_py $abs_top_srcdir/tests/app/generate_ref.py"
fams="llama3 llama31 qwen25 qwen3 mistral qwen3_moe mixtral olmoe"
made=
for f in $fams; do made="$made $f $w/$f"; done
expect_rc 0 python3 "$abs_top_srcdir/tests/hf/make_model.py" $made

prompt=3,1,4,1,5,9,2,6
# the jobs: FAMILY PROMPT N [BUG] (BUG: the reference with a planted bug,
# which must differ)
cat > "$w/jobs" <<JOBS
llama3 $prompt 24
llama31 $prompt 24
qwen25 $prompt 24
qwen3 $prompt 24
mistral $prompt 56
qwen3_moe $prompt 24
mixtral $prompt 24
olmoe $prompt 24
llama3 7 12
qwen3 200 12
mistral $prompt 56 no_window
JOBS
specs=$(while read -r f p n b; do printf '%s ' "$w/$f:$p:$n:$b"; done < "$w/jobs")
expect_rc 0 $ref $specs
printf '%s\n' "$out" > "$w/want"
printf '%s\n' "$err"
i=0
while read -r f p n b; do
    i=$((i + 1))
    expected=$(sed -n "${i}p" "$w/want")
    expect_rc 0 "$gen" --model "$w/$f" --prompt-ids "$p" --max-new-tokens "$n" --greedy --print-ids
    checks=$((checks + 1))
    if [ -z "$b" ]; then
        [ -n "$expected" ] && [ "$out" = "$expected" ] || fail "$f, prompt $p: meshtrain-generate gave
  $out
the float64 reference
  $expected"
    else
        [ -n "$expected" ] && [ "$out" != "$expected" ] || fail "$f against the reference with \
the planted bug $b: the same ids ($out), so the comparison cannot tell"
    fi
done < "$w/jobs"

# a checkpoint of the same weights: the same ids, latest and by step (and
# for a MoE model, whose experts are tensors of their own)
expect_rc 0 "$bindir/meshtrain-ckpt" import "$w/qwen3_moe" -o "$w/ckmoe"
expect_rc 0 "$gen" --checkpoint "$w/ckmoe" --prompt-ids $prompt --max-new-tokens 24 --greedy --print-ids
checks=$((checks + 1))
[ "$out" = "$(sed -n 6p "$w/want")" ] || fail "--checkpoint of qwen3_moe gave $out, the reference $(sed -n 6p "$w/want")"
expect_rc 0 "$bindir/meshtrain-ckpt" import "$w/mistral" -o "$w/ck"
expect_rc 0 "$gen" --model "$w/mistral" --prompt-ids $prompt --max-new-tokens 24 --greedy --print-ids
byname=$out
expect_rc 0 "$gen" --checkpoint "$w/ck" --prompt-ids $prompt --max-new-tokens 24 --greedy --print-ids
checks=$((checks + 1))
[ "$out" = "$byname" ] || fail "--checkpoint gave $out, --model $byname"
expect_in "$err" "loaded $w/ck/step_00000000" "the step loaded"
expect_rc 0 "$gen" --checkpoint "$w/ck" --step 0 --prompt-ids $prompt --max-new-tokens 24 \
    --greedy --print-ids
checks=$((checks + 1))
[ "$out" = "$byname" ] || fail "--checkpoint --step 0 gave $out, --model $byname"
finish
