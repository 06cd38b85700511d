#!/bin/sh
# rope_tables.sh: the model's RoPE tables (model_rope.c) against an
# independent float64 computation of transformers' rope initialisation
# formulas (rope_tables.py): every inverse frequency and attention factor
# that test_rope_tables --tables prints (llama3 with Llama 3.1's numbers,
# linear, dynamic NTK below, at and above max_position_embeddings, yarn as
# Qwen, DeepSeek and gpt-oss set it, ...) within 1e-12 relative.  The
# comparison is seen to fail: one llama3 frequency moved by 1e-9 and one
# yarn attention factor by 1e-9 are each caught.  Skips (77) without
# python3.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
command -v python3 >/dev/null 2>&1 || { echo "rope_tables.sh: no python3; skipping"; exit 77; }
prog="$abs_top_builddir/tests/model/test_rope_tables"
check="python3 $abs_top_srcdir/tests/model/rope_tables.py"

expect_rc 0 "$prog" --tables
cp "$workdir/out" "$workdir/tables"
expect_rc 0 sh -c "$check < '$workdir/tables'"
echo "$out"
expect_in "$out" "0 beyond" "the tables agree with transformers' formulas"

# planted: the comparison must see a 1e-9 change of one value
awk 'BEGIN { c = "" } $1 == "case" { c = $2 }
     c == "llama3.1" && $1 == "inv" && $2 == 40 { printf "inv 40 %.17g\n", $3 * (1 + 1e-9); next }
     { print }' "$workdir/tables" > "$workdir/moved"
expect_rc 1 sh -c "$check < '$workdir/moved'"
expect_in "$out" "llama3.1: inv_freq[40]" "a moved llama3 frequency is caught"
awk 'BEGIN { c = "" } $1 == "case" { c = $2 }
     c == "yarn-qwen" && $1 == "att" { printf "att %.17g\n", $2 * (1 + 1e-9); next }
     { print }' "$workdir/tables" > "$workdir/moved"
expect_rc 1 sh -c "$check < '$workdir/moved'"
expect_in "$out" "yarn-qwen: attention factor" "a moved yarn attention factor is caught"
finish
