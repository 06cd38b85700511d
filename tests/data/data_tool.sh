#!/bin/sh
# data_tool.sh: meshtrain-data as a user runs it: text to llm.c and
# Megatron files, the three document modes, --split-validation, --inspect
# output (checked against counts made here with wc), the shipped corpus,
# and exit codes 0 ok, 1 error, 2 usage.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
data="$bindir/meshtrain-data"
w=$workdir

# Three paragraphs, one of two lines; blank lines with spaces still split.
printf 'First paragraph.\n\nSecond one,\non two lines.\n   \n\nThird.\n' > "$w/a.txt"
printf 'Another file.\n' > "$w/b.txt"

expect_rc 0 "$data" --output "$w/a.bin" "$w/a.txt"
expect_in "$out" "wrote $w/a.bin: llm.c token file, 50 tokens in 3 documents" "paragraphs"
# 16 + 25 + 6 bytes of text plus 3 EOD tokens: a 1024-byte header and 2 bytes each.
checks=$((checks + 1))
[ "$(wc -c < "$w/a.bin" | tr -d ' ')" -eq $((1024 + 2 * 50)) ] || fail "a.bin size"

expect_rc 0 "$data" --inspect "$w/a.bin"
expect_in "$out" "format:     llm.c token file (version 1, uint16 tokens)" "inspect format"
expect_in "$out" "tokens:     50" "inspect tokens"
expect_in "$out" "documents:  3" "inspect documents"
expect_in "$out" "min token:  10" "inspect min (newline)"
expect_in "$out" "max token:  256" "inspect max (EOD)"
expect_in "$out" 'first 50 tokens: "First paragraph.<|eod|>Second one,\non two lines.<|eod|>Third.<|eod|>"' "inspect decode"

expect_rc 0 "$data" --output "$w/l.bin" --documents lines "$w/a.txt" "$w/b.txt"
expect_in "$out" "in 5 documents" "lines"
expect_rc 0 "$data" --output "$w/f.bin" --documents file "$w/a.txt" "$w/b.txt"
expect_in "$out" "in 2 documents" "whole files"
expect_rc 0 "$data" --inspect "$w/f.bin"
expect_in "$out" 'first 64 tokens: "First paragraph.\n\nSecond one,\non two lines.\n   \n\nThird.\n<|eod|>Another"' "file mode keeps bytes"

# Megatron: PREFIX.bin + PREFIX.idx; --output PREFIX.bin means the same prefix.
expect_rc 0 "$data" --output "$w/m.bin" --format megatron "$w/a.txt"
expect_in "$out" "wrote $w/m.bin + $w/m.idx: Megatron-LM indexed dataset, 50 tokens in 3 documents" "megatron"
checks=$((checks + 1))
# 34-byte header, 12 bytes per sequence, 8 per document index entry.
[ "$(wc -c < "$w/m.idx" | tr -d ' ')" -eq $((34 + 12 * 3 + 8 * 4)) ] || fail "m.idx size"
for p in "$w/m" "$w/m.idx" "$w/m.bin"; do
    expect_rc 0 "$data" --inspect "$p"
    expect_in "$out" "format:     Megatron-LM indexed dataset (uint16 tokens)" "inspect $p"
    expect_in "$out" "documents:  3" "megatron documents via $p"
done

# The last third of the documents goes to a.val.bin.
expect_rc 0 "$data" --output "$w/s.bin" --split-validation 0.34 "$w/a.txt"
expect_in "$out" "wrote $w/s.bin: llm.c token file, 43 tokens in 2 documents" "train part"
expect_in "$out" "wrote $w/s.val.bin: llm.c token file, 7 tokens in 1 documents" "validation part"
expect_rc 0 "$data" --inspect "$w/s.val.bin"
expect_in "$out" 'first 7 tokens: "Third.<|eod|>"' "validation holds the last document"
expect_rc 0 "$data" --output "$w/sm" --format megatron --split-validation 0.5 "$w/a.txt"
expect_in "$out" "wrote $w/sm.val.bin + $w/sm.val.idx" "megatron validation prefix"

