#!/usr/bin/env python3
"""peft_check.py: a Hugging Face PEFT LoRA directory, checked with the
standard library alone (doc/lora.md), for tests/hf/hf_lora.sh.

  peft_check.py PEFT_DIR HF_BASE_DIR [--nonzero-b | --zero-b]

adapter_config.json: peft_type LORA, an integer r > 0, a numeric
lora_alpha, target_modules (a list of module names or a regex string),
base_model_name_or_path, no DoRA.  adapter_model.safetensors: the 8-byte
little-endian header length, a JSON header of tensors with contiguous,
non-overlapping data offsets that end at the file's end; every tensor
named base_model.model.<module>.lora_A.weight or .lora_B.weight for a
linear <module> of the base's config.json, in pairs, F32 or BF16, A [r,
in] and B [out, r] with the base linear's [out, in]; every module
target_modules selects (PEFT's rules: a string is a full regex match, a
list matches a module whose name ends with an entry) has its pair, and
no other.  --nonzero-b: some lora_B holds a nonzero value (trained);
--zero-b: every lora_B is zero and every lora_A is not (initial).
Prints one line; exit 1 with the first problem.
"""
import json
import os
import re
import struct
import sys

PREFIX = "base_model.model."


def fail(msg):
    print("peft_check: FAIL: " + msg)
    sys.exit(1)


def linears(c):
    """{module name: (out, in)} of the base's decoder linears."""
    H, nh = c["hidden_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd = c.get("head_dim") or H // nh
    I = c["intermediate_size"]
    shapes = {"self_attn.q_proj": (nh * hd, H), "self_attn.k_proj": (nkv * hd, H),
              "self_attn.v_proj": (nkv * hd, H), "self_attn.o_proj": (H, nh * hd),
              "mlp.gate_proj": (I, H), "mlp.up_proj": (I, H), "mlp.down_proj": (H, I)}
    return {"model.layers.%d.%s" % (l, k): v
            for l in range(c["num_hidden_layers"]) for k, v in shapes.items()}


def selected(targets, name):
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def main():
    if len(sys.argv) < 3:
        fail("usage: peft_check.py PEFT_DIR HF_BASE_DIR [--nonzero-b]")
    d, base = sys.argv[1], sys.argv[2]
    with open(os.path.join(d, "adapter_config.json")) as f:
        ac = json.load(f)
    with open(os.path.join(base, "config.json")) as f:
        mods = linears(json.load(f))
    if ac.get("peft_type") != "LORA":
        fail("peft_type %r is not LORA" % ac.get("peft_type"))
    r = ac.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        fail("r %r is not a positive integer" % r)
    if not isinstance(ac.get("lora_alpha"), (int, float)):
        fail("lora_alpha %r is not a number" % ac.get("lora_alpha"))
    if not isinstance(ac.get("base_model_name_or_path"), str) or not ac["base_model_name_or_path"]:
        fail("no base_model_name_or_path")
    if ac.get("use_dora"):
        fail("use_dora is set")
    t = ac.get("target_modules")
    if not (isinstance(t, str) or (isinstance(t, list) and t and
                                    all(isinstance(x, str) for x in t))):
        fail("target_modules %r is neither a regex nor a list of names" % t)
    path = os.path.join(d, "adapter_model.safetensors")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > size - 8:
            fail("header length %d beyond the file (%d bytes)" % (n, size))
        hdr = json.loads(f.read(n).decode("utf-8"))
        data = f.read()
    hdr.pop("__metadata__", None)
    spans, pairs, nonzero, zero_a = [], {}, False, False
    for name, e in hdr.items():
        m = re.fullmatch(re.escape(PREFIX) + r"(.+)\.lora_([AB])\.weight", name)
        if not m or m.group(1) not in mods:
            fail("%s: not a LoRA tensor of a linear of the base" % name)
        if e.get("dtype") not in ("F32", "BF16"):
            fail("%s: dtype %r" % (name, e.get("dtype")))
        out, inn = mods[m.group(1)]
        want = [r, inn] if m.group(2) == "A" else [out, r]
        if e.get("shape") != want:
            fail("%s: shape %r, expected %r" % (name, e.get("shape"), want))
        a, b = e["data_offsets"]
        width = 4 if e["dtype"] == "F32" else 2
        if b - a != width * want[0] * want[1]:
            fail("%s: %d bytes for shape %r" % (name, b - a, want))
        spans.append((a, b, name))
        pairs.setdefault(m.group(1), set()).add(m.group(2))
        if m.group(2) == "B" and any(data[a:b]):
            nonzero = True
        if m.group(2) == "A" and not any(data[a:b]):
            zero_a = True
    spans.sort()
    at = 0
    for a, b, name in spans:
        if a != at:
            fail("%s: data starts at %d, expected %d (gap or overlap)" % (name, a, at))
        at = b
    if at != len(data):
        fail("the tensors' data ends at %d of %d bytes" % (at, len(data)))
    for mod, ab in pairs.items():
        if ab != {"A", "B"}:
            fail("%s has lora_%s alone" % (mod, "".join(sorted(ab))))
    want = {mod for mod in mods if selected(t, mod)}
    if want != set(pairs):
        fail("target_modules selects %d modules, the file has %d (e.g. %s)"
             % (len(want), len(pairs), sorted(want ^ set(pairs))[:2]))
    if "--nonzero-b" in sys.argv and not nonzero:
        fail("every lora_B is zero")
    if "--zero-b" in sys.argv and (nonzero or zero_a):
        fail("an initial adapter has a nonzero lora_B or an all-zero lora_A")
    print("peft_check: %s: %d adapted modules, r %d, lora_alpha %g, %d bytes of data" %
          (d, len(pairs), r, ac["lora_alpha"], len(data)))


if __name__ == "__main__":
    main()
