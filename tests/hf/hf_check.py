#!/usr/bin/env python3
"""hf_check.py: an independent reader and writer of Hugging Face
safetensors directories for tests/hf/hf_interchange.sh, using the Python
standard library only (json, struct), following the safetensors format
exactly: an 8-byte little-endian header length N, N bytes of JSON padded
with spaces so the data starts 8-byte aligned, "__metadata__" a map of
strings, tensors' data_offsets relative to the data start, contiguous and
covering the rest of the file.

  check DIR                 the layout of DIR: config.json, single file or
                            index + shards, every header and offset
  values DIR DUMPS          each tensor equals DUMPS/<name>.bin (float32 LE
                            from h5dump -b); BF16 tensors equal the float32
                            rounded to nearest even
  decoded DIR DUMPS         each tensor of DIR, decoded to float32 (F32,
                            BF16 or F16), equals DUMPS/<name>.bin exactly
  write SRC OUT DTYPE [edits...]
                            rewrite SRC's tensors as OUT/model.safetensors in
                            DTYPE (F32, BF16, F16), names sorted, plus
                            config.json; edits: drop=NAME, reshape=NAME:R,C,
                            extra=NAME, config=KEY:JSON
Exit status 0 when every check passes, 1 otherwise (with the reason).
"""
import json
import math
import os
import struct
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2}


def fail(msg):
    print("hf_check: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def read_header(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        raw = f.read(n)
    if (8 + n) % 8:
        fail("%s: the data does not start 8-byte aligned (header %d bytes)" % (path, n))
    text = raw.decode("utf-8")
    if not text.startswith("{") or not text.rstrip(" ").endswith("}"):
        fail("%s: the header is not a JSON object padded with spaces" % path)
    hdr = json.loads(text)
    meta = hdr.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict) or
                             not all(isinstance(v, str) for v in meta.values())):
        fail("%s: __metadata__ is not a map of strings" % path)
    return hdr, meta, 8 + n, size


def check_file(path):
    hdr, meta, start, size = read_header(path)
    if meta != {"format": "pt"}:
        fail("%s: __metadata__ is %r" % (path, meta))
    spans = []
    for name, e in hdr.items():
        if set(e) != {"dtype", "shape", "data_offsets"}:
            fail("%s: %s has keys %s" % (path, name, sorted(e)))
        if e["dtype"] not in SIZES:
            fail("%s: %s has dtype %s" % (path, name, e["dtype"]))
        b, end = e["data_offsets"]
        count = math.prod(e["shape"])
        if end - b != count * SIZES[e["dtype"]]:
            fail("%s: %s spans %d bytes for shape %s %s" % (path, name, end - b, e["shape"], e["dtype"]))
        spans.append((b, end, name))
    spans.sort()
    pos = 0
    for b, end, name in spans:
        if b != pos:
            fail("%s: %s starts at %d, expected %d (not contiguous)" % (path, name, b, pos))
        pos = end
    if start + pos != size:
        fail("%s: the tensors cover %d bytes, the file has %d after the header" % (path, pos, size - start))
    return hdr


def expected(cfg):
    """name -> shape of a LlamaForCausalLM / Qwen3ForCausalLM."""
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", H // nh)
    qwen3 = cfg["architectures"] == ["Qwen3ForCausalLM"]
    t = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = [V, H]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        t[p + "input_layernorm.weight"] = [H]
        t[p + "post_attention_layernorm.weight"] = [H]
        t[p + "self_attn.q_proj.weight"] = [nh * hd, H]
        t[p + "self_attn.k_proj.weight"] = [nkv * hd, H]
        t[p + "self_attn.v_proj.weight"] = [nkv * hd, H]
        t[p + "self_attn.o_proj.weight"] = [H, nh * hd]
        t[p + "mlp.gate_proj.weight"] = [I, H]
        t[p + "mlp.up_proj.weight"] = [I, H]
        t[p + "mlp.down_proj.weight"] = [H, I]
        if qwen3:
            t[p + "self_attn.q_norm.weight"] = [hd]
            t[p + "self_attn.k_norm.weight"] = [hd]
    return t


def tensors(d):
    """name -> (file, entry, data start) over a single file or the shards."""
    single, index = os.path.join(d, "model.safetensors"), os.path.join(d, "model.safetensors.index.json")
    out = {}
    files = [single] if os.path.exists(single) else None
    if files is None:
        idx = json.load(open(index))
        files = sorted({os.path.join(d, f) for f in idx["weight_map"].values()})
    for path in files:
        hdr, _, start, _ = read_header(path)
        for name, e in hdr.items():
            out[name] = (path, e, start)
    return out


