#!/usr/bin/env python3
"""hf_reference.py: an independent float64 PyTorch reference of the
Hugging Face causal-LM families meshtrain trains (doc/hf-reference.md).

It reads a model directory as transformers would (config.json plus
model.safetensors or a sharded index; F32, BF16 or F16) and trains it for
a few steps the way meshtrain does, printing one JSON line per step:
loss, grad_norm, lr and aux_loss.  Only torch is needed (no transformers,
no numpy); everything is float64.

  hf_reference.py [training options] --job MODEL_DIR:OUT.jsonl[:BUG,BUG] ...

Several jobs share one process, because importing torch is the slow part.
BUG names a planted bug (also REF_BUG=BUG,... for every job) so that a
test can show that its comparison fails; --bugs lists them.

What it computes, written from the semantics of transformers' modeling
files (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, olmoe,
modeling_rope_utils, masking_utils), not from their code:

  embedding; per layer x += o(attn(rope(q), rope(k), v)) on RMSNorm(x),
  then x += mlp(RMSNorm(x)); final RMSNorm; lm_head (or the embedding, tied).
  RMSNorm(x) = w * x / sqrt(mean(x^2) + eps).
  q/k/v/o biases: Llama, Qwen3 and OLMoE attention_bias (all four);
  Qwen2 always on q, k, v and never on o.  mlp_bias: Llama's gate/up/down.
  Qwen3 (and Qwen3-MoE) RMSNorm q and k per head over head_dim before
  RoPE; OLMoE RMSNorms the whole q and k projections (nh*hd, nkv*hd).
  RoPE: rotate_half pairing (i, i + d/2), inv_freq from rope_type default,
  linear, dynamic (NTK, when the sequence exceeds max_position_embeddings),
  llama3 (three wavelength bands) or yarn (ramp between interpolation and
  extrapolation, cos and sin scaled by the attention factor); head_dim is
  config.head_dim when present.
  Attention: grouped-query, scale 1/sqrt(head_dim), causal; with a sliding
  window W a query sees keys q - W < k <= q (masking_utils' rule); Mistral
  and Mixtral use config.sliding_window; Qwen2/3 only with
  use_sliding_window on layers >= max_window_layers.
  MLP: down(silu(gate(h)) * up(h)).
  MoE: p = softmax(router(h)), top-k, weights renormalised for Mixtral
  always and for Qwen3-MoE and OLMoE with norm_topk_prob; Qwen3-MoE's
  dense layers from mlp_only_layers and decoder_sparse_step.
  load_balancing_loss_func: over all MoE layers' rows R of a micro-batch,
  E * sum_e (rows that chose e) / R * (sum of p_e) / R.

How it trains, as meshtrain does (doc/training.md, src/model/optim.c):

  sample c of the step-t batch is tokens [i S, i S + S] with
  i = (t G + c) mod floor((n - 1) / S) (dataset.shuffle false);
  loss = sum of cross-entropy over the global batch / its token count
       (with --mask, targets whose loss-mask byte is 0 are left out of both)
       + router_aux_loss_coef * mean over micro-batches of aux
  (meshtrain adds the aux loss whenever the coefficient is nonzero;
  transformers only with output_router_logits);
  grad_norm is the global 2-norm before clipping; clip coefficient
  min(1, max_grad_norm / (norm + 1e-6)); AdamW with bias correction,
  p -= lr wd p (not on norm weights and biases) + lr / (1 - b1^t) m / (sqrt(v) /
  sqrt(1 - b2^t) + eps); lr: linear warm-up to lr over the warm-up steps,
  then cosine or linear to min_lr at max_steps, or constant.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

torch.set_default_dtype(torch.float64)
torch.set_num_threads(int(os.environ.get("REF_THREADS", "1")))

BUGS = {
    "rope_factor": "RoPE scaling factor doubled (scaled rope types)",
    "rope_theta": "rope_theta doubled",
    "rope_interleave": "RoPE pairs (2i, 2i+1) instead of rotate_half",
    "attn_factor": "yarn's attention factor left out",
    "missing_bias": "every bias left out",
    "window_plus_one": "a sliding window one key wider",
    "no_window": "the sliding window ignored",
    "router_no_renorm": "top-k weights never renormalised",
    "router_renorm": "top-k weights always renormalised",
    "qk_norm_per_head": "OLMoE's q/k norm applied per head",
    "mask_count_all": "the loss mask's excluded targets still counted in the mean",
    "no_qk_norm": "the q/k norm left out",
    "scale_hidden_heads": "attention scale 1/sqrt(hidden/heads), not 1/sqrt(head_dim)",
    "no_aux": "the load-balancing loss left out",
    "untied": "a tied lm_head replaced by the embedding's transpose trained apart",
    "no_clip": "no gradient clipping",
    "no_warmup": "the learning rate without its warm-up",
    "no_weight_decay": "AdamW without weight decay",
    "no_bias_correction": "AdamW without bias correction",
}


# ------------------------------------------------------------- safetensors

def read_safetensors(path):
    """{name: float64 tensor} of one file (little-endian host)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n).decode("utf-8"))
        data = f.read()
    hdr.pop("__metadata__", None)
    out = {}
    for name, t in hdr.items():
        a, b = t["data_offsets"]
        raw = bytearray(data[a:b])
        if t["dtype"] == "F32":
            x = torch.frombuffer(raw, dtype=torch.float32) if raw else torch.zeros(0)
        elif t["dtype"] == "F16":
            x = torch.frombuffer(raw, dtype=torch.float16)
        elif t["dtype"] == "BF16":  # the high half of a float32
            bits = torch.frombuffer(raw, dtype=torch.int16).to(torch.int32) & 0xFFFF
            x = (bits << 16).view(torch.float32)
        else:
            raise SystemExit("%s: %s has dtype %s; the reference reads F32, BF16, F16"
                             % (path, name, t["dtype"]))
        out[name] = x.to(torch.float64).reshape(t["shape"]).clone()
    return out


