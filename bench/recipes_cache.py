#!/usr/bin/env python3
"""recipes_cache.py: a local Hugging Face hub cache holding only the
config.json of the models that AutoModel's LLM recipes name (Llama 3.x,
Qwen2/2.5/3, Qwen3-MoE, Mistral, Mixtral), for bench/recipes.sh.  The
sizes are the published config.json values of each model; fields that do
not change the shape or the numerics are left out.  No weights.

  recipes_cache.py CACHE_DIR     (writes CACHE_DIR/models--org--name/...)
  recipes_cache.py --list        (the model ids, one a line)
"""
import json
import os
import sys

LLAMA32_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA31_ROPE = dict(LLAMA32_ROPE, factor=8.0)


def llama(h, inter, layers, heads, kv, tie, rope, head_dim=None):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
         "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
         "num_key_value_heads": kv, "vocab_size": 128256, "max_position_embeddings": 131072,
         "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": tie,
         "rope_scaling": rope, "attention_bias": False, "mlp_bias": False,
         "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 128000,
         "eos_token_id": 128001}
    if head_dim:
        c["head_dim"] = head_dim
    return c


def qwen2(h, inter, layers, heads, kv, vocab, tie, max_pos=32768):
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": h,
            "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
            "max_position_embeddings": max_pos, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": tie, "use_sliding_window": False, "sliding_window": max_pos,
            "hidden_act": "silu", "torch_dtype": "bfloat16"}


def qwen3(h, inter, layers, heads, kv, tie):
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": h,
            "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 128,
            "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": tie, "attention_bias": False,
            "use_sliding_window": False, "sliding_window": None, "hidden_act": "silu",
            "torch_dtype": "bfloat16"}


def qwen3_moe(h, inter, moe_inter, layers, heads, kv, experts, topk):
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": h, "intermediate_size": inter, "moe_intermediate_size": moe_inter,
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": 128, "num_experts": experts,
            "num_experts_per_tok": topk, "norm_topk_prob": True, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "router_aux_loss_coef": 0.001, "vocab_size": 151936,
            "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "attention_bias": False, "use_sliding_window": False,
            "sliding_window": None, "hidden_act": "silu", "torch_dtype": "bfloat16"}


def mistral(h, inter, layers, heads, kv, vocab, theta, window, head_dim=None, max_pos=32768):
    c = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": h,
         "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
         "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": max_pos,
         "rope_theta": theta, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
         "sliding_window": window, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    if head_dim:
        c["head_dim"] = head_dim
    return c


def mixtral():
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
            "router_aux_loss_coef": 0.02, "vocab_size": 32000, "max_position_embeddings": 32768,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "sliding_window": None, "hidden_act": "silu", "torch_dtype": "bfloat16"}


MODELS = {
    "meta-llama/Llama-3.2-1B": llama(2048, 8192, 16, 32, 8, True, LLAMA32_ROPE, 64),
    "meta-llama/Llama-3.2-1B-Instruct": llama(2048, 8192, 16, 32, 8, True, LLAMA32_ROPE, 64),
    "meta-llama/Llama-3.2-3B-Instruct": llama(3072, 8192, 28, 24, 8, True, LLAMA32_ROPE, 128),
    "meta-llama/Llama-3.1-8B": llama(4096, 14336, 32, 32, 8, False, LLAMA31_ROPE),
    "meta-llama/Llama-3.1-8B-Instruct": llama(4096, 14336, 32, 32, 8, False, LLAMA31_ROPE),
    "meta-llama/Llama-3.1-70B": llama(8192, 28672, 80, 64, 8, False, LLAMA31_ROPE),
    "meta-llama/Llama-3.3-70B-Instruct": llama(8192, 28672, 80, 64, 8, False, LLAMA31_ROPE),
    "Qwen/Qwen2.5-0.5B": qwen2(896, 4864, 24, 14, 2, 151936, True),
    "Qwen/Qwen2.5-0.5B-Instruct": qwen2(896, 4864, 24, 14, 2, 151936, True),
    "Qwen/Qwen2.5-3B": qwen2(2048, 11008, 36, 16, 2, 151936, True),
    "Qwen/Qwen2.5-7B": qwen2(3584, 18944, 28, 28, 4, 152064, False, 131072),
    "Qwen/Qwen2.5-7B-Instruct": qwen2(3584, 18944, 28, 28, 4, 152064, False),
    "Qwen/Qwen2.5-32B-Instruct": qwen2(5120, 27648, 64, 40, 8, 152064, False),
    "Qwen/QwQ-32B": qwen2(5120, 27648, 64, 40, 8, 152064, False, 40960),
    "Qwen/Qwen3-0.6B": qwen3(1024, 3072, 28, 16, 8, True),
    "Qwen/Qwen3-4B-Base": qwen3(2560, 9728, 36, 32, 8, True),
    "Qwen/Qwen3-8B": qwen3(4096, 12288, 36, 32, 8, False),
    "Qwen/Qwen3-32B": qwen3(5120, 25600, 64, 64, 8, False),
    "Qwen/Qwen3-30B-A3B": qwen3_moe(2048, 6144, 768, 48, 32, 4, 128, 8),
    "Qwen/Qwen3-30B-A3B-Base": qwen3_moe(2048, 6144, 768, 48, 32, 4, 128, 8),
    "Qwen/Qwen3-30B-A3B-Thinking-2507": qwen3_moe(2048, 6144, 768, 48, 32, 4, 128, 8),
    "Qwen/Qwen3-235B-A22B": qwen3_moe(4096, 12288, 1536, 94, 64, 4, 128, 8),
    "mistralai/Mistral-7B-v0.1": mistral(4096, 14336, 32, 32, 8, 32000, 10000.0, 4096),
    "mistralai/Mistral-Nemo-Base-2407": mistral(5120, 14336, 40, 32, 8, 131072, 1000000.0,
                                                None, 128, 128000),
    "mistralai/Mixtral-8x7B-v0.1": mixtral(),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": mixtral(),
}

COMMIT = "0" * 40


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    if argv[1] == "--list":
        print("\n".join(MODELS))
        return
    for name, cfg in MODELS.items():
        repo = os.path.join(argv[1], "models--" + name.replace("/", "--"))
        snap = os.path.join(repo, "snapshots", COMMIT)
        os.makedirs(snap, exist_ok=True)
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", "main"), "w") as f:
            f.write(COMMIT)
        with open(os.path.join(snap, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
