#!/usr/bin/env python3
"""lossmask.py: writes test loss masks (doc/data.md, "Loss masks") and
token files for the loss-mask and blend tests, standard library only.

  lossmask.py mask TOKENS.bin PATTERN [OUT]   mask of an llm.c token file
      (OUT default TOKENS.bin.lossmask); PATTERN: ones, zeros, stripes
      (0 on tokens j with (j // 5) % 3 == 0), prompt (0 on each
      document's first 12 tokens, documents ending at token 256), byte2
      (stripes with token 100's byte 2)
  lossmask.py cat OUT.bin A.bin B.bin ...     the llm.c file of A's tokens
      then B's ...
  lossmask.py slice OUT.bin IN.bin A B        IN's tokens A .. B-1
"""
import struct
import sys


def read(path):
    raw = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert magic == 20240520 and version == 1 and len(raw) == 1024 + 2 * n, path
    return list(struct.unpack("<%dH" % n, raw[1024:]))


def write(path, toks):
    head = struct.pack("<3i", 20240520, 1, len(toks)) + bytes(1024 - 12)
    open(path, "wb").write(head + struct.pack("<%dH" % len(toks), *toks))


def mask(toks, pattern):
    if pattern == "ones":
        return [1] * len(toks)
    if pattern == "zeros":
        return [0] * len(toks)
    if pattern in ("stripes", "byte2"):
        m = [0 if (j // 5) % 3 == 0 else 1 for j in range(len(toks))]
        if pattern == "byte2":
            m[100] = 2
        return m
    if pattern == "prompt":
        m, at = [], 0
        for t in toks:
            m.append(1 if at >= 12 else 0)
            at = 0 if t == 256 else at + 1
        return m
    raise SystemExit("unknown pattern " + pattern)


def main(argv):
    if argv[1] == "mask":
        toks = read(argv[2])
        out = argv[4] if len(argv) > 4 else argv[2] + ".lossmask"
        m = mask(toks, argv[3])
        open(out, "wb").write(b"MTLMASK1" + struct.pack("<Q", len(toks)) + bytes(m))
    elif argv[1] == "cat":
        write(argv[2], [t for p in argv[3:] for t in read(p)])
    elif argv[1] == "slice":
        write(argv[2], read(argv[3])[int(argv[4]):int(argv[5])])
    else:
        raise SystemExit(__doc__)


main(sys.argv)
