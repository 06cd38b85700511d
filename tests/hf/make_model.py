#!/usr/bin/env python3
"""make_model.py: small random Hugging Face models of the families
meshtrain trains, for tests/hf/hf_families.sh and tests/hf/hf_reference.py
(doc/hf-reference.md).  Standard library only, so any python3 runs it.

  make_model.py FAMILY OUT_DIR [FAMILY OUT_DIR ...] [--seed N] [--tokens N]
  make_model.py --list

Each family's config.json has the field set of a published model's
config.json (named below), with the sizes shrunk (hidden 32-64, 2 layers,
vocabulary 256 or so, few experts) and its quirks kept: head_dim apart
from hidden / heads, a sliding window shorter than the test's 64-token
sequences, RoPE scaling whose thresholds fall inside the sequence, nonzero
biases.  The weights are random with scales that keep attention far from
uniform (q and k larger than an initialiser's), norm weights and biases
away from their defaults, so that each semantic the reference checks moves
the loss.  OUT_DIR gets config.json, the weights (model.safetensors, or
shards and model.safetensors.index.json for the families marked sharded),
in the family's dtype (F32 or BF16), and tokens.bin, an llm.c token file
of uniform random tokens below vocab_size.

It does not check that meshtrain accepts a family: hf_families.sh does.
"""
import json
import math
import os
import random
import struct
import sys

# Fields every config.json written by transformers carries.
COMMON = {"attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02,
          "use_cache": True, "transformers_version": "4.51.0"}


def llama3(**over):
    """Meta-Llama-3-8B: rope_theta 500000, no rope_scaling, untied."""
    c = dict(COMMON, architectures=["LlamaForCausalLM"], model_type="llama",
             attention_bias=False, mlp_bias=False, bos_token_id=128000, eos_token_id=128001,
             hidden_size=64, intermediate_size=160, max_position_embeddings=8192,
             num_attention_heads=4, num_hidden_layers=2, num_key_value_heads=2,
             pretraining_tp=1, rms_norm_eps=1e-05, rope_scaling=None, rope_theta=500000.0,
             tie_word_embeddings=False, torch_dtype="bfloat16", vocab_size=256)
    c.update(over)
    return c


def llama31():
    """Llama-3.1-8B: rope_scaling llama3 (factor 8, low 1, high 4).  Its
    original_max_position_embeddings (8192 there) is 128 here, so that with
    head_dim 16 and rope_theta 500000 the wavelengths fall in all three of
    llama3's bands: unscaled (< 32), smoothed (32..128) and divided (> 128)."""
    return llama3(eos_token_id=[128001, 128008, 128009], max_position_embeddings=131072,
                  rope_scaling={"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 128,
                                "rope_type": "llama3"})


def llama32():
    """Llama-3.2-1B: tied embeddings, head_dim written out, llama3 factor 32."""
    return llama3(hidden_size=64, intermediate_size=128, head_dim=16, num_attention_heads=4,
                  num_key_value_heads=1, eos_token_id=128001, max_position_embeddings=131072,
                  rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 128,
                                "rope_type": "llama3"},
                  tie_word_embeddings=True)


def rope_variant(rope_type, **scaling):
    """A Llama-3 config with another rope_type (transformers' names)."""
    def make():
        c = llama3(rope_theta=10000.0)
        c["rope_scaling"] = dict(scaling, rope_type=rope_type)
        if rope_type == "dynamic":
            # dynamic NTK only acts on sequences longer than
            # max_position_embeddings: 32 against the test's 64
            c["max_position_embeddings"] = 32
        if rope_type == "yarn":
            # without original_max_position_embeddings, whose reading
            # transformers versions differ on (doc/hf-reference.md),
            # max_position_embeddings sets the correction range; with it,
            # 128 / 32 against the explicit factor tells the readings apart
            given = "original_max_position_embeddings" in scaling
            c["max_position_embeddings"] = 128 if given else 32
        return c
    return make