def cmd_check(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    for k in ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
              "vocab_size", "max_position_embeddings", "tie_word_embeddings", "torch_dtype"):
        if k not in cfg:
            fail("config.json has no %s" % k)
    want = expected(cfg)
    single, index = os.path.join(d, "model.safetensors"), os.path.join(d, "model.safetensors.index.json")
    dtype = {"float32": "F32", "bfloat16": "BF16"}[cfg["torch_dtype"]]
    seen = {}
    if os.path.exists(single):
        if os.path.exists(index):
            fail("both model.safetensors and the index")
        seen = {n: ("model.safetensors", e) for n, e in check_file(single).items()}
        nfiles = 1
    else:
        idx = json.load(open(index))
        wm, total = idx["weight_map"], idx["metadata"]["total_size"]
        files = sorted(set(wm.values()))
        nfiles = len(files)
        if nfiles < 2:
            fail("an index with %d file(s)" % nfiles)
        for i, f in enumerate(files):
            if f != "model-%05d-of-%05d.safetensors" % (i + 1, nfiles):
                fail("shard name %s" % f)
            for n, e in check_file(os.path.join(d, f)).items():
                if wm.get(n) != f:
                    fail("%s is in %s but the index says %s" % (n, f, wm.get(n)))
                seen[n] = (f, e)
        if set(wm) != set(seen):
            fail("the index lists %s" % sorted(set(wm) ^ set(seen)))
        size = sum(e["data_offsets"][1] - e["data_offsets"][0] for _, e in seen.values())
        if total != size:
            fail("index total_size %d, tensors hold %d bytes" % (total, size))
    if set(seen) != set(want):
        fail("tensors differ from what config.json describes: %s" % sorted(set(seen) ^ set(want)))
    for n, (f, e) in seen.items():
        if e["shape"] != want[n] or e["dtype"] != dtype:
            fail("%s: %s %s, expected %s %s" % (n, e["dtype"], e["shape"], dtype, want[n]))
    print("hf_check: %s: %d tensors in %d file(s), %s, layout OK" % (d, len(seen), nfiles, dtype))


def raw(path, e, start):
    b, end = e["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + b)
        return f.read(end - b)


def bf16_rne(bits):
    if (bits & 0x7FFFFFFF) > 0x7F800000:
        return (bits >> 16) | 0x40
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def decode(data, dtype):
    n = len(data) // SIZES[dtype]
    if dtype == "F32":
        return list(struct.unpack("<%df" % n, data))
    if dtype == "F16":
        return list(struct.unpack("<%de" % n, data))
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack("<%dH" % n, data)]


def dump(dumps, name):
    return open(os.path.join(dumps, name + ".bin"), "rb").read()


def cmd_values(d, dumps):
    count = 0
    for name, (path, e, start) in tensors(d).items():
        data, ref = raw(path, e, start), dump(dumps, name)
        if e["dtype"] == "F32":
            if data != ref:
                fail("%s: F32 bytes differ from the checkpoint's" % name)
        else:
            bits = struct.unpack("<%dI" % (len(ref) // 4), ref)
            want = struct.pack("<%dH" % len(bits), *[bf16_rne(b) for b in bits])
            if data != want:
                fail("%s: BF16 values are not the float32 ones rounded to nearest even" % name)
        count += 1
    print("hf_check: %s: %d tensors equal the checkpoint's values" % (d, count))


def cmd_decoded(d, dumps):
    count = 0
    for name, (path, e, start) in tensors(d).items():
        ref = dump(dumps, name)
        got = struct.pack("<%df" % (len(ref) // 4), *decode(raw(path, e, start), e["dtype"]))
        if got != ref:
            fail("%s: the imported float32 values are not the %s ones" % (name, e["dtype"]))
        count += 1
    print("hf_check: %d imported tensors equal %s's values exactly" % (count, d))


def encode(values, dtype):
    if dtype == "F32":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "F16":
        return struct.pack("<%de" % len(values), *values)
    bits = struct.unpack("<%dI" % len(values), struct.pack("<%df" % len(values), *values))
    return struct.pack("<%dH" % len(bits), *[bf16_rne(b) for b in bits])


def cmd_write(src, out, dtype, edits):
    ts = tensors(src)
    cfg = json.load(open(os.path.join(src, "config.json")))
    items = {}
    for name, (path, e, start) in ts.items():
        items[name] = (list(e["shape"]), decode(raw(path, e, start), e["dtype"]))
    for ed in edits:
        kind, _, arg = ed.partition("=")
        if kind == "drop":
            del items[arg]
        elif kind == "reshape":
            name, _, dims = arg.partition(":")
            shape = [int(x) for x in dims.split(",")]
            items[name] = (shape, items[name][1])
        elif kind == "extra":
            items[arg] = ([4], [0.0] * 4)
        elif kind == "config":
            key, _, val = arg.partition(":")
            cfg[key] = json.loads(val)
        else:
            fail("unknown edit " + ed)
    os.makedirs(out, exist_ok=True)
    header, blobs, pos = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(items):  # the order transformers' writer uses within a dtype
        shape, values = items[name]
        blob = encode(values, dtype)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + len(blob)]}
        blobs.append(blob)
        pos += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print("hf_check: wrote %s: %d tensors as %s" % (out, len(items), dtype))


def main(argv):
    if len(argv) >= 2 and argv[0] == "check":
        cmd_check(argv[1])
    elif len(argv) >= 3 and argv[0] == "values":
        cmd_values(argv[1], argv[2])
    elif len(argv) >= 3 and argv[0] == "decoded":
        cmd_decoded(argv[1], argv[2])
    elif len(argv) >= 4 and argv[0] == "write":
        cmd_write(argv[1], argv[2], argv[3], argv[4:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
