#!/usr/bin/env python3
"""generate_ref.py: greedy decoding by full recompute in float64 PyTorch,
the reference of tests/app/generate.sh (doc/generate.md).

  generate_ref.py MODEL_DIR:PROMPT_IDS:N[:BUG] ...

One line of ids per job (importing torch is the slow part, so jobs share a
process).  Reads MODEL_DIR as tests/hf/hf_reference.py does and uses its Model (the
families written from transformers' semantics); at each of N steps it runs
the whole sequence so far, without any cache, and appends the argmax of the
last position's logits.  Prints the N ids comma-separated, and on stderr the
smallest gap between the best and second-best logit (how close a step came
to a tie).  BUG "no_window" or another of hf_reference's planted bugs
shows that the comparison can fail.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hf"))
import hf_reference as ref  # noqa: E402
import json  # noqa: E402
import torch  # noqa: E402


def job(spec):
    parts = spec.split(":")
    d, ids, n = parts[0], [int(x) for x in parts[1].split(",")], int(parts[2])
    bugs = set(parts[3].split(",")) if len(parts) > 3 and parts[3] else set()
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    m = ref.Model(c, ref.read_model_dir(d), bugs)
    out, gap = [], float("inf")
    with torch.no_grad():
        for _ in range(n):
            logits, _ = m.forward(torch.tensor([ids]))
            last = logits[0, -1]
            top = torch.topk(last, 2).values
            gap = min(gap, float(top[0] - top[1]))
            t = int(torch.argmax(last))
            out.append(t)
            ids.append(t)
    print(",".join(str(t) for t in out))
    print("%s: smallest top-2 gap %.3g" % (spec, gap), file=sys.stderr)


def main(argv):
    for spec in argv[1:]:
        job(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