def qwen25():
    """Qwen2.5-0.5B: biases on q, k and v (none on o), tied, no sliding window."""
    return dict(COMMON, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                bos_token_id=151643, eos_token_id=151643, hidden_size=64,
                intermediate_size=128, max_position_embeddings=32768, max_window_layers=2,
                num_attention_heads=4, num_hidden_layers=2, num_key_value_heads=2,
                rms_norm_eps=1e-06, rope_scaling=None, rope_theta=1000000.0, sliding_window=32768,
                tie_word_embeddings=True, torch_dtype="bfloat16", use_mrope=False,
                use_sliding_window=False, vocab_size=256)


def qwen3(**over):
    """Qwen3-0.6B: head_dim 16 where hidden / heads is 8 (128 vs 1024 / 16
    there), q/k RMSNorm per head, tied, stored as bfloat16."""
    c = dict(COMMON, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
             attention_bias=False, bos_token_id=151643, eos_token_id=151645, head_dim=16,
             hidden_size=32, intermediate_size=96, max_position_embeddings=40960,
             max_window_layers=2, num_attention_heads=4, num_hidden_layers=2,
             num_key_value_heads=2, rms_norm_eps=1e-06, rope_scaling=None,
             rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=True,
             torch_dtype="bfloat16", use_sliding_window=False, vocab_size=256)
    c.update(over)
    return c


def mistral():
    """Mistral-7B-v0.1: sliding_window 16 (4096 there) below the sequence."""
    return dict(COMMON, architectures=["MistralForCausalLM"], model_type="mistral",
                bos_token_id=1, eos_token_id=2, hidden_size=64, intermediate_size=160,
                max_position_embeddings=32768, num_attention_heads=4, num_hidden_layers=2,
                num_key_value_heads=2, rms_norm_eps=1e-05, rope_theta=10000.0,
                sliding_window=16, tie_word_embeddings=False, torch_dtype="bfloat16",
                vocab_size=192)


def qwen3_moe(**over):
    """Qwen3-30B-A3B: 8 experts (128 there) top 2 (8), norm_topk_prob,
    head_dim 16 where hidden / heads is 8."""
    c = dict(COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
             attention_bias=False, bos_token_id=151643, decoder_sparse_step=1,
             eos_token_id=151645, head_dim=16, hidden_size=32, intermediate_size=96,
             max_position_embeddings=40960, max_window_layers=2, mlp_only_layers=[],
             moe_intermediate_size=24, norm_topk_prob=True, num_attention_heads=4,
             num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_key_value_heads=2,
             output_router_logits=False, rms_norm_eps=1e-06, rope_scaling=None,
             rope_theta=1000000.0, router_aux_loss_coef=0.001, sliding_window=None,
             tie_word_embeddings=False, torch_dtype="bfloat16", use_sliding_window=False,
             vocab_size=256)
    c.update(over)
    return c


def mixtral():
    """Mixtral-8x7B-v0.1: block_sparse_moe, 4 experts (8) top 2, always renormalised."""
    return dict(COMMON, architectures=["MixtralForCausalLM"], model_type="mixtral",
                bos_token_id=1, eos_token_id=2, hidden_size=64, intermediate_size=48,
                max_position_embeddings=32768, num_attention_heads=4, num_experts_per_tok=2,
                num_hidden_layers=2, num_key_value_heads=2, num_local_experts=4,
                output_router_logits=False, rms_norm_eps=1e-05, rope_theta=1000000.0,
                router_aux_loss_coef=0.02, router_jitter_noise=0.0, sliding_window=None,
                tie_word_embeddings=False, torch_dtype="bfloat16", vocab_size=192)


def olmoe():
    """OLMoE-1B-7B-0924: q/k RMSNorm over the whole projection, 8 experts
    (64) top 2 (8), norm_topk_prob false."""
    return dict(COMMON, architectures=["OlmoeForCausalLM"], model_type="olmoe",
                attention_bias=False, bos_token_id=None, clip_qkv=None, eos_token_id=50279,
                hidden_size=32, intermediate_size=24, max_position_embeddings=4096,
                norm_topk_prob=False, num_attention_heads=4, num_experts=8,
                num_experts_per_tok=2, num_hidden_layers=2, num_key_value_heads=4,
                output_router_logits=False, pad_token_id=1, rms_norm_eps=1e-05,
                rope_scaling=None, rope_theta=10000.0, router_aux_loss_coef=0.01,
                tie_word_embeddings=False, torch_dtype="bfloat16", vocab_size=256)


