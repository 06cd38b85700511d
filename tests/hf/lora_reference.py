#!/usr/bin/env python3
"""lora_reference.py: an independent float64 PyTorch reference of LoRA
fine-tuning (doc/lora.md), for tests/hf/hf_lora.sh.

  lora_reference.py --model HF_DIR --adapter PEFT_DIR --job OUT.jsonl[:BUG] ...
                    [training arguments as hf_reference.py's]

The base is HF_DIR (the model hf_reference.py reads, frozen); the
adapters start from PEFT_DIR, a PEFT directory (adapter_config.json and
adapter_model.safetensors, meshtrain's export of its step-0 checkpoint),
so the reference draws no random numbers of its own.  Each adapted
linear computes y = x W^T (+ b) + (lora_alpha / r) (x A^T) B^T; only A
and B train, with hf_reference.py's AdamW, clipping and schedule (both
decayed: AutoModel gives the optimizer every trainable tensor).  One
line per step to each job's OUT.jsonl: step, loss, grad_norm, lr.

With --merged DIR:PEFT_DIR first: DIR's logits (meshtrain-ckpt export
--merge) against the base's with PEFT_DIR's adapter on the first
sequence, within 1e-5 of the largest logit, and the adapter must move
them.

Planted bugs (a job's BUG): scale_alpha (the adapter scaled by alpha, not alpha
/ r), skip_o_down (no adapters on o_proj and down_proj, the row-parallel
linears), train_base (the base trains too).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402
import torch  # noqa: E402

torch.set_default_dtype(torch.float64)
PREFIX = "base_model.model."


class LoraModel(ref.Model):
    def __init__(self, c, weights, adapters, scale, bug):
        super().__init__(c, weights, set())
        self.scale, self.bug = scale, bug
        if bug != "train_base":
            for t in self.p.values():
                t.requires_grad_(False)
        self.base = dict(self.p)
        self.ad = {}
        for name, t in adapters.items():
            self.ad[name] = t.clone().requires_grad_(True)
        if bug == "train_base":
            self.ad.update(self.p)

    def lin(self, x, name):
        y = super().lin(x, name)
        a = self.ad.get(name + ".lora_A.weight")
        if a is None or (self.bug == "skip_o_down" and name.endswith(("o_proj", "down_proj"))):
            return y
        b = self.ad[name + ".lora_B.weight"]
        return y + self.scale * ((x @ a.t()) @ b.t())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--job", action="append", default=[], help="OUT.jsonl[:BUG]")
    ap.add_argument("--merged", metavar="MERGED_DIR:PEFT_DIR",
                    help="a merged model: its logits against the base's with PEFT_DIR's "
                    "adapter, on the first sequence of tokens.bin (within 1e-5)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=2)
    ap.add_argument("--local-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--decay", choices=("cosine", "linear", "constant"), default="cosine")
    ap.add_argument("--min-lr", type=float, default=0.0)
    ap.add_argument("--betas", type=lambda s: [float(v) for v in s.split(",")],
                    default=[0.9, 0.95])
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    a = ap.parse_args()
    a.max_steps = a.steps
    if a.merged and logits_check(a) != 0:
        return 1
    for job in a.job:
        out, _, bug = job.partition(":")
        if bug not in ("", "scale_alpha", "skip_o_down", "train_base"):
            raise SystemExit("unknown planted bug %s" % bug)
        train(a, out, bug)
    return 0


def load(a, bug, adapter=None):
    adapter = adapter or a.adapter
    with open(os.path.join(a.model, "config.json")) as f:
        c = json.load(f)
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        ac = json.load(f)
    raw = ref.read_safetensors(os.path.join(adapter, "adapter_model.safetensors"))
    adapters = {n[len(PREFIX):]: t for n, t in raw.items()}
    scale = ac["lora_alpha"] / ac["r"] if bug != "scale_alpha" else ac["lora_alpha"]
    return c, LoraModel(c, ref.read_model_dir(a.model), adapters, scale, bug)


def logits_check(a):
    mdir, _, adapter = a.merged.partition(":")
    c, m = load(a, "", adapter)
    merged = ref.Model(c, ref.read_model_dir(mdir), set())
    toks = ref.read_tokens(os.path.join(a.model, "tokens.bin"))[None, :a.seq]
    with torch.no_grad():
        x, y = m.forward(toks)[0], merged.forward(toks)[0]
        base = ref.Model(c, ref.read_model_dir(a.model), set()).forward(toks)[0]
    d = float((x - y).abs().max() / x.abs().max())
    moved = float((x - base).abs().max() / x.abs().max())
    print("merged logits against base + adapter: max difference %.2e of the largest logit; "
          "the adapter moves them by %.2e" % (d, moved))
    return 0 if d <= 1e-5 and moved > 1e-4 else 1


def train(a, out, bug):
    c, m = load(a, bug)
    toks = ref.read_tokens(os.path.join(a.model, "tokens.bin"))
    S, G, Lb = a.seq, a.global_batch, a.local_batch
    nsamp = (toks.numel() - 1) // S
    names = sorted(m.ad)
    state = {n: (torch.zeros_like(m.ad[n]), torch.zeros_like(m.ad[n])) for n in names}
    b1, b2 = a.betas
    lines = []
    for step in range(1, a.steps + 1):
        for t in m.ad.values():
            t.grad = None
        ce_total, count = 0.0, G * S
        for mi in range(G // Lb):
            rows = [((step - 1) * G + mi * Lb + j) % nsamp for j in range(Lb)]
            sample = torch.stack([toks[i * S: i * S + S + 1] for i in rows])
            logits, _ = m.forward(sample[:, :-1])
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   sample[:, 1:].reshape(-1), reduction="sum")
            (ce / count).backward()
            ce_total += ce.item()
        gnorm = math.sqrt(sum(float((m.ad[n].grad ** 2).sum()) for n in names
                              if m.ad[n].grad is not None))
        coef = 1.0 if a.max_grad_norm <= 0 else min(1.0, a.max_grad_norm / (gnorm + 1e-6))
        lr = ref.lr_at(a, step, set())
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        with torch.no_grad():
            for n in names:
                p, g = m.ad[n], m.ad[n].grad
                g = torch.zeros_like(p) if g is None else g * coef
                m1, m2 = state[n]
                m1.mul_(b1).add_((1 - b1) * g)
                m2.mul_(b2).add_((1 - b2) * g * g)
                decay = not (n.endswith("norm.weight") or n.endswith(".bias"))
                wd = a.weight_decay if decay else 0.0
                p.sub_(lr * wd * p + (lr / bc1) * m1 / (m2.sqrt() / math.sqrt(bc2) + a.eps))
        lines.append(json.dumps({"step": step, "loss": ce_total / count, "grad_norm": gnorm,
                                 "lr": lr}))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
