#!/bin/sh
# data_tool_sft.sh: meshtrain-data --sft: prompt/completion records (the
# mask as NeMo AutoModel builds it: the prompt's tokens 0, the rest and
# the appended EOS 1) and chat messages rendered with the Llama 3 and
# ChatML templates, tokens and loss masks checked against an independent
# rendering here (Python, byte tokenizer); the .lossmask format (magic,
# count, 0/1 bytes, size); the bad records; and meshtrain-dense training
# on the masks written (dataset.loss_mask required).
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
data="$bindir/meshtrain-data"
w=$workdir
here="$abs_top_srcdir/tests/data"
cd "$w" || exit 99

python3 - <<'PY'
import json
recs = [
    {"prompt": "Translate to French: cat\n", "completion": "chat"},
    {"messages": [{"role": "system", "content": "You answer briefly."},
                  {"role": "user", "content": "  What is 2+2?\n"},
                  {"role": "assistant", "content": "\u00a04 \u3000"},
                  {"role": "user", "content": "And 3+3?"},
                  {"role": "assistant", "content": "6, caf\u00e9 \U0001F600\n\n"}]},
    {"prompt": "", "completion": "only an answer"},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "hello"}], "prompt": "ignored"},
]
with open("s.jsonl", "w") as f:
    for r in recs:
        f.write(json.dumps(r) + "\n")
PY

# The expected ids and mask of each record, rendered independently.
check() { # PREFIX TEMPLATE
    checks=$((checks + 1))
    python3 - "$here" "$@" <<'PY' || fail "$1 ($2): tokens or mask differ"
import json, sys
sys.path.insert(0, sys.argv[1])
import mtread
prefix, tmpl = sys.argv[2:4]
EOS = 256
def enc(s, m):
    b = list(s.encode("utf-8"))
    return b, [m] * len(b)
def render(r):
    ids, mask = [], []
    def add(s, m):
        a, b = enc(s, m)
        ids.extend(a)
        mask.extend(b)
    if "messages" not in r:
        add(r["prompt"], 0)
        add(r["completion"], 1)
    else:
        msgs = r["messages"]
        for i, m in enumerate(msgs):
            a = int(m["role"] == "assistant")
            if tmpl == "llama3":
                add("<|start_header_id|>" + m["role"] + "<|end_header_id|>\n\n", 0)
                add(m["content"].strip(), a)
                add("<|eot_id|>", a)
            else:
                add("<|im_start|>" + m["role"] + "\n", 0)
                add(m["content"], a)
                add("<|im_end|>", a)
                if i + 1 < len(msgs):
                    add("\n", 0)
    ids.append(EOS)
    mask.append(1)
    return ids, mask
want = [render(json.loads(l)) for l in open("s.jsonl")]
_, docs = mtread.read_megatron(prefix)
mask = mtread.read_mask(prefix + ".lossmask", sum(len(d) for d in docs))
assert len(docs) == len(want), (len(docs), len(want))
at = 0
for k, (d, (ids, m)) in enumerate(zip(docs, want)):
    assert d == ids, (k, bytes(x for x in d if x < 256), bytes(x for x in ids if x < 256))
    assert mask[at:at + len(d)] == m, (k, mask[at:at + len(d)], m)
    at += len(d)
print(prefix, "ok:", len(docs), "records,", at, "tokens,", sum(mask), "in the loss")
PY
}

expect_rc 0 "$data" --output l --sft --chat-template llama3 s.jsonl
expect_in "$out" "wrote l.bin + l.idx + l.lossmask: Megatron-LM indexed dataset" "llama3 output"
check l llama3
expect_rc 0 "$data" --output c.bin --sft --chat-template chatml s.jsonl
expect_in "$out" "wrote c.bin + c.idx + c.lossmask" "chatml output (PREFIX.bin names the prefix)"
check c chatml
expect_rc 0 "$data" --inspect l
expect_in "$out" 'first 64 tokens: "Translate to French: cat\nchat<|eod|><|start_header_id|>system<|end_hea"' "inspect reads it"
# the validation part gets its own mask
expect_rc 0 "$data" --output sv --sft --chat-template chatml --split-validation 0.5 s.jsonl
expect_in "$out" "wrote sv.val.bin + sv.val.idx + sv.val.lossmask" "validation mask"
checks=$((checks + 1))
python3 - "$here" <<'PY' || fail "train + validation masks are not the whole mask"
import sys
sys.path.insert(0, sys.argv[1])
import mtread
def mask(p):
    _, d = mtread.read_megatron(p)
    return mtread.read_mask(p + ".lossmask", sum(map(len, d)))