# name: (config, stored dtype, shards)
FAMILIES = {
    # what meshtrain imports today
    "llama3": (llama3, "F32", 3),
    "qwen3_hd": (lambda: qwen3(head_dim=16, hidden_size=64, intermediate_size=128), "BF16", 1),
    "qwen3_moe_hd": (lambda: qwen3_moe(head_dim=8), "F32", 1),
    # the published configs' quirks
    "llama31": (llama31, "BF16", 1),
    "llama32": (llama32, "F32", 1),
    "qwen25": (qwen25, "F32", 2),
    "qwen3": (qwen3, "BF16", 1),
    "mistral": (mistral, "F32", 1),
    "qwen3_moe": (qwen3_moe, "F32", 2),
    "mixtral": (mixtral, "F32", 1),
    "olmoe": (olmoe, "F32", 1),
    "rope_linear": (rope_variant("linear", factor=4.0), "F32", 1),
    "rope_dynamic": (rope_variant("dynamic", factor=2.0), "F32", 1),
    "rope_yarn": (rope_variant("yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0), "F32", 1),
    "rope_yarn_orig": (rope_variant("yarn", factor=2.0, original_max_position_embeddings=32),
                       "F32", 1),
}


def tensors(c):
    """(name, shape, kind) of the model's tensors in Hugging Face order."""
    arch = c["architectures"][0]
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    nh = c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd = c.get("head_dim") or H // nh
    qwen2 = arch == "Qwen2ForCausalLM"
    qkv_bias = qwen2 or c.get("attention_bias", False)
    o_bias = c.get("attention_bias", False) and not qwen2
    out = [("model.embed_tokens.weight", [V, H], "embed")]
    for l in range(L):
        p = "model.layers.%d." % l
        out.append((p + "input_layernorm.weight", [H], "norm"))
        for n, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
            out.append((p + "self_attn.%s_proj.weight" % n, [rows, H], n))
            if qkv_bias:
                out.append((p + "self_attn.%s_proj.bias" % n, [rows], "bias"))
        out.append((p + "self_attn.o_proj.weight", [H, nh * hd], "o"))
        if o_bias:
            out.append((p + "self_attn.o_proj.bias", [H], "bias"))
        if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            out += [(p + "self_attn.q_norm.weight", [hd], "norm"),
                    (p + "self_attn.k_norm.weight", [hd], "norm")]
        if arch == "OlmoeForCausalLM":
            out += [(p + "self_attn.q_norm.weight", [nh * hd], "norm"),
                    (p + "self_attn.k_norm.weight", [nkv * hd], "norm")]
        out.append((p + "post_attention_layernorm.weight", [H], "norm"))
        E = c.get("num_experts") or c.get("num_local_experts") or 0
        step = c.get("decoder_sparse_step", 1) or 1
        dense = E == 0 or l in (c.get("mlp_only_layers") or []) or (l + 1) % step != 0
        if dense:
            I = c["intermediate_size"]
            for n, shape in (("gate", [I, H]), ("up", [I, H]), ("down", [H, I])):
                out.append((p + "mlp.%s_proj.weight" % n, shape, n))
                if c.get("mlp_bias", False):
                    out.append((p + "mlp.%s_proj.bias" % n, shape[:1], "bias"))
        elif arch == "MixtralForCausalLM":
            I = c["intermediate_size"]
            out.append((p + "block_sparse_moe.gate.weight", [E, H], "router"))
            for e in range(E):
                q = p + "block_sparse_moe.experts.%d." % e
                out += [(q + "w1.weight", [I, H], "gate"), (q + "w2.weight", [H, I], "down"),
                        (q + "w3.weight", [I, H], "up")]
        else:
            I = c.get("moe_intermediate_size") or c["intermediate_size"]
            out.append((p + "mlp.gate.weight", [E, H], "router"))
            for e in range(E):
                q = p + "mlp.experts.%d." % e
                out += [(q + "gate_proj.weight", [I, H], "gate"),
                        (q + "up_proj.weight", [I, H], "up"),
                        (q + "down_proj.weight", [H, I], "down")]
    out.append(("model.norm.weight", [H], "norm"))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [V, H], "head"))
    return out


