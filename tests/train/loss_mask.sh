#!/bin/sh
# loss_mask.sh: per-token loss masks (PATH.lossmask, doc/data.md) in
# training.  The loss is the mean over unmasked targets with the global
# count, on every mesh:
#  - an independent float64 PyTorch computation (tests/hf/hf_reference.py
#    --mask) of 3 steps of a random Llama on a striped mask agrees with
#    meshtrain to 1e-6 (step 1) and 1e-5, and the planted bug that still
#    counts the masked targets in the mean is seen (skipped without torch);
#  - an all-ones mask is bit-identical to no mask, and the striped mask
#    changes the losses (the mask is honoured);
#  - with the striped mask, the 1-rank run is computed by tp 2
#    (vocabulary-parallel loss), pp 2, fsdp2 dp 2, cp 2 on plain rows, and
#    meshtrain-moe's ep 2
#    by its 1-rank run; meshtrain-cp's packed rows (the mask moves with its
#    document) by cp 2 (ring attention) and by fsdp2 dp 2: 8 steps, step 1
#    within 1e-6, every step within 1e-5;
#  - a mask of zeros: every step is skipped with a warning, nothing divides
#    by zero; dataset.loss_mask required without a mask, a mask byte 2 and
#    a mask of the wrong length are refused with the file named; off
#    ignores the (bad) mask.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
helper="$abs_top_srcdir/tests/train/lossmask.py"
hf="$abs_top_srcdir/tests/hf"
cfg="$small_cfg"
w=$workdir

# ---- the reference: float64 PyTorch, the same masked mean
torch_py=
for py in ${PYTHON_TORCH:-} python3 /usr/bin/python3; do
    if "$py" -c 'import torch' >/dev/null 2>&1; then torch_py=$py; break; fi
done
if [ -n "$torch_py" ]; then
    expect_rc 0 python3 "$hf/make_model.py" llama3 "$w/m"
    expect_rc 0 python3 "$helper" mask "$w/m/tokens.bin" stripes
    cp "$testconfigs/hf-reference.yaml" "$w/base.yaml"
    expect_rc 0 "$bindir/meshtrain-dense" --config "$w/base.yaml" \
        model.pretrained_model_name_or_path="$w/m" dataset.path="$w/m/tokens.bin" \
        checkpoint.enabled=false logging.metrics_file="$w/mt.jsonl"
    expect_in "$out" "loss mask: yes" "the mask is logged"
    # shellcheck disable=SC2086
    expect_rc 0 timeout 300 "$torch_py" "$hf/hf_reference.py" $hf_ref_args \
        --mask "$w/m/tokens.bin.lossmask" --job "$w/m:$w/ref.jsonl" \
        --job "$w/m:$w/bug.jsonl:mask_count_all"
    compare_losses "$w/ref.jsonl" "$w/mt.jsonl" "masked loss: meshtrain = float64 reference"
    checks=$((checks + 1))
    python3 - "$w/ref.jsonl" "$w/bug.jsonl" <<'PY' || fail "the planted mask bug is not seen"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:])
assert abs(a[0] - b[0]) / a[0] > 1e-3, (a, b)
print(f"planted bug seen: step-1 loss {a[0]:.6f} vs {b[0]:.6f}")
PY
else
    echo "loss_mask.sh: no python3 with torch: the float64 reference is skipped"
fi

# ---- masks on the shipped corpus
cp "$data" "$w/c.bin"
cp "$data" "$w/ones.bin"
expect_rc 0 python3 "$helper" mask "$w/c.bin" stripes
expect_rc 0 python3 "$helper" mask "$w/ones.bin" ones
common="$parity_common step_scheduler.max_steps=8 checkpoint.enabled=false"
train plain 1
train ones 1 dataset.path="$w/ones.bin"
compare_losses "$w/plain.jsonl" "$w/ones.jsonl" "an all-ones mask is no mask" 0 0
common="$common dataset.path=$w/c.bin"
train r1 1 dataset.loss_mask=required
expect_in "$out" "c.bin: 1 file" "the data is logged"
expect_in "$out" "loss mask: yes" "the mask is logged"
checks=$((checks + 1))
python3 - "$w/plain.jsonl" "$w/r1.jsonl" <<'PY' || fail "the striped mask does not change the loss"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:])
assert all(abs(x - y) > 1e-4 for x, y in zip(a, b)), (a, b)
PY
train t2 2 distributed.tp_size=2
compare_losses "$w/r1.jsonl" "$w/t2.jsonl" "masked: tp 2"
train p2 2 distributed.pp_size=2 distributed.pipeline.pp_schedule=1f1b \
    distributed.pipeline.pp_microbatch_size=1