def read_model_dir(d):
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        wmap = json.load(f)["weight_map"]
    out = {}
    for fname in sorted(set(wmap.values())):
        out.update(read_safetensors(os.path.join(d, fname)))
    return out


# ------------------------------------------------------------- the model

def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_inv_freq(c, hd, seq, bugs):
    """(inv_freq [hd/2], attention factor), by rope_type."""
    rs = c.get("rope_scaling") or c.get("rope_parameters") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    base = float(c.get("rope_theta", rs.get("rope_theta", 10000.0)))
    base *= 2.0 if "rope_theta" in bugs else 1.0
    factor = float(rs.get("factor", 1.0)) * (2.0 if "rope_factor" in bugs else 1.0)
    idx = torch.arange(0, hd, 2, dtype=torch.float64) / hd
    inv = 1.0 / base ** idx
    att = 1.0
    if kind == "default":
        pass
    elif kind == "linear":
        inv = inv / factor
    elif kind == "dynamic":
        mx = c["max_position_embeddings"]
        if seq > mx:  # transformers recomputes for the longest position seen
            b = base * (factor * seq / mx - (factor - 1)) ** (hd / (hd - 2))
            inv = 1.0 / b ** idx
    elif kind == "llama3":
        old = float(rs["original_max_position_embeddings"])
        lo, hi = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        wl = 2 * math.pi / inv
        smooth = (old / wl - lo) / (hi - lo)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wl > old / lo, inv / factor, torch.where(wl < old / hi, inv, mid))
    elif kind == "yarn":
        if rs.get("mscale") or rs.get("mscale_all_dim"):
            raise SystemExit("yarn's mscale and mscale_all_dim are not in the reference")
        # as transformers 5 reads them: the explicit factor, else the ratio
        # of the two context lengths (earlier versions took the ratio
        # whenever original_max_position_embeddings was given)
        orig = rs.get("original_max_position_embeddings") or c["max_position_embeddings"]
        if rs.get("factor") is None:
            factor = c["max_position_embeddings"] / orig * (2.0 if "rope_factor" in bugs else 1.0)
        att = rs.get("attention_factor")
        if att is None:
            att = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        fast, slow = rs.get("beta_fast") or 32.0, rs.get("beta_slow") or 1.0

        def dim_of(rot):  # the dimension that turns `rot` times over orig positions
            return hd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
        low, high = dim_of(fast), dim_of(slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, hd - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(hd // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extra = 1 - ramp  # 1: keep the frequency, 0: interpolate it
        inv = (inv / factor) * (1 - extra) + inv * extra
        if "attn_factor" in bugs:
            att = 1.0
    else:
        raise SystemExit("rope_type %s is not in the reference" % kind)
    return inv, float(att)


def rotate(x, cos, sin, interleave):
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        c, s = cos[..., : x.shape[-1] // 2], sin[..., : x.shape[-1] // 2]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), -1).flatten(-2)
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


class Model:
    def __init__(self, c, weights, bugs):
        self.c, self.bugs = c, bugs
        self.arch = c["architectures"][0]
        known = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                 "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM",
                 "OlmoeForCausalLM")
        if self.arch not in known:
            raise SystemExit("architecture %s is not in the reference" % self.arch)
        if c.get("hidden_act", "silu") != "silu":
            raise SystemExit("hidden_act %s is not in the reference" % c["hidden_act"])
        self.H, self.L = c["hidden_size"], c["num_hidden_layers"]
        self.nh = c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads") or self.nh
        self.hd = c.get("head_dim") or self.H // self.nh
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.tied = c.get("tie_word_embeddings", False)
        self.E = c.get("num_experts") or c.get("num_local_experts") or 0
        self.K = c.get("num_experts_per_tok", 0)
        self.renorm = self.arch == "MixtralForCausalLM" or c.get("norm_topk_prob", False)
        if "router_no_renorm" in bugs:
            self.renorm = False
        if "router_renorm" in bugs:
            self.renorm = True
        self.coef = c.get("router_aux_loss_coef", 0.0) if self.E else 0.0
        self.p = {}
        for name, t in weights.items():
            if "missing_bias" in bugs and name.endswith(".bias"):
                continue
            self.p[name] = t.clone().requires_grad_(True)
        if self.tied and "lm_head.weight" in self.p:
            del self.p["lm_head.weight"]  # transformers ties it to the embedding
        if self.tied and "untied" in bugs:
            head = weights["model.embed_tokens.weight"]
            self.p["lm_head.weight"] = head.clone().requires_grad_(True)

    def window(self, layer):
        c = self.c
        if self.arch in ("MistralForCausalLM", "MixtralForCausalLM"):
            w = c.get("sliding_window")
        elif self.arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            on = c.get("use_sliding_window", False) and layer >= c.get("max_window_layers", 0)
            w = c.get("sliding_window") if on else None
        else:
            w = None
        return None if "no_window" in self.bugs else w

    def lin(self, x, name):
        y = x @ self.p[name + ".weight"].t()
        b = self.p.get(name + ".bias")
        return y if b is None else y + b

    def attention(self, l, h, cos, sin):
        B, S, _ = h.shape
        pre = "model.layers.%d.self_attn." % l
        q, k, v = (self.lin(h, pre + n + "_proj") for n in ("q", "k", "v"))
        qn, kn = self.p.get(pre + "q_norm.weight"), self.p.get(pre + "k_norm.weight")
        olmoe = self.arch == "OlmoeForCausalLM"
        if qn is not None and "no_qk_norm" not in self.bugs:
            if olmoe and "qk_norm_per_head" not in self.bugs:  # over the whole projection
                q, k = rms_norm(q, qn, self.eps), rms_norm(k, kn, self.eps)
            elif olmoe:
                q = rms_norm(q.view(B, S, self.nh, self.hd), qn.view(self.nh, self.hd), self.eps)
                k = rms_norm(k.view(B, S, self.nkv, self.hd), kn.view(self.nkv, self.hd), self.eps)
            else:  # Qwen3: per head over head_dim
                q = rms_norm(q.view(B, S, self.nh, self.hd), qn, self.eps)
                k = rms_norm(k.view(B, S, self.nkv, self.hd), kn, self.eps)
        clip = self.c.get("clip_qkv") if olmoe else None
        if clip is not None:
            q, k, v = q.clamp(-clip, clip), k.clamp(-clip, clip), v.clamp(-clip, clip)
        q = q.reshape(B, S, self.nh, self.hd).transpose(1, 2)
        k = k.reshape(B, S, self.nkv, self.hd).transpose(1, 2)
        v = v.reshape(B, S, self.nkv, self.hd).transpose(1, 2)
        inter = "rope_interleave" in self.bugs
        q, k = rotate(q, cos, sin, inter), rotate(k, cos, sin, inter)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        hd = self.H // self.nh if "scale_hidden_heads" in self.bugs else self.hd
        s = q @ k.transpose(-1, -2) / math.sqrt(hd)
        pos = torch.arange(S)
        allowed = pos[None, :] <= pos[:, None]
        w = self.window(l)
        if w is not None:
            dist = pos[:, None] - pos[None, :]
            allowed = allowed & ((dist <= w) if "window_plus_one" in self.bugs else (dist < w))
        s = s.masked_fill(~allowed, float("-inf"))
        o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, S, self.nh * self.hd)
        return self.lin(o, pre + "o_proj")

    def mlp(self, pre, h, gate="gate_proj", up="up_proj", down="down_proj"):
        g = self.lin(h, pre + gate)
        return self.lin(torch.nn.functional.silu(g) * self.lin(h, pre + up), pre + down)

    def moe(self, l, h, logits_out):
        mix = self.arch == "MixtralForCausalLM"
        pre = "model.layers.%d.%s." % (l, "block_sparse_moe" if mix else "mlp")
        x = h.reshape(-1, self.H)
        logits = x @ self.p[pre + "gate.weight"].t()
        logits_out.append(logits)
        prob = logits.softmax(-1)
        w, idx = prob.topk(self.K, dim=-1)
        if self.renorm:
            w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(self.E):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            ep = pre + "experts.%d." % e
            y = (self.mlp(ep, x[rows], "w1", "w3", "w2") if mix else self.mlp(ep, x[rows]))
            out = out.index_add(0, rows, y * w[rows, slot][:, None])
        return out.view_as(h)

    def sparse(self, l):
        if not self.E:
            return False
        if self.arch != "Qwen3MoeForCausalLM":
            return True
        step = self.c.get("decoder_sparse_step", 1) or 1
        return l not in (self.c.get("mlp_only_layers") or []) and (l + 1) % step == 0

    def forward(self, tokens):
        """logits [B, S, V] and the router logits of every MoE layer."""
        B, S = tokens.shape
        inv, att = rope_inv_freq(self.c, self.hd, S, self.bugs)
        ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), -1)
        cos, sin = emb.cos() * att, emb.sin() * att
        x = self.p["model.embed_tokens.weight"][tokens]
        routers = []
        for l in range(self.L):
            pre = "model.layers.%d." % l
            h = rms_norm(x, self.p[pre + "input_layernorm.weight"], self.eps)
            x = x + self.attention(l, h, cos, sin)
            h = rms_norm(x, self.p[pre + "post_attention_layernorm.weight"], self.eps)
            x = x + (self.moe(l, h, routers) if self.sparse(l) else self.mlp(pre + "mlp.", h))
        x = rms_norm(x, self.p["model.norm.weight"], self.eps)
        head = self.p.get("lm_head.weight", self.p["model.embed_tokens.weight"])
        return x @ head.t(), routers

    def aux_loss(self, routers):
        """load_balancing_loss_func over one micro-batch's MoE layers."""
        if not routers:
            return torch.zeros(())
        logits = torch.cat(routers, 0)
        prob = logits.softmax(-1)
        _, idx = prob.topk(self.K, dim=-1)
        chose = torch.nn.functional.one_hot(idx, self.E).to(prob.dtype)  # [R, K, E]
        return self.E * (chose.mean(0) * prob.mean(0)[None, :]).sum()