def values(name, shape, kind, seed):
    """Random values; q and k twice an initialiser's scale so attention is
    sharp, norm weights and biases visibly away from 1 and 0."""
    rng = random.Random("%d:%s" % (seed, name))
    n = 1
    for s in shape:
        n *= s
    fan_in = shape[1] if len(shape) > 1 else 1
    if kind == "norm":
        return [1.0 + 0.2 * rng.gauss(0, 1) for _ in range(n)]
    std = {"bias": 0.2, "q": 2.0 / math.sqrt(fan_in), "k": 2.0 / math.sqrt(fan_in),
           "router": 2.0 / math.sqrt(fan_in)}.get(kind, 1.0 / math.sqrt(fan_in))
    return [std * rng.gauss(0, 1) for _ in range(n)]


def bf16_bits(x):
    """float -> bfloat16 bits, round to nearest even (finite values)."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def encode(vals, dtype):
    if dtype == "F32":
        return struct.pack("<%df" % len(vals), *vals)
    return struct.pack("<%dH" % len(vals), *[bf16_bits(v) for v in vals])


def write_safetensors(path, items, dtype):
    """items: (name, shape, bytes); the data 8-byte aligned, in order."""
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, data in items:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    text = json.dumps(hdr, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for _, _, data in items:
            f.write(data)


def write_tokens(path, n, vocab, seed):
    """An llm.c token file (doc/data.md): 256 int32 header, uint16 tokens."""
    rng = random.Random("%d:tokens" % seed)
    head = struct.pack("<3i", 20240520, 1, n) + b"\0" * (1024 - 12)
    with open(path, "wb") as f:
        f.write(head)
        f.write(struct.pack("<%dH" % n, *[rng.randrange(vocab) for _ in range(n)]))


def make(fam, out, seed, ntok):
    build, dtype, nshards = FAMILIES[fam]
    c = build()
    c["torch_dtype"] = "float32" if dtype == "F32" else "bfloat16"
    os.makedirs(out, exist_ok=True)
    items = [(n, s, encode(values(n, s, k, seed), dtype)) for n, s, k in tensors(c)]
    if nshards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), items, dtype)
    else:
        per = (len(items) + nshards - 1) // nshards
        wmap, total = {}, 0
        for i in range(nshards):
            fname = "model-%05d-of-%05d.safetensors" % (i + 1, nshards)
            part = items[i * per:(i + 1) * per]
            write_safetensors(os.path.join(out, fname), part, dtype)
            for n, _, data in part:
                wmap[n] = fname
                total += len(data)
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    write_tokens(os.path.join(out, "tokens.bin"), ntok, c["vocab_size"], seed)


def main(argv):
    if argv[1:] == ["--list"]:
        print(" ".join(FAMILIES))
        return 0
    args, opts = [], {}
    it = iter(argv[1:])
    for a in it:
        if a in ("--seed", "--tokens"):
            opts[a] = int(next(it, "0"))
        else:
            args.append(a)
    pairs = list(zip(args[0::2], args[1::2]))
    if not pairs or len(args) % 2 or any(f not in FAMILIES for f, _ in pairs):
        sys.stderr.write("usage: make_model.py FAMILY OUT_DIR [FAMILY OUT_DIR ...] "
                         "[--seed N] [--tokens N]\nfamilies: %s\n" % " ".join(FAMILIES))
        return 2
    for fam, out in pairs:
        make(fam, out, opts.get("--seed", 1), opts.get("--tokens", 1025))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
