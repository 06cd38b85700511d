#!/bin/sh
# data_tool_jsonl.sh: meshtrain-data on JSON Lines: plain and zstd, several
# keys (Megatron's PREFIX_KEY_document naming), the dtype rule at the
# Megatron threshold, tokens read back by an independent reader
# (mtread.py) and by --inspect, invalid UTF-8 (refused with its offset, or
# replaced as Python's decode does), and every bad input: a clear message
# naming file and line, exit 1, and no output file.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
data="$bindir/meshtrain-data"
w=$workdir
here="$abs_top_srcdir/tests/data"
cd "$w" || exit 99

python3 - <<'PY'
import json
recs = [{"text": "Hello, world.", "title": "One"},
        {"text": "Zweite Zeile: \u00fcber, \u65e5\u672c\u8a9e, emoji \U0001F600.", "title": "Two"},
        {"text": "tabs\tand\nnewlines\r\n kept", "title": "Three", "other": 1}]
with open("a.jsonl", "w") as f:
    for r in recs:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
    f.write("\n")  # a blank last line holds no record
json.dump(recs, open("a.expect.json", "w"))
PY

check_docs() { # PREFIX KEY DTYPE: the documents of a.expect.json's KEY
    checks=$((checks + 1))
    python3 - "$here" "$@" <<'PY' || fail "$1 ($2): tokens differ"
import json, sys
sys.path.insert(0, sys.argv[1])
import mtread
prefix, key, dtype = sys.argv[2:5]
want = [mtread.byte_doc(r[key]) for r in json.load(open("a.expect.json"))]
got_dtype, docs = mtread.read_megatron(prefix)
assert got_dtype == dtype, (got_dtype, dtype)
assert docs == want, (docs, want)
PY
}

expect_rc 0 "$data" --output o --json-keys text,title a.jsonl
expect_in "$out" "wrote o_text_document.bin + o_text_document.idx: Megatron-LM indexed dataset" "key text"
expect_in "$out" "wrote o_title_document.bin + o_title_document.idx" "key title"
expect_in "$out" "in 3 documents, uint16 ids" "uint16 below the threshold"
expect_in "$err" "meshtrain-data: 3 records" "progress line"
check_docs o_text_document text uint16
check_docs o_title_document title uint16
# the default key is "text", as Megatron's
expect_rc 0 "$data" --output d a.jsonl
check_docs d_text_document text uint16
# zstd: the same bytes out
zstd_ok=0
if command -v zstd >/dev/null 2>&1; then
    zstd -q a.jsonl -o a.jsonl.zst && zstd_ok=1
fi
checks=$((checks + 1))
[ "$zstd_ok" = 1 ] || fail "no zstd command to compress the test input"
expect_rc 0 "$data" --output z a.jsonl.zst
checks=$((checks + 1))
cmp -s z_text_document.bin d_text_document.bin && cmp -s z_text_document.idx d_text_document.idx ||
    fail "zstd input gives other files"
head -c 20 a.jsonl.zst > cut.jsonl.zst
expect_rc 1 "$data" --output c cut.jsonl.zst
expect_in "$err" "cut.jsonl.zst: truncated zstd stream" "truncated zstd"

# The dtype rule: uint16 below 65500 ids, int32 from 65500 (Megatron's
# DType.optimal_dtype); the reader in src/data reads both.
expect_rc 0 "$data" --output v1 --vocab-size 65499 a.jsonl
expect_in "$out" "uint16 ids" "65499: uint16"
check_docs v1_text_document text uint16
expect_rc 0 "$data" --output v2 --vocab-size 65500 a.jsonl
expect_in "$out" "int32 ids" "65500: int32"
check_docs v2_text_document text int32
expect_rc 0 "$data" --inspect v2_text_document --vocab-size 65500
expect_in "$out" "Megatron-LM indexed dataset (int32 tokens)" "inspect int32"
expect_in "$out" "documents:  3" "inspect int32 documents"
expect_rc 1 "$data" --output v3 --vocab-size 100 a.jsonl
expect_in "$err" "--vocab-size 100 is below the tokenizer's vocabulary of 258" "vocab below"

