#!/bin/sh
# generate_sample.sh: the training log's samples (logging.sample_every_steps,
# doc/generate.md).  A 5-step run of the small byte-vocabulary model with
# samples every 2 steps prints "sample step 2" and "sample step 4" and no
# others; each sample is the text meshtrain-generate writes for the
# checkpoint of that step with the same prompt, greedy, as many tokens
# (control bytes escaped in the log); the samples leave the losses as they
# are without them, bit for bit; under ddp on 2 ranks rank 0 prints one;
# a MoE model's sample too.  meshtrain-generate refuses a corrupt step.  Validation refuses samples where rank 0
# does not hold the whole model (tp 2, ep 2) and where there is no tokenizer (a
# vocabulary below the byte tokenizer's), naming the key.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
command -v python3 >/dev/null 2>&1 || { echo "generate_sample.sh: no python3; skipping"; exit 77; }
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
w=$workdir
gen="$bindir/meshtrain-generate"
run="dataset.path=$data step_scheduler.max_steps=5 step_scheduler.ckpt_every_steps=2
 checkpoint.keep_last_n=0"
expect_rc 0 "$bindir/meshtrain-dense" --config "$small_cfg" $run checkpoint.checkpoint_dir="$w/ck" \
    logging.metrics_file="$w/m.jsonl" logging.sample_every_steps=2 \
    "logging.sample_prompt=The cat" logging.sample_tokens=12
printf '%s\n' "$out" > "$w/log"
expect_rc 0 "$bindir/meshtrain-dense" --config "$small_cfg" $run checkpoint.checkpoint_dir="$w/ck0" \
    logging.metrics_file="$w/m0.jsonl"
compare_losses "$w/m0.jsonl" "$w/m.jsonl" "with samples" 0 0
checks=$((checks + 1))
got=$(grep -o '^sample step [0-9]*' "$w/log" | tr '\n' ' ')
[ "$got" = "sample step 2 sample step 4 " ] || fail "sample lines at the wrong steps: '$got'"
# same.py LOG STEP IDS: LOG's one sample line of STEP is the text of IDS
# (byte tokenizer), escaped as the log escapes it
cat > "$w/same.py" <<'PY'
import sys
log, step, ids = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
text = bytes(i for i in ids if i < 256)  # the byte tokenizer; 256, 257 are special
esc = b"".join({10: b"\\n", 9: b"\\t", 92: b"\\\\"}.get(c, b"\\x%02x" % c if c < 32 or c == 127
               else bytes([c])) for c in text)
want = b"sample step " + step.encode() + b": " + esc
lines = [l for l in open(log, "rb").read().split(b"\n") if l.startswith(b"sample step " + step.encode() + b":")]
if lines != [want]:
    print("log: %r\nmeshtrain-generate: %r" % (lines, want))
    sys.exit(1)
PY
for step in 2 4; do
    expect_rc 0 "$gen" --checkpoint "$w/ck" --step $step --prompt "The cat" --greedy \
        --max-new-tokens 12 --print-ids
    checks=$((checks + 1))
    python3 "$w/same.py" "$w/log" "$step" "$out" || fail "step $step: the sample is not meshtrain-generate's text"
done
# a corrupt step is refused by its manifest, by --step and as the latest
mkdir -p "$w/bad" && cp -r "$w/ck/step_00000002" "$w/bad/"
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 255; open(p, "wb").write(b)' "$w/bad/step_00000002/model.h5"
expect_rc 1 "$gen" --checkpoint "$w/bad" --step 2 --prompt-ids 1
expect_in "$err" "SHA-256 mismatch" "a corrupt --step"
expect_rc 1 "$gen" --checkpoint "$w/bad" --prompt-ids 1
expect_in "$err" "holds no complete checkpoint" "a corrupt latest"
# data parallelism (ddp, 2 ranks): rank 0 holds the whole model; its
# sample is the step-2 checkpoint's text
expect_rc 0 np 2 "$bindir/meshtrain-dense" --config "$small_cfg" dataset.path="$data" \
    step_scheduler.max_steps=2 distributed.strategy=ddp checkpoint.checkpoint_dir="$w/ddp" \
    logging.metrics_file="$w/ddp.jsonl" logging.sample_every_steps=2 \
    "logging.sample_prompt=The cat" logging.sample_tokens=12
printf '%s\n' "$out" > "$w/ddp.log"
checks=$((checks + 1))
[ "$(grep -c '^sample step 2:' "$w/ddp.log")" -eq 1 ] || fail "ddp: not one sample line (one rank prints)"
expect_rc 0 "$gen" --checkpoint "$w/ddp" --step 2 --prompt "The cat" --greedy --max-new-tokens 12 \
    --print-ids
checks=$((checks + 1))
python3 "$w/same.py" "$w/ddp.log" 2 "$out" || fail "ddp: the sample is not meshtrain-generate's text"
# a MoE model (meshtrain-moe): the sample routes a token at a time
moe="model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32"
expect_rc 0 "$bindir/meshtrain-moe" --config "$small_cfg" dataset.path="$data" $moe \
    step_scheduler.max_steps=2 checkpoint.checkpoint_dir="$w/moe" logging.metrics_file="$w/moe.jsonl" \
    logging.sample_every_steps=2 "logging.sample_prompt=The cat" logging.sample_tokens=12
printf '%s\n' "$out" > "$w/moe.log"
expect_rc 0 "$gen" --checkpoint "$w/moe" --step 2 --prompt "The cat" --greedy --max-new-tokens 12 \
    --print-ids
checks=$((checks + 1))
python3 "$w/same.py" "$w/moe.log" 2 "$out" || fail "moe: the sample is not meshtrain-generate's text"
expect_rc 1 np 2 "$bindir/meshtrain-moe" --config "$small_cfg" --dry-run $moe distributed.ep_size=2 \
    logging.sample_every_steps=5
expect_in "$out$err" "samples need every expert on rank 0; ep_size 2 shards them" "ep 2"
expect_rc 1 np 2 "$bindir/meshtrain-dense" --config "$small_cfg" --dry-run distributed.tp_size=2 \
    logging.sample_every_steps=5
expect_in "$out$err" "logging.sample_every_steps: samples need the whole model on rank 0" "tp 2"
expect_rc 1 "$bindir/meshtrain-dense" --config "$small_cfg" --dry-run model.vocab_size=200 \
    logging.sample_every_steps=5
expect_in "$out$err" "no tokenizer for the samples" "vocabulary 200"
finish
