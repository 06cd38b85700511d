#!/bin/sh
# bench_load.sh: loading a model by name at start against reading its
# bytes (make bench-load; doc/performance.md).
#
# A Llama-3.2-1B-shaped model (vocab 128256, hidden 2048, 16 layers, tied
# embeddings: 1.24B parameters, 2.47 GB of bfloat16 in two shards and an
# index) of random bytes in the real layout is written once into a hub
# cache, BENCH_LOAD_CACHE (default ./bench-load-cache).  Then, warm cache
# (dropping the page cache needs root, so cold figures are not measured):
# `cat` of the shards to /dev/null, and bench_load (mt_hf_load_weights, the
# trainer's loader: pread, bf16 -> float32, each rank its rows of every
# tensor) on 1 rank and on 2 ranks.  Best of REPEATS (default 3), in wall
# seconds and in CPU seconds (user + system, all ranks), which a shared
# machine's other load disturbs less.
set -e
: "${srcdir:=.}"
: "${MPIEXEC:=mpiexec}"
: "${MPIEXEC_NP:=-n}"
: "${REPEATS:=3}"
cache=${BENCH_LOAD_CACHE:-bench-load-cache}
commit=1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b
snap="$cache/models--bench--llama-1b/snapshots/$commit"
if [ ! -f "$snap/model.safetensors.index.json" ]; then
    echo "bench_load: writing the model into $snap (once)"
    python3 - "$snap" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
V, H, I, L, nh, kv = 128256, 2048, 8192, 16, 32, 8
hd = H // nh
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
       "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L,
       "num_attention_heads": nh, "num_key_value_heads": kv, "hidden_act": "silu",
       "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
       "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
t = [("model.embed_tokens.weight", [V, H])]
for l in range(L):
    p = "model.layers.%d." % l
    t += [(p + "input_layernorm.weight", [H]), (p + "self_attn.q_proj.weight", [nh * hd, H]),
          (p + "self_attn.k_proj.weight", [kv * hd, H]), (p + "self_attn.v_proj.weight", [kv * hd, H]),
          (p + "self_attn.o_proj.weight", [H, nh * hd]), (p + "post_attention_layernorm.weight", [H]),
          (p + "mlp.gate_proj.weight", [I, H]), (p + "mlp.up_proj.weight", [I, H]),
          (p + "mlp.down_proj.weight", [H, I])]
t.append(("model.norm.weight", [H]))
shards = [t[:len(t) // 2], t[len(t) // 2:]]
os.makedirs(d, exist_ok=True)
wm = {}
total = 0
for k, part in enumerate(shards):
    name = "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
    hdr, pos = {"__metadata__": {"format": "pt"}}, 0
    for n, shape in part:
        b = 2
        for x in shape:
            b *= x
        hdr[n] = {"dtype": "BF16", "shape": shape, "data_offsets": [pos, pos + b]}
        pos += b
        wm[n] = name
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        left = pos
        while left:
            n = min(left, 64 << 20)
            f.write(os.urandom(n))
            left -= n
    total += pos
json.dump({"metadata": {"total_size": total}, "weight_map": wm},
          open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)
json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
PY
    mkdir -p "$cache/models--bench--llama-1b/refs"
    printf '%s' "$commit" > "$cache/models--bench--llama-1b/refs/main"
fi
files="$snap/model-00001-of-00002.safetensors $snap/model-00002-of-00002.safetensors"
cat $files > /dev/null # warm the page cache
# best of REPEATS: wall seconds, and user + system CPU seconds
best= cpu=
for r in $(seq "$REPEATS"); do
    set -- $(python3 - $files <<'PY'
import os, subprocess, sys, time
t0, c0 = time.time(), os.times()
subprocess.run(["cat"] + sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
t1, c1 = time.time(), os.times()
print(t1 - t0, (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system))
PY
)
    best=$(python3 -c 'import sys; a=sys.argv[1:]; print(a[0] if not a[1] or float(a[0]) < float(a[1]) else a[1])' "$1" "$best")
    cpu=$(python3 -c 'import sys; a=sys.argv[1:]; print(a[0] if not a[1] or float(a[0]) < float(a[1]) else a[1])' "$2" "$cpu")
done
bytes=$(cat $files | wc -c)
printf 'cat of the shards (%s bytes, warm): %.3f s, %.2f GB/s, %.3f CPU s\n' "$bytes" "$best" \
    "$(python3 -c "print($bytes / $best / 1e9)")" "$cpu"
for np in 1 2; do
    HF_HUB_CACHE="$cache" "$MPIEXEC" $MPIEXEC_NP "$np" bench/bench_load bench/llama-1b "$REPEATS" \
        > bench-load.out
    cat bench-load.out
    lb=$(awk '/^bench_load:/ {print $4}' bench-load.out | sort -g | head -1)
    lc=$(awk '/^bench_load:/ {print $(NF-2)}' bench-load.out | sort -g | head -1)
    printf 'load by name, %d rank%s (warm): best %.3f s, %.2fx the cat time; %.3f CPU s, %.2fx cat'"'"'s\n' \
        "$np" "$([ "$np" = 1 ] || echo s)" "$lb" "$(python3 -c "print($lb / $best)")" "$lc" \
        "$(python3 -c "print($lc / max($cpu, 1e-9))")"
done
rm -f bench-load.out
