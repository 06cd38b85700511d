#!/bin/sh
# recipe_train.sh: an AutoModel recipe, scaled down, trains on 2 CPU ranks
# with AutoModel's meaning (doc/automodel-recipes.md): device auto is said
# in one line, the ignored keys in another, no lr_scheduler section keeps
# the LR constant, checkpoints are on by default.  A Python-built dataset
# and an epoch bound that comes before max_steps are refused by the trainer
# with one message each, exit 1, on every rank.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
w=$workdir
cat > "$w/recipe.yaml" <<EOT
recipe: TrainFinetuneRecipeForNextTokenPrediction
step_scheduler:
  global_batch_size: 8
  local_batch_size: 2
  max_steps: 2
  num_epochs: 1
  ckpt_every_steps: 1000
  gc_every_steps: 100
dist_env:
  backend: nccl
  timeout_minutes: 1
rng:
  _target_: nemo_automodel.components.training.rng.StatefulRNG
  seed: 1111
  ranked: true
model:
  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_config
  vocab_size: 258
  hidden_size: 64
  intermediate_size: 160
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  torch_dtype: bfloat16
distributed:
  _target_: nemo_automodel.components.distributed.fsdp2.FSDP2Manager
  dp_size: none
  dp_replicate_size: 1
  tp_size: 1
  cp_size: null
  sequence_parallel: false
loss_fn:
  _target_: nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy
dataset:
  _target_: nemo_automodel.components.datasets.llm.nanogpt_dataset.NanogptDataset
  file_pattern: $data
  seq_len: 64
dataloader:
  _target_: torchdata.stateful_dataloader.StatefulDataLoader
  shuffle: false
optimizer:
  _target_: torch.optim.AdamW
  betas: [0.9, 0.999]
  lr: 1.0e-3
  weight_decay: 0.1
checkpoint:
  enabled: true
  checkpoint_dir: $w/ckpt
ci:
  recipe_owner: nobody
EOT
expect_rc 0 np 2 "$bindir/meshtrain-dense" --config "$w/recipe.yaml" logging.metrics_file="$w/m.jsonl"
all="$out
$err"
expect_in "$all" "distributed.device: auto is cpu" "the device, said once"
expect_in "$all" "ignored (AutoModel keys that cannot change the numerics): " "the ignored line"
expect_in "$all" "dist_env.backend" "dist_env.backend ignored"
[ -d "$w/ckpt/step_00000002" ] || fail "checkpoint.enabled: the step-2 checkpoint is missing"
n=$(grep -c '"step"' "$w/m.jsonl" 2>/dev/null)
[ "$n" = 2 ] || fail "expected 2 steps in the metrics, got $n"
# no lr_scheduler section: the LR stays optimizer.lr at every step
lrs=$(python3 -c 'import json,sys; print(sorted({json.loads(l)["lr"] for l in open(sys.argv[1])}))' "$w/m.jsonl")
[ "$lrs" = "[0.001]" ] || fail "constant LR without lr_scheduler: expected [0.001], got $lrs"

# an lr_scheduler section: AutoModel's OptimizerParamScheduler, its
# defaults (init_lr 0.1 lr, min_lr 0.01 lr), step s at its num_steps s - 1
printf 'lr_scheduler:\n  lr_warmup_steps: 2\n  lr_decay_style: cosine\n' > "$w/lr.yaml"
cat "$w/recipe.yaml" "$w/lr.yaml" > "$w/recipe-lr.yaml"
expect_rc 0 np 2 "$bindir/meshtrain-dense" --config "$w/recipe-lr.yaml" step_scheduler.max_steps=6 \
    checkpoint.enabled=false logging.metrics_file="$w/lr.jsonl"
cat > "$w/lr.py" <<'EOT'
import json, math, sys
def automodel_lr(n, lr=1e-3, warm=2, decay=6):
    init, lo = 0.1 * lr, 0.01 * lr
    if warm > 0 and n <= warm:
        return init + (lr - init) * n / warm
    if n > decay:
        return lo
    r = (n - warm) / (decay - warm)
    return lo + 0.5 * (math.cos(math.pi * r) + 1.0) * (lr - lo)
got = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    got[d["step"]] = d["lr"]
bad = [(s, v, automodel_lr(s - 1)) for s, v in sorted(got.items())
       if abs(v - automodel_lr(s - 1)) > 1e-9 * 1e-3]
print("%d steps, %d differ %s" % (len(got), len(bad), bad))
sys.exit(1 if bad or len(got) != 6 else 0)
EOT
expect_rc 0 python3 "$w/lr.py" "$w/lr.jsonl"