# Vocabulary check on inspect.
expect_rc 1 "$data" --inspect "$w/a.bin" --vocab-size 200
expect_in "$err" "$w/a.bin: token 256 at position 16 is >= vocab_size 200" "vocab check"
expect_rc 0 "$data" --inspect "$w/a.bin" --vocab-size 257

# Errors: exit 1 with the file named.
expect_rc 1 "$data" --output "$w/x.bin" "$w/missing.txt"
expect_in "$err" "$w/missing.txt: cannot open" "missing input"
printf '\n  \n' > "$w/blank.txt"
expect_rc 1 "$data" --output "$w/x.bin" "$w/blank.txt"
expect_in "$err" "no documents" "blank input"
expect_rc 1 "$data" --output "$w/x.bin" --split-validation 0.5 "$w/b.txt"
expect_in "$err" "needs at least 2 documents" "split of one document"
head -c 1000 "$w/a.bin" > "$w/cut.bin"
expect_rc 1 "$data" --inspect "$w/cut.bin"
expect_in "$err" "$w/cut.bin: truncated: 1000 bytes, shorter than the 1024-byte llm.c header" "truncated"
expect_rc 1 "$data" --inspect "$w/a.txt"
expect_in "$err" "$w/a.txt: not an llm.c token file (magic" "text is not tokens"
expect_rc 1 "$data" --inspect "$w/nothing.bin"
expect_in "$err" "$w/nothing.bin: cannot open dataset: No such file or directory" "missing dataset"
expect_in "$err" "hint: make token files with meshtrain-data" "missing dataset hint"
expect_rc 1 "$data" --output "$w/no/such/dir/x.bin" "$w/a.txt"
expect_in "$err" "cannot create" "unwritable output"

# Usage: exit 2.
expect_rc 2 "$data"
expect_in "$err" "usage: meshtrain-data" "usage printed"
expect_rc 2 "$data" "$w/a.txt"
expect_in "$err" "--output PATH is required" "no output"
expect_rc 2 "$data" --output "$w/x.bin"
expect_in "$err" "no input files" "no inputs"
expect_rc 2 "$data" --output "$w/x.bin" --format json "$w/a.txt"
expect_in "$err" "--format must be llmc or megatron, got 'json'" "bad format"
expect_rc 2 "$data" --output "$w/x.bin" --documents words "$w/a.txt"
expect_rc 2 "$data" --output "$w/x.bin" --split-validation 1.5 "$w/a.txt"
expect_rc 2 "$data" --output "$w/x.bin" --split-validation abc "$w/a.txt"
expect_rc 2 "$data" --output "$w/x.bin" --bogus "$w/a.txt"
expect_in "$err" "unknown option '--bogus'" "unknown option"
expect_rc 2 "$data" --output
expect_in "$err" "missing value after '--output'" "missing value"
expect_rc 2 "$data" --inspect "$w/a.bin" "$w/a.txt"
expect_rc 0 "$data" --help
expect_in "$out" "--split-validation" "help"
checks=$((checks + 1))
ls "$w"/*.tmp >/dev/null 2>&1 && fail "temporary files left behind"

# The shipped corpus, built by make in the build tree.
corpus="$abs_top_builddir/share/data/tiny-corpus.bin"
if [ -f "$corpus" ]; then
    expect_rc 0 "$data" --inspect "$corpus" --vocab-size 512
    expect_in "$out" "max token:  256" "corpus: bytes and EOD only"
    docs=$(printf '%s\n' "$out" | sed -n 's/^documents: *//p')
    checks=$((checks + 1))
    [ "${docs:-0}" -ge 100 ] || fail "corpus has ${docs:-no} documents, expected at least 100"
else
    fail "$corpus was not built by make"
fi
finish
