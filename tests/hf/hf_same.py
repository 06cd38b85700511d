#!/usr/bin/env python3
"""hf_same.py: compare two Hugging Face model directories tensor by
tensor, for tests/hf/hf_consolidated.sh, with the Python standard library
only (json, struct), independently of meshtrain's reader.

  tensors A B        A and B hold the same tensor names, each with the same
                     dtype, shape and raw bytes (whatever the files' split)
  config A B [K=J..] A/config.json and B/config.json have the same fields
                     and values, except that B's key K must be JSON J
  dtype A DTYPE      every tensor of A is DTYPE (F32, BF16, F16)
Exit status 0 when the check passes, 1 otherwise (with the reason).
"""
import json
import os
import struct
import sys


def fail(msg):
    print("hf_same: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def files(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return [os.path.join(d, "model.safetensors")]
    if not os.path.exists(index):
        fail("%s: no model.safetensors and no index" % d)
    with open(index) as f:
        wm = json.load(f)["weight_map"]
    return sorted({os.path.join(d, v) for v in wm.values()})


def tensors(d):
    out = {}
    for path in files(d):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n).decode("utf-8"))
            data = f.read()
        hdr.pop("__metadata__", None)
        for name, e in hdr.items():
            b, end = e["data_offsets"]
            if name in out:
                fail("%s: tensor %s twice" % (d, name))
            out[name] = (e["dtype"], e["shape"], data[b:end])
    return out


def cmd_tensors(a, b):
    ta, tb = tensors(a), tensors(b)
    if sorted(ta) != sorted(tb):
        fail("tensor names differ: only in %s: %s; only in %s: %s" %
             (a, sorted(set(ta) - set(tb)), b, sorted(set(tb) - set(ta))))
    for name in ta:
        if ta[name][:2] != tb[name][:2]:
            fail("%s: %s in %s, %s in %s" % (name, ta[name][:2], a, tb[name][:2], b))
        if ta[name][2] != tb[name][2]:
            fail("%s: the bytes differ between %s and %s" % (name, a, b))
    print("%d tensors identical" % len(ta))


def cmd_config(a, b, edits):
    with open(os.path.join(a, "config.json")) as f:
        ca = json.load(f)
    with open(os.path.join(b, "config.json")) as f:
        cb = json.load(f)
    for e in edits:
        k, v = e.split("=", 1)
        if cb.get(k) != json.loads(v):
            fail("%s/config.json: %s is %r, expected %s" % (b, k, cb.get(k), v))
        ca[k] = cb[k]
    if ca != cb:
        keys = sorted(set(ca) | set(cb))
        fail("config.json fields differ: %s" %
             [(k, ca.get(k), cb.get(k)) for k in keys if ca.get(k) != cb.get(k)])
    print("%d config.json fields identical" % len(ca))


def cmd_dtype(a, dtype):
    for name, (dt, _, _) in tensors(a).items():
        if dt != dtype:
            fail("%s: %s is %s, expected %s" % (a, name, dt, dtype))


def main(argv):
    if len(argv) >= 3 and argv[0] == "tensors":
        cmd_tensors(argv[1], argv[2])
    elif len(argv) >= 3 and argv[0] == "config":
        cmd_config(argv[1], argv[2], argv[3:])
    elif len(argv) == 3 and argv[0] == "dtype":
        cmd_dtype(argv[1], argv[2])
    else:
        fail("usage: see the docstring")


if __name__ == "__main__":
    main(sys.argv[1:])
