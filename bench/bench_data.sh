#!/bin/sh
# bench_data.sh: meshtrain-data's throughput (make bench-data;
# doc/performance.md): MB/s of input at 1 and 2 ranks, on a generated
# JSON Lines corpus (BENCH_DATA_MB, default 64 MB, of words from the
# shipped corpus), plain and zstd-compressed, with the byte tokenizer or
# BENCH_TOKENIZER (a tokenizer.json, its directory or a model name).  Best
# of REPEATS (default 3) wall times; the 1- and 2-rank outputs are checked
# to be identical.  Not a test: figures depend on the machine.
set -e
: "${srcdir:=.}"
: "${MPIEXEC:=mpiexec}"
: "${MPIEXEC_NP:=-n}"
: "${REPEATS:=3}"
: "${BENCH_DATA_MB:=64}"
: "${BENCH_TOKENIZER:=byte}"
data=${MESHTRAIN_DATA:-apps/meshtrain-data}
dir=${BENCH_DATA_DIR:-bench-data}
mkdir -p "$dir"
corpus="$dir/corpus.jsonl"
if [ ! -f "$corpus" ] || [ "$(cat "$dir/corpus.mb" 2>/dev/null)" != "$BENCH_DATA_MB" ]; then
    python3 - "$srcdir/share/data/tiny-corpus.txt" "$corpus" "$BENCH_DATA_MB" <<'PY'
import json, random, sys
words = open(sys.argv[1]).read().split()
r, target, n = random.Random(1), int(sys.argv[3]) * 10**6, 0
with open(sys.argv[2], "w") as f:
    while n < target:
        line = json.dumps({"text": " ".join(r.choice(words) for _ in range(r.randint(20, 400)))}) + "\n"
        f.write(line)
        n += len(line)
PY
    echo "$BENCH_DATA_MB" > "$dir/corpus.mb"
    if command -v zstd >/dev/null 2>&1; then zstd -q -f "$corpus" -o "$corpus.zst"; fi
fi
bytes=$(wc -c < "$corpus" | tr -d ' ')
best() { # NP INPUT OUT: the best wall time of REPEATS runs
    b=
    for _ in $(seq "$REPEATS"); do
        t0=$(date +%s.%N)
        "$MPIEXEC" $MPIEXEC_NP "$1" "$data" --quiet --tokenizer "$BENCH_TOKENIZER" \
            --output "$3" "$2" >/dev/null
        t=$(echo "$(date +%s.%N) - $t0" | bc)
        if [ -z "$b" ] || [ "$(echo "$t < $b" | bc)" = 1 ]; then b=$t; fi
    done
    echo "$b"
}
echo "bench_data: $(echo "scale=1; $bytes / 1000000" | bc) MB of JSON Lines, tokenizer $BENCH_TOKENIZER, best of $REPEATS"
for input in "$corpus" "$corpus.zst"; do
    [ -f "$input" ] || continue
    t1=$(best 1 "$input" "$dir/o1")
    t2=$(best 2 "$input" "$dir/o2")
    cmp -s "$dir/o1_text_document.bin" "$dir/o2_text_document.bin" &&
        cmp -s "$dir/o1_text_document.idx" "$dir/o2_text_document.idx" ||
        { echo "bench_data: 1- and 2-rank outputs differ" >&2; exit 1; }
    printf '%-12s 1 rank: %6.2f s %7.1f MB/s   2 ranks: %6.2f s %7.1f MB/s   speed-up %.2f\n' \
        "$(basename "$input")" "$t1" "$(echo "$bytes / 1000000 / $t1" | bc -l)" \
        "$t2" "$(echo "$bytes / 1000000 / $t2" | bc -l)" "$(echo "$t1 / $t2" | bc -l)"
done
