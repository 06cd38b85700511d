#!/bin/sh
# generate_args.sh: meshtrain-generate's arguments and sampling, on a tiny
# random Llama (tests/hf/make_model.py; no torch needed).
#  - sampling: the same seed gives the same ids, another seed others;
#    --top-k 1, a tiny --top-p and --temperature 0 give --greedy's ids;
#    --stop-id ends the text at that token; --max-new-tokens counts;
#  - text: --tokenizer byte encodes --prompt and --prompt-file alike and
#    prints text; without a tokenizer.json a text prompt is refused unless
#    --tokenizer byte, while --prompt-ids with --print-ids needs none; the
#    model directory's tokenizer.json is the default;
#  - refusals, each with its message: an unknown argument, no model, two
#    sources, no prompt, a bad --prompt-ids, an id outside the vocabulary,
#    a bad --top-p / --temperature / --max-new-tokens, a missing
#    checkpoint directory, a missing step, a missing model, and a launch on 2 ranks (both exit 2, one message).
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
command -v python3 >/dev/null 2>&1 || { echo "generate_args.sh: no python3; skipping"; exit 77; }
w=$workdir
gen="$bindir/meshtrain-generate"
expect_rc 0 python3 "$abs_top_srcdir/tests/hf/make_model.py" llama3 "$w/m"
ids="--model $w/m --prompt-ids 5,6,7 --max-new-tokens 16 --print-ids"

# ---- sampling
expect_rc 0 "$gen" $ids --greedy; greedy=$out
expect_rc 0 "$gen" $ids --seed 7 --temperature 1.5; s7=$out
expect_rc 0 "$gen" $ids --seed 7 --temperature 1.5
checks=$((checks + 1)); [ "$out" = "$s7" ] || fail "seed 7 twice: $s7 then $out"
expect_rc 0 "$gen" $ids --seed 8 --temperature 1.5
checks=$((checks + 1)); [ "$out" != "$s7" ] || fail "seeds 7 and 8 gave the same ids $out"
checks=$((checks + 1)); [ "$s7" != "$greedy" ] || fail "temperature 1.5 gave greedy's ids"
for opt in "--top-k 1" "--top-p 1e-9" "--temperature 0"; do
    expect_rc 0 "$gen" $ids --seed 3 $opt
    checks=$((checks + 1)); [ "$out" = "$greedy" ] || fail "$opt: $out, greedy $greedy"
done
n=$(printf '%s\n' "$greedy" | awk -F, '{print NF}')
checks=$((checks + 1)); [ "$n" -eq 16 ] || fail "16 new tokens asked, $n printed: $greedy"
third=$(printf '%s' "$greedy" | cut -d, -f3)
first3=$(printf '%s' "$greedy" | cut -d, -f1-3)
expect_rc 0 "$gen" $ids --greedy --stop-id "$third"
checks=$((checks + 1))
case ",$(printf '%s' "$greedy" | cut -d, -f1-2)," in *",$third,"*) ;; *)
    [ "$out" = "$first3" ] || fail "--stop-id $third: $out, expected $first3" ;; esac

# ---- text
expect_rc 0 "$gen" --model "$w/m" --tokenizer byte --prompt "Hello" --max-new-tokens 8 --greedy
text=$out
printf 'Hello' > "$w/p.txt"
expect_rc 0 "$gen" --model "$w/m" --tokenizer byte --prompt-file "$w/p.txt" --max-new-tokens 8 --greedy
checks=$((checks + 1)); [ "$out" = "$text" ] || fail "--prompt-file: '$out', --prompt: '$text'"
expect_rc 0 "$gen" --model "$w/m" --tokenizer byte --prompt-ids 72,101,108,108,111 \
    --max-new-tokens 8 --greedy --print-ids
want=$(python3 -c 'import sys; print(bytes(int(x) for x in sys.argv[1].split(",")).decode("latin-1"))' "$out")
checks=$((checks + 1))
[ "$(printf '%s' "$text" | od -An -tx1)" = "$(printf '%s' "$want" | python3 -c 'import sys; sys.stdout.buffer.write(sys.stdin.read().encode("latin-1"))' | od -An -tx1)" ] ||
    fail "the text is not the bytes of the ids: '$text' vs ids $out"
expect_rc 1 "$gen" --model "$w/m" --prompt "Hello"
expect_in "$err" "no tokenizer: $w/m has no tokenizer.json and its vocabulary (256) is not the byte tokenizer's (258)" "no tokenizer"
expect_in "$err" "--tokenizer byte" "the hint"

# the default tokenizer is the model directory's tokenizer.json (this one
# is not a usable file: its error names it); --tokenizer byte overrides it
cp -r "$w/m" "$w/m2"
printf '{}\n' > "$w/m2/tokenizer.json"
expect_rc 1 "$gen" --model "$w/m2" --prompt "Hello" --max-new-tokens 2
expect_in "$err" "$w/m2/tokenizer.json" "the directory's tokenizer.json is the default"
expect_rc 0 "$gen" --model "$w/m2" --tokenizer byte --prompt "Hello" --max-new-tokens 8 --greedy
checks=$((checks + 1)); [ "$out" = "$text" ] || fail "--tokenizer byte over tokenizer.json: '$out', '$text'"

# ---- refusals
bad() { want_rc=$1 msg=$2; shift 2; expect_rc "$want_rc" "$gen" "$@"; expect_in "$err" "$msg" "$*"; }
bad 2 "unknown argument '--frobnicate'" --frobnicate
bad 2 "no model: pass --checkpoint DIR or --model NAME_OR_DIR" --prompt-ids 1
bad 2 "--checkpoint and --model both given" --model "$w/m" --checkpoint "$w/ck" --prompt-ids 1
bad 2 "pass exactly one of --prompt, --prompt-file, --prompt-ids" --model "$w/m"
bad 2 "pass exactly one of" --model "$w/m" --prompt x --prompt-ids 1
bad 2 "--prompt-ids '1,x': entry 1 is not a token id" --model "$w/m" --prompt-ids 1,x
bad 2 "top_p 0: in (0, 1]" --model "$w/m" --prompt-ids 1 --top-p 0
bad 2 "temperature -1" --model "$w/m" --prompt-ids 1 --temperature -1
bad 2 "--max-new-tokens '0': expected an integer >= 1" --model "$w/m" --prompt-ids 1 --max-new-tokens 0
bad 2 "--step goes with --checkpoint" --model "$w/m" --prompt-ids 1 --step 3
bad 1 "prompt token 1 is id 256, outside the model's vocabulary [0, 256)" $ids --prompt-ids 3,256
bad 1 "--checkpoint $w/none: no such directory" --checkpoint "$w/none" --prompt-ids 1
mkdir -p "$w/empty"
bad 1 "holds no complete checkpoint" --checkpoint "$w/empty" --prompt-ids 1
bad 1 "has no step 7" --checkpoint "$w/empty" --step 7 --prompt-ids 1
bad 1 "$w/nomodel" --model "$w/nomodel" --prompt-ids 1
expect_rc 2 np 2 "$gen" --model "$w/m" --prompt-ids 1
expect_in "$err" "runs on one rank, launched on 2" "2 ranks"
checks=$((checks + 1))
[ "$(printf '%s\n' "$err" | grep -c 'runs on one rank')" -eq 1 ] || fail "2 ranks: not one message: $err"
finish