compare_losses "$w/r1.jsonl" "$w/p2.jsonl" "masked: pp 2"
train d2 2 distributed.strategy=fsdp2
compare_losses "$w/r1.jsonl" "$w/d2.jsonl" "masked: fsdp2 dp 2"
train c2 2 distributed.cp_size=2
compare_losses "$w/r1.jsonl" "$w/c2.jsonl" "masked: cp 2 (plain rows)"

moe="model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32
 model.norm_topk_prob=true model.router_aux_loss_coef=0.01"
app="$bindir/meshtrain-moe"
# shellcheck disable=SC2086
train m1 1 $moe
# shellcheck disable=SC2086
train e2 2 $moe distributed.ep_size=2
compare_losses "$w/m1.jsonl" "$w/e2.jsonl" "masked: moe ep 2"

app="$bindir/meshtrain-cp"
train k1 1 packed_sequence.packed_sequence_size=64
train k1u 1 packed_sequence.packed_sequence_size=64 dataset.loss_mask=off
checks=$((checks + 1))
python3 - "$w/k1u.jsonl" "$w/k1.jsonl" <<'PY' || fail "packed: the mask does not change the loss"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:])
assert all(abs(x - y) > 1e-4 for x, y in zip(a, b)), (a, b)
PY
train kc2 2 packed_sequence.packed_sequence_size=64 distributed.cp_size=2
compare_losses "$w/k1.jsonl" "$w/kc2.jsonl" "masked, packed: cp 2"
train kd2 2 packed_sequence.packed_sequence_size=64 distributed.strategy=fsdp2
compare_losses "$w/k1.jsonl" "$w/kd2.jsonl" "masked, packed: fsdp2 dp 2"
app=

# ---- nothing to average over, and bad masks
cp "$data" "$w/z.bin"
expect_rc 0 python3 "$helper" mask "$w/z.bin" zeros
train z 1 dataset.path="$w/z.bin" step_scheduler.max_steps=2
expect_in "$out" "warning: step 1: every target of the global batch is masked out" \
    "an all-masked step is skipped with a warning"
checks=$((checks + 1))
python3 - "$w/z.jsonl" <<'PY' || fail "an all-masked step: the metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2 and all(r["loss"] is None and r["grad_norm"] == 0 for r in rows), rows
PY
cp "$data" "$w/none.bin"
expect_rc 1 np 1 "$bindir/meshtrain-dense" --config "$cfg" $common dataset.path="$w/none.bin" \
    dataset.loss_mask=required
expect_in "$err" "none.bin.lossmask: cannot open the loss mask of" "required: missing mask"
expect_in "$err" "dataset.path," "required: the key is named"
cp "$data" "$w/b2.bin"
expect_rc 0 python3 "$helper" mask "$w/b2.bin" byte2
expect_rc 1 np 2 "$bindir/meshtrain-dense" --config "$cfg" $common dataset.path="$w/b2.bin"
expect_in "$err" "b2.bin.lossmask: byte 2 at offset 116 (token 100) is not 0 or 1" "byte 2"
train off 1 dataset.path="$w/b2.bin" dataset.loss_mask=off
compare_losses "$w/plain.jsonl" "$w/off.jsonl" "loss_mask off ignores the mask" 0 0
expect_rc 0 python3 "$helper" mask "$w/c.bin" ones "$w/b2.bin.lossmask"
expect_rc 0 python3 "$helper" slice "$w/b2.bin" "$w/c.bin" 0 5000
expect_rc 1 np 1 "$bindir/meshtrain-dense" --config "$cfg" $common dataset.path="$w/b2.bin"
expect_in "$err" "b2.bin.lossmask: the mask is for" "a mask of another length"
finish