# AutoModel decays every parameter: after one step with weight_decay 0.1
# at lr 1e-3, the norm weights (ones at start) differ from a run that
# exempts them by exactly lr x wd; every other tensor is the same (fp32
# compute: the consolidated copy is in the compute dtype, and bf16 cannot
# show 1e-4 next to 1)
for d in true false; do
    expect_rc 0 np 2 "$bindir/meshtrain-dense" --config "$w/recipe.yaml" step_scheduler.max_steps=1 \
        distributed.mp_policy.param_dtype=float32 distributed.mp_policy.output_dtype=float32 \
        checkpoint.checkpoint_dir="$w/wd-$d" checkpoint.save_consolidated=true \
        optimizer.decay_every_parameter=$d logging.metrics_file="$w/wd-$d.jsonl"
done
cat > "$w/wd.py" <<'EOT'
import glob, json, struct, sys
def tensors(d):
    out = {}
    for f in glob.glob(d + "/step_00000001/model/consolidated/*.safetensors"):
        raw = open(f, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        head = json.loads(raw[8:8 + n])
        for k, v in head.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            buf = raw[8 + n + a:8 + n + b]
            if v["dtype"] == "F32":
                out[k] = struct.unpack("<%df" % (len(buf) // 4), buf)
            elif v["dtype"] == "BF16":
                out[k] = [struct.unpack("<f", b"\0\0" + buf[i:i + 2])[0] for i in range(0, len(buf), 2)]
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
bad, norms = [], 0
for k in sorted(a):
    want = -1e-3 * 0.1 if k.endswith("norm.weight") else 0.0
    norms += k.endswith("norm.weight")
    worst = max(abs((x - y) - want) for x, y in zip(a[k], b[k])) if want else \
        max(abs(x - y) for x, y in zip(a[k], b[k]))
    if worst > 2e-6:
        bad.append((k, worst))
print("%d tensors, %d norm weights, differing: %s" % (len(a), norms, bad))
sys.exit(1 if bad or not norms or set(a) != set(b) else 0)
EOT
expect_rc 0 python3 "$w/wd.py" "$w/wd-true" "$w/wd-false"
echo "$out"

# an uneven pipeline split as AutoModel makes it (3 layers on 2 stages:
# 2 and 1) trains as the 1-rank run does
sed 's/^  num_hidden_layers: 2$/  num_hidden_layers: 3/' "$w/recipe.yaml" > "$w/pp.yaml"
printf '  pp_size: 2\n  pipeline:\n    pp_schedule: 1F1B\n    pp_microbatch_size: 1\n' > "$w/pp.txt"
sed '/^  sequence_parallel: false$/r '"$w/pp.txt" "$w/pp.yaml" > "$w/pp2.yaml"
for n in 1 2; do
    expect_rc 0 np $n "$bindir/meshtrain-dense" --config "$w/pp2.yaml" step_scheduler.max_steps=2 \
        checkpoint.enabled=false logging.metrics_file="$w/pp$n.jsonl" \
        distributed.mp_policy.param_dtype=float32 distributed.mp_policy.output_dtype=float32 \
        $( [ $n = 1 ] && echo distributed.pp_size=1 )
done
compare_losses "$w/pp1.jsonl" "$w/pp2.jsonl" "uneven pp split against 1 rank"

# the trainer refuses a dataset built by Python code, in one message, exit 1
sed 's#^  _target_: nemo_automodel.components.datasets.llm.nanogpt_dataset.NanogptDataset#  _target_: nemo_automodel.components.datasets.llm.squad.make_squad_dataset#' \
    "$w/recipe.yaml" > "$w/squad.yaml"
expect_rc 1 np 2 "$bindir/meshtrain-dense" --config "$w/squad.yaml" checkpoint.checkpoint_dir="$w/ck2"
expect_in "$err" "dataset._target_ make_squad_dataset is built by Python code: convert the data with meshtrain-data" "Python dataset refused"
[ -d "$w/ck2" ] && fail "a refused run wrote $w/ck2"
# meshtrain-plan plans it (the plan does not depend on the data) and says so
expect_rc 0 "$bindir/meshtrain-plan" --config "$w/squad.yaml" --world-size 2
expect_in "$err" "training refuses it" "plan notes the data"

# an epoch bound before max_steps: refused with the max_steps that says it
expect_rc 1 np 2 "$bindir/meshtrain-dense" --config "$w/recipe.yaml" step_scheduler.max_steps=100000 \
    checkpoint.checkpoint_dir="$w/ck3"
expect_in "$err" "step_scheduler.num_epochs 1:" "epochs bind"
expect_in "$err" "set step_scheduler.max_steps:" "the max_steps to write"
echo "recipe_train.sh: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
