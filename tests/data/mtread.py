# mtread.py: an independent reader of the files meshtrain-data writes,
# with the Python standard library only, for the data_tool*.sh tests:
# Megatron-LM indexed datasets (PREFIX.idx + PREFIX.bin, as Megatron's
# indexed_dataset.py lays them out) and loss masks (PREFIX.lossmask,
# doc/data.md).  Every field is checked, not trusted.
import struct

DTYPES = {8: ("uint16", "H", 2), 4: ("int32", "i", 4)}


def read_megatron(prefix):
    """(dtype name, [document token lists])"""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", (prefix, idx[:9])
    (version,) = struct.unpack_from("<Q", idx, 9)
    assert version == 1, version
    name, fmt, size = DTYPES[idx[17]]
    nseq, ndoc = struct.unpack_from("<QQ", idx, 18)
    off = 34
    lens = struct.unpack_from("<%di" % nseq, idx, off)
    off += 4 * nseq
    ptrs = struct.unpack_from("<%dq" % nseq, idx, off)
    off += 8 * nseq
    docidx = struct.unpack_from("<%dq" % ndoc, idx, off)
    off += 8 * ndoc
    assert off == len(idx), ("trailing bytes in", prefix + ".idx", off, len(idx))
    assert list(docidx) == list(range(nseq + 1)), "one sequence per document"
    data = open(prefix + ".bin", "rb").read()
    assert sum(lens) * size == len(data), (sum(lens), size, len(data))
    docs, at = [], 0
    for n, p in zip(lens, ptrs):
        assert p == at, ("pointer", p, at)
        docs.append(list(struct.unpack_from("<%d%s" % (n, fmt), data, p)))
        at += n * size
    return name, docs


def read_mask(path, n_tokens):
    b = open(path, "rb").read()
    assert b[:8] == b"MTLMASK1", b[:8]
    (n,) = struct.unpack_from("<Q", b, 8)
    assert n == n_tokens and len(b) == 16 + n, (n, n_tokens, len(b))
    assert set(b[16:]) <= {0, 1}
    return list(b[16:])


def byte_doc(text):
    """The byte tokenizer's document: UTF-8 bytes, then EOS (256)."""
    return list(text.encode("utf-8")) + [256]
