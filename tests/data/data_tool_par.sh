#!/bin/sh
# data_tool_par.sh: meshtrain-data under mpiexec: the files are
# byte-identical at 1, 2 and 3 ranks (text to llm.c and Megatron,
# JSON Lines with two keys and a validation split, zstd, SFT with loss
# masks), and a bad record on one rank fails the whole run at 2 ranks:
# every rank exits 1 and prints the message of the first bad record in
# input order, and no file is left, final or temporary.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
data="$bindir/meshtrain-data"
w=$workdir
cd "$w" || exit 99
command -v "$MPIEXEC" >/dev/null 2>&1 || { echo "no MPI launcher ($MPIEXEC)"; exit 77; }

# Enough records for every rank to own several chunks of 64, of
# varied lengths, some multi-byte.
python3 - <<'PY'
import json, random
r = random.Random(7)
words = ["alpha", "beta", "\u00e9t\u00e9", "\u65e5\u672c", "gamma", "\U0001F600", "delta", "x"]
def text(n):
    return " ".join(r.choice(words) for _ in range(n))
with open("c.txt", "w") as f:
    for i in range(700):
        f.write(text(r.randint(1, 30)) + ("\n" if i % 3 else "\n\n"))
with open("c.jsonl", "w") as f:
    for i in range(500):
        f.write(json.dumps({"text": text(r.randint(1, 40)), "title": text(r.randint(1, 4))}) + "\n")
with open("s.jsonl", "w") as f:
    for i in range(400):
        if i % 2:
            rec = {"prompt": text(r.randint(1, 9)) + ": ", "completion": text(r.randint(1, 9))}
        else:
            rec = {"messages": [{"role": "user", "content": text(r.randint(1, 9))},
                                {"role": "assistant", "content": text(r.randint(1, 9))}]}
        f.write(json.dumps(rec) + "\n")
PY
command -v zstd >/dev/null 2>&1 && zstd -q c.jsonl -o c.jsonl.zst

run_all() { # NP: every kind of output under r$NP/
    mkdir -p "r$1"
    expect_rc 0 np "$1" "$data" --quiet --output "r$1/t.bin" c.txt
    expect_rc 0 np "$1" "$data" --quiet --output "r$1/tm" --format megatron --documents lines \
        --split-validation 0.25 c.txt
    expect_rc 0 np "$1" "$data" --quiet --output "r$1/j" --json-keys text,title \
        --split-validation 0.1 c.jsonl
    if [ -f c.jsonl.zst ]; then
        expect_rc 0 np "$1" "$data" --quiet --output "r$1/z" c.jsonl.zst
    fi
    expect_rc 0 np "$1" "$data" --quiet --output "r$1/s" --sft --chat-template chatml s.jsonl
    expect_rc 0 np "$1" "$data" --quiet --output "r$1/v" --vocab-size 70000 c.jsonl
}
run_all 1
run_all 2
run_all 3
checks=$((checks + 1))
n=$(ls r1 | wc -l)
[ "$n" -ge 20 ] || fail "expected at least 20 files from the 1-rank runs, got $n: $(ls r1)"
for f in r1/*; do
    b=$(basename "$f")
    for np in 2 3; do
        checks=$((checks + 1))
        cmp -s "$f" "r$np/$b" || fail "$b differs between 1 and $np ranks"
    done
done
checks=$((checks + 1))
[ -f r1/s.lossmask ] && [ -f r1/j_title_document.val.idx ] && [ -f r1/tm.val.bin ] ||
    fail "missing outputs: $(ls r1)"

# Atomic failure at 2 ranks: records 70 and 140 are bad (chunk 1 and 2:
# ranks 1 and 0 own them), the first in input order is reported.
python3 - <<'PY'
import json
with open("bad.jsonl", "w") as f:
    for i in range(200):
        f.write("{oops\n" if i in (69, 139) else json.dumps({"text": "record %d" % i}) + "\n")
PY
for np in 1 2; do
    expect_rc 1 np "$np" "$data" --quiet --output "bad$np" bad.jsonl
    expect_in "$err" "bad.jsonl:70 (record 70): not a JSON record" "$np ranks: the first bad record"
    if [ "$np" = 2 ]; then
        expect_in "$err" "meshtrain-data: rank 0: bad.jsonl:70" "rank 0 reports"
        expect_in "$err" "meshtrain-data: rank 1: bad.jsonl:70" "rank 1 reports"
    fi
    checks=$((checks + 1))
    ls "bad$np"* ./*.tmp >/dev/null 2>&1 && fail "$np ranks: output left behind: $(ls)"
done
# a failed rerun leaves the earlier dataset as it was
cp r1/j_text_document.bin keep.bin
expect_rc 1 np 2 "$data" --quiet --output r1/j --json-keys text,title bad.jsonl
checks=$((checks + 1))
cmp -s keep.bin r1/j_text_document.bin && [ -f r1/j_title_document.idx ] ||
    fail "a failed run changed or removed the earlier output"
# an unwritable output: every rank fails, nothing left
expect_rc 1 np 2 "$data" --quiet --output no/such/dir/x c.jsonl
expect_in "$err" "cannot create" "unwritable output at 2 ranks"
finish