assert mask("sv") + mask("sv.val") == mask("c")
PY
# the mask file's exact layout
checks=$((checks + 1))
python3 - <<'PY' || fail "lossmask layout"
import os, struct
b = open("c.lossmask", "rb").read()
n = struct.unpack("<Q", b[8:16])[0]
assert b[:8] == b"MTLMASK1" and os.path.getsize("c.lossmask") == 16 + n
assert n * 2 == os.path.getsize("c.bin"), (n, os.path.getsize("c.bin"))
PY

# Without --chat-template the tokenizer's template decides; the byte
# tokenizer has none, and prompt/completion records need none.
expect_rc 1 "$data" --output x --sft s.jsonl
expect_in "$err" "has no chat template to render \"messages\" with; pass --chat-template llama3 or chatml" "no template"
head -1 s.jsonl > pc.jsonl
expect_rc 0 "$data" --output pc --sft pc.jsonl
printf '{"question": "q", "answer": "a"}\n' > keys.jsonl
expect_rc 0 "$data" --output k --sft --prompt-key question --completion-key answer keys.jsonl
expect_rc 2 "$data" --output x --sft --chat-template jinja s.jsonl
expect_in "$err" "--chat-template must be auto, llama3 or chatml" "other templates refused by name"

bad() { # NAME CONTENT MESSAGE [OPTIONS]
    name=$1 content=$2 message=$3
    shift 3
    printf '%s\n' "$content" > "$name.jsonl"
    expect_rc 1 "$data" --output "x_$name" --sft --chat-template chatml "$@" "$name.jsonl"
    expect_in "$err" "$message" "$name"
    checks=$((checks + 1))
    ls x_"$name"* >/dev/null 2>&1 && fail "$name: output left behind"
}
bad neither '{"text": "a"}' 'neither.jsonl:1 (record 1): the record has neither "messages" nor "prompt" and "completion"'
bad nocompletion '{"prompt": "a"}' 'nocompletion.jsonl:1 (record 1): the record has no key "completion"'
bad emptycompletion '{"prompt": "a", "completion": ""}' 'emptycompletion.jsonl:1 (record 1): empty document: "completion" is an empty string'
bad lastuser '{"messages": [{"role": "user", "content": "a"}]}' 'lastuser.jsonl:1 (record 1): the last message is "user", not "assistant"'
bad role '{"messages": [{"role": "tool", "content": "a"}, {"role": "assistant", "content": "b"}]}' 'role.jsonl:1 (record 1): message 0 has role "tool"'
bad nocontent '{"messages": [{"role": "assistant"}]}' 'nocontent.jsonl:1 (record 1): message 0 has no key "content"'
bad nomessages '{"messages": []}' 'nomessages.jsonl:1 (record 1): empty document: "messages" has no messages'
bad notarray '{"messages": "hi"}' 'notarray.jsonl:1 (record 1): "messages" is not an array of messages'
bad toolong '{"prompt": "abc", "completion": "def"}' 'toolong.jsonl:1 (record 1): the document has 7 tokens, more than --seq-length 6' --seq-length 6
bad notjson '{"prompt": ' 'notjson.jsonl:1 (record 1): not a JSON record'

# Training reads what --sft writes: a few steps on its masks, train and
# validation, with dataset.loss_mask required.
python3 - <<'PY'
import json
with open("many.jsonl", "w") as f:
    for i in range(120):
        f.write(json.dumps({"messages": [{"role": "user", "content": "question %d?" % i},
                                         {"role": "assistant", "content": "answer %d." % i}]}) + "\n")
PY
expect_rc 0 "$data" --quiet --output train --sft --chat-template chatml --split-validation 0.2 many.jsonl
expect_rc 0 "$bindir/meshtrain-dense" --config "$small_cfg" dataset.path=train \
    dataset.validation_path=train.val dataset.loss_mask=required checkpoint.enabled=false \
    step_scheduler.max_steps=2 logging.metrics_file="$w/m.jsonl"
expect_in "$out" "data: train: 1 file," "training opens the dataset"
expect_in "$out" "loss mask: yes" "training reads the mask"
expect_in "$out" "validation data: train.val: 1 file," "and the validation part"
finish