# ------------------------------------------------------------- training

def lr_at(a, step, bugs):
    """meshtrain's schedule (mt_lr_at), steps from 1."""
    if a.warmup > 0 and step <= a.warmup and "no_warmup" not in bugs:
        return a.lr * step / a.warmup
    if a.decay == "constant" or a.max_steps <= a.warmup:
        return a.lr
    prog = min(1.0, (step - a.warmup) / (a.max_steps - a.warmup))
    if a.decay == "linear":
        return a.lr - (a.lr - a.min_lr) * prog
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * prog))


def read_tokens(path):
    """An llm.c token file: 256 int32 header (magic, version 1, count), uint16 tokens."""
    with open(path, "rb") as f:
        raw = f.read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    if magic != 20240520 or version != 1 or len(raw) != 1024 + 2 * n:
        raise SystemExit("%s is not an llm.c version 1 token file" % path)
    return torch.tensor(struct.unpack("<%dH" % n, raw[1024:]), dtype=torch.int64)


def read_mask(path, n):
    """A loss mask (doc/data.md): "MTLMASK1", uint64 count, one byte 0/1 per token."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != b"MTLMASK1" or struct.unpack("<Q", raw[8:16])[0] != n or len(raw) != 16 + n:
        raise SystemExit("%s is not a loss mask of %d tokens" % (path, n))
    return torch.tensor(list(raw[16:]), dtype=torch.int64)


def train(model_dir, out, bugs, a):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    m = Model(c, read_model_dir(model_dir), bugs)
    toks = read_tokens(a.tokens or os.path.join(model_dir, "tokens.bin"))
    mask = read_mask(a.mask, toks.numel()) if a.mask else None
    S, G, Lb = a.seq, a.global_batch, a.local_batch
    nsamp = (toks.numel() - 1) // S
    micro = G // Lb
    names = sorted(m.p)
    state = {n: (torch.zeros_like(m.p[n]), torch.zeros_like(m.p[n])) for n in names}
    b1, b2 = a.betas
    lines = []
    for step in range(1, a.steps + 1):
        for t in m.p.values():
            t.grad = None
        ce_total, aux_total = 0.0, 0.0
        count = G * S  # every target counts, unless a loss mask excludes it
        def rows_of(mi):
            return [((step - 1) * G + mi * Lb + j) % nsamp for j in range(Lb)]
        if mask is not None and "mask_count_all" not in bugs:
            count = sum(int(mask[i * S + 1: i * S + S + 1].sum())
                        for mi in range(micro) for i in rows_of(mi))
        for mi in range(micro):
            rows = rows_of(mi)
            sample = torch.stack([toks[i * S: i * S + S + 1] for i in rows])
            target = sample[:, 1:].clone()
            if mask is not None:  # a masked target is ignored (-100)
                keep = torch.stack([mask[i * S + 1: i * S + S + 1] for i in rows])
                target[keep == 0] = -100
            logits, routers = m.forward(sample[:, :-1])
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   target.reshape(-1), reduction="sum")
            aux = m.aux_loss(routers)
            obj = ce / count
            if m.coef and "no_aux" not in bugs:
                obj = obj + m.coef * aux / micro
                aux_total += aux.item() / micro
            obj.backward()
            ce_total += ce.item()
        loss = ce_total / count + (m.coef * aux_total)
        gnorm = math.sqrt(sum(float((m.p[n].grad ** 2).sum())
                              for n in names if m.p[n].grad is not None))
        coef = 1.0 if a.max_grad_norm <= 0 or "no_clip" in bugs else \
            min(1.0, a.max_grad_norm / (gnorm + 1e-6))
        if step == 1 and a.grad_norms:  # per tensor, for finding which one differs
            with open(a.grad_norms + "." + os.path.basename(os.path.normpath(model_dir)), "w") as f:
                json.dump({n: float(m.p[n].grad.norm()) if m.p[n].grad is not None else 0.0
                           for n in names}, f, indent=1, sort_keys=True)
        lr = lr_at(a, step, bugs)
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        if "no_bias_correction" in bugs:
            bc1 = bc2 = 1.0
        with torch.no_grad():
            for n in names:
                p, g = m.p[n], m.p[n].grad
                if g is None:
                    g = torch.zeros_like(p)
                g = g * coef
                m1, m2 = state[n]
                m1.mul_(b1).add_((1 - b1) * g)
                m2.mul_(b2).add_((1 - b2) * g * g)
                # meshtrain's no_decay: norm weights and biases (Megatron's 1-D rule)
                decay = not (n.endswith("norm.weight") or n.endswith(".bias"))
                wd = a.weight_decay if decay and "no_weight_decay" not in bugs else 0.0
                p.sub_(lr * wd * p + (lr / bc1) * m1 / (m2.sqrt() / math.sqrt(bc2) + a.eps))
        lines.append(json.dumps({"step": step, "loss": loss, "grad_norm": gnorm,
                                 "lr": lr, "aux_loss": aux_total}))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", action="append", default=[],
                    help="MODEL_DIR:OUT.jsonl[:BUG,BUG...]")
    ap.add_argument("--bugs", action="store_true", help="list the planted bugs")
    ap.add_argument("--tokens", help="token file (default MODEL_DIR/tokens.bin)")
    ap.add_argument("--mask", help="the token file's loss mask (doc/data.md, Loss masks)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=2)
    ap.add_argument("--local-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=None, help="the schedule's (default --steps)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--decay", choices=("cosine", "linear", "constant"), default="cosine")
    ap.add_argument("--min-lr", type=float, default=0.0)
    ap.add_argument("--betas", type=lambda s: [float(v) for v in s.split(",")], default=[0.9, 0.95])
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--grad-norms", metavar="PREFIX",
                    help="write each tensor's step-1 gradient norm to PREFIX.<model dir name>")
    a = ap.parse_args()
    if a.bugs:
        for k, v in BUGS.items():
            print("%-20s %s" % (k, v))
        return 0
    if a.max_steps is None:
        a.max_steps = a.steps
    env = [b for b in os.environ.get("REF_BUG", "").split(",") if b]
    for job in a.job:
        parts = job.split(":")
        bugs = set(env + [b for b in (parts[2] if len(parts) > 2 else "").split(",") if b])
        unknown = bugs - set(BUGS)
        if unknown:
            raise SystemExit("unknown planted bug %s (see --bugs)" % ", ".join(sorted(unknown)))
        train(parts[0], parts[1], bugs, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
