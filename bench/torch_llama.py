#!/usr/bin/env python3
"""torch_llama.py: the PyTorch eager baseline for bench/bench_dense.sh.

The same Llama architecture as meshtrain-dense (RMSNorm, RoPE with the
rotate_half pairing, causal grouped-query attention, SwiGLU, untied
lm_head), the same shapes, AdamW, fp32, on the same number of threads.
Prints one line: "torch tokens_per_s=<float> steps=<n> step_time_s=<float>".
Used only by the benchmark; needs Debian's python3-torch.
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        d, hd = a.hidden, a.hidden // a.heads
        self.a = a
        self.n1, self.n2 = RMSNorm(d, 1e-5), RMSNorm(d, 1e-5)
        self.q = torch.nn.Linear(d, a.heads * hd, bias=False)
        self.k = torch.nn.Linear(d, a.kv_heads * hd, bias=False)
        self.v = torch.nn.Linear(d, a.kv_heads * hd, bias=False)
        self.o = torch.nn.Linear(a.heads * hd, d, bias=False)
        self.gate = torch.nn.Linear(d, a.intermediate, bias=False)
        self.up = torch.nn.Linear(d, a.intermediate, bias=False)
        self.down = torch.nn.Linear(a.intermediate, d, bias=False)

    def forward(self, x, cos, sin, mask):
        a = self.a
        B, T, D = x.shape
        hd = D // a.heads
        h = self.n1(x)
        q = self.q(h).view(B, T, a.heads, hd).transpose(1, 2)
        k = self.k(h).view(B, T, a.kv_heads, hd).transpose(1, 2)
        v = self.v(h).view(B, T, a.kv_heads, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = a.heads // a.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + mask
        att = torch.softmax(s, dim=-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(B, T, D))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.emb = torch.nn.Embedding(a.vocab, a.hidden)
        self.layers = torch.nn.ModuleList(Layer(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden, 1e-5)
        self.head = torch.nn.Linear(a.hidden, a.vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, idx, cos, sin, mask):
        x = self.emb(idx)
        for l in self.layers:
            x = l(x, cos, sin, mask)
        return self.head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(hidden=512, layers=4, heads=8, kv_heads=4, intermediate=1408, seq=256,
                     vocab=8192, batch=4, steps=10, warmup=2, threads=2).items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = Llama(a)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    hd = a.hidden // a.heads
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(a.seq, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos().float(), ang.sin().float()
    mask = torch.full((a.seq, a.seq), float("-inf")).triu(1)
    data = torch.randint(0, a.vocab, (a.steps + a.warmup, a.batch, a.seq + 1))
    t0 = None
    for i in range(a.steps + a.warmup):
        if i == a.warmup:
            t0 = time.perf_counter()
        x, y = data[i, :, :-1], data[i, :, 1:]
        loss = F.cross_entropy(m(x, cos, sin, mask).view(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    dt = (time.perf_counter() - t0) / a.steps
    print(f"torch tokens_per_s={a.batch * a.seq / dt:.1f} steps={a.steps} step_time_s={dt:.4f} "
          f"loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
