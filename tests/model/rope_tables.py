#!/usr/bin/env python3
"""rope_tables.py: an independent check of meshtrain's RoPE tables.

Reads what `test_rope_tables --tables` prints (a "case" line of parameters,
the "att" scale of cos and sin, then "inv i value" for every inverse
frequency) on stdin, recomputes each table here from the formulas of
transformers' modeling_rope_utils.py (_compute_default_rope_parameters,
_compute_linear_scaling_rope_parameters, _compute_dynamic_ntk_parameters,
_compute_llama3_parameters, _compute_yarn_parameters), in plain float64
math, and compares: every value within REL relative.  Exit 1 on any
difference.  No torch: transformers forms the same expressions in float32
tensors; here they are float64 scalars.
"""
import math
import sys

REL = 1e-12


def default(theta, d):
    # 1 / base^(arange(0, d, 2) / d)
    return [1.0 / (theta ** (j / d)) for j in range(0, d, 2)]


def linear(p):
    return [f / p["factor"] for f in default(p["theta"], p["head_dim"])], 1.0


def dynamic(p):
    d, mp, factor = p["head_dim"], p["max_pos"], p["factor"]
    seq = p["seq_len"] if p["seq_len"] > 0 else mp
    seq = max(seq, mp)
    base = p["theta"] * ((factor * seq / mp) - (factor - 1)) ** (d / (d - 2))
    return default(base, d), 1.0


def llama3(p):
    inv = default(p["theta"], p["head_dim"])
    factor, low, high = p["factor"], p["low"], p["high"]
    old_context_len = p["orig"]
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        g = f / factor if wavelen > low_freq_wavelen else f
        if not (wavelen < high_freq_wavelen) and not (wavelen > low_freq_wavelen):
            smooth = (old_context_len / wavelen - low) / (high - low)
            g = (1 - smooth) * g / factor + smooth * g
        out.append(g)
    return out, 1.0


def yarn(p):
    d, base, factor = p["head_dim"], p["theta"], p["factor"]
    orig = p["orig"] if p["orig"] > 0 else p["max_pos"]
    att = p["attention_factor"] if p["attention_factor"] > 0 else None

    def get_mscale(scale, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    if att is None:
        att = get_mscale(factor)
    beta_fast, beta_slow = p["beta_fast"] or 32, p["beta_slow"] or 1

    def find_correction_dim(num_rotations):
        return (d * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = find_correction_dim(beta_fast)
    high = find_correction_dim(beta_slow)
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    out = []
    for j in range(d // 2):
        pos_freq = base ** (2 * j / d)
        extrapolation, interpolation = 1.0 / pos_freq, 1.0 / (factor * pos_freq)
        ramp = min(max((j - low) / (high - low), 0.0), 1.0)
        extrapolation_factor = 1 - ramp
        out.append(interpolation * (1 - extrapolation_factor)
                   + extrapolation * extrapolation_factor)
    return out, att


def compute(p):
    kind = p["type"]
    if kind == "default":
        return default(p["theta"], p["head_dim"]), 1.0
    return {"linear": linear, "dynamic": dynamic, "llama3": llama3, "yarn": yarn}[kind](p)


def parse_case(line):
    words = line.split()
    p = {"name": words[1]}
    for w in words[2:]:
        k, v = w.split("=", 1)
        p[k] = v if k == "type" else float(v)
    for k in ("head_dim", "max_pos", "orig", "seq_len", "truncate"):
        p[k] = int(p[k])
    return p


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def main():
    cases, cur = [], None
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        if w[0] == "case":
            cur = {"p": parse_case(line), "att": None, "inv": []}
            cases.append(cur)
        elif w[0] == "att":
            cur["att"] = float(w[1])
        elif w[0] == "inv":
            assert int(w[1]) == len(cur["inv"]), line
            cur["inv"].append(float(w[2]))
    bad, worst = 0, 0.0
    for c in cases:
        p = c["p"]
        want, att = compute(p)
        if len(c["inv"]) != len(want):
            print(f"{p['name']}: {len(c['inv'])} frequencies, want {len(want)}")
            bad += 1
            continue
        for i, (g, x) in enumerate(zip(c["inv"], want)):
            r = rel(g, x)
            worst = max(worst, r)
            if r > REL:
                print(f"{p['name']}: inv_freq[{i}] = {g!r}, transformers' formula {x!r} "
                      f"(relative {r:.2e})")
                bad += 1
        r = rel(c["att"], att)
        worst = max(worst, r)
        if r > REL:
            print(f"{p['name']}: attention factor {c['att']!r}, transformers' formula {att!r}")
            bad += 1
    if len(cases) < 10:
        print(f"only {len(cases)} cases read")
        bad += 1
    print(f"{len(cases)} tables, {sum(len(c['inv']) for c in cases)} frequencies, "
          f"worst relative difference {worst:.2e}, {bad} beyond {REL}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