# Invalid UTF-8: refused with the byte offset; replaced as Python does.
# (overlong forms, a surrogate, above U+10FFFF, cut sequences, stray
# continuation bytes: Python replaces each maximal subpart once)
printf '{"text": "ok"}\n{"text": "bad \377 and \342\202 end \300\200 \340\200\200 \355\240\200 \364\220\200\200 \370\210 \200\277 \360\237\230 \342\202\254"}\n' > bad8.jsonl
expect_rc 1 "$data" --output u bad8.jsonl
expect_in "$err" "bad8.jsonl:2 (record 2): invalid UTF-8 at byte 14 of the line (byte 0xff)" "invalid UTF-8"
expect_in "$err" "--invalid-utf8 replace" "invalid UTF-8 hint"
expect_rc 0 "$data" --output u --invalid-utf8 replace bad8.jsonl
checks=$((checks + 1))
python3 - "$here" <<'PY' || fail "--invalid-utf8 replace differs from Python's decode"
import sys
sys.path.insert(0, sys.argv[1])
import mtread
line = open("bad8.jsonl", "rb").read().split(b"\n")[1]
text = line.decode("utf-8", "replace")[len('{"text": "'):-2]
_, docs = mtread.read_megatron("u_text_document")
assert docs[1] == mtread.byte_doc(text), (docs[1], text)
PY
printf 'caf\303\251 \355\240\200 \360\237\230 x\n' > bad8.txt
expect_rc 1 "$data" --output ut --documents lines bad8.txt
expect_in "$err" "bad8.txt:1 (record 1): invalid UTF-8 at byte 6 of the document (byte 0xed)" "text invalid UTF-8"
expect_rc 0 "$data" --output ut.bin --format megatron --documents lines --invalid-utf8 replace bad8.txt
checks=$((checks + 1))
python3 - "$here" <<'PY' || fail "text --invalid-utf8 replace differs from Python's decode"
import sys
sys.path.insert(0, sys.argv[1])
import mtread
text = open("bad8.txt", "rb").read().rstrip(b"\n").decode("utf-8", "replace")
_, docs = mtread.read_megatron("ut")
assert docs == [mtread.byte_doc(text)], (docs, text)
PY

# Bad records: file, line, what is wrong; nothing written.
bad() { # NAME CONTENT EXPECTED [OPTIONS]
    name=$1 content=$2 message=$3
    shift 3
    printf '%b' "$content" > "$name.jsonl"
    expect_rc 1 "$data" --output "x_$name" "$@" "$name.jsonl"
    expect_in "$err" "$message" "$name"
    checks=$((checks + 1))
    ls x_"$name"* >/dev/null 2>&1 && fail "$name: output left behind: $(ls x_"$name"*)"
}
bad notjson '{"text": "a"}\n{"text": "b"\n' 'notjson.jsonl:2 (record 2): not a JSON record: '
bad array '[1, 2]\n' 'array.jsonl:1 (record 1): the record is not a JSON object'
bad nokey '{"text": "a"}\n\n{"body": "b"}\n' 'nokey.jsonl:3 (record 2): the record has no key "text"'
bad nostring '{"text": 7}\n' 'nostring.jsonl:1 (record 1): "text" is not a string'
bad empty '{"text": "a"}\n{"text": ""}\n' 'empty.jsonl:2 (record 2): empty document: "text" is an empty string'
bad long '{"text": "abc"}\n{"text": "abcd"}\n' 'long.jsonl:2 (record 2): the document has 5 tokens, more than --seq-length 4' --seq-length 4
bad onekey '{"text": "a", "title": "b"}\n{"text": "c"}\n' 'onekey.jsonl:2 (record 2): the record has no key "title"' --json-keys text,title
bad none '\n\n' 'no documents: the input is empty or blank'
expect_rc 1 "$data" --output x missing.jsonl
expect_in "$err" "missing.jsonl: cannot open" "missing input"
expect_rc 2 "$data" --output x a.jsonl bad8.txt
expect_in "$err" "mix JSON Lines and text files" "mixed inputs"
expect_rc 2 "$data" --output x --format llmc a.jsonl
expect_in "$err" "--format llmc takes text input only" "llmc from JSONL"

# Tokenizers: a tokenizer.json of a type meshtrain refuses reaches the user
# with its file name; a model name resolves in the local hub cache.
mkdir -p wp
cat > wp/tokenizer.json <<'EOF'
{"version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
 "post_processor": null, "decoder": null,
 "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
           "max_input_chars_per_word": 100, "vocab": {"[UNK]": 0, "a": 1}}}
EOF
expect_rc 1 "$data" --output x --tokenizer wp/tokenizer.json a.jsonl
expect_in "$err" "meshtrain-data: --tokenizer wp/tokenizer.json: wp/tokenizer.json" "tokenizer error names the file"
case "$err" in
    *WordPiece*|*"not supported by this build"*) ;;
    *) fail "unsupported tokenizer: no reason given: $err" ;;
esac
checks=$((checks + 1))
ls x_* >/dev/null 2>&1 && fail "output left behind after a tokenizer error"
snap="$w/hub/models--acme--tiny/snapshots/0123abc"
mkdir -p "$snap" "$w/hub/models--acme--tiny/refs"
printf '0123abc' > "$w/hub/models--acme--tiny/refs/main"
echo '{"model_type": "llama"}' > "$snap/config.json"
cp wp/tokenizer.json "$snap/"
expect_rc 1 env HF_HUB_CACHE="$w/hub" "$data" --output x --tokenizer acme/tiny a.jsonl
expect_in "$err" "--tokenizer acme/tiny: $snap" "a model name resolves to its snapshot"
expect_rc 1 env HF_HUB_CACHE="$w/hub" "$data" --output x --tokenizer acme/none a.jsonl
expect_in "$err" "--tokenizer" "an unknown name"
expect_in "$err" "acme/none" "an unknown name is named"
checks=$((checks + 1))
ls ./*.tmp >/dev/null 2>&1 && fail "temporary files left behind"
finish
