#!/bin/sh
# blend.sh: dataset.paths and blends in training (doc/data.md).
#  - two files listed in dataset.paths train exactly as the one file that
#    is their concatenation (bit-identical losses);
#  - a blend [2, A, 1, B1, B2] (B of two shards, one with a loss mask) logs
#    its realised proportions and per-entry draws, is computed by fsdp2 dp 2
#    and by tp 2 (every mesh sees the same samples: step 1 within 1e-6,
#    every step within 1e-5), and resumed from its step-4 checkpoint it
#    continues bit-identically; it differs from training on A alone;
#  - packed rows per entry (meshtrain-cp): cp 2 computes the 1-rank run;
#  - a validation blend gives a validation loss;
#  - a negative or zero weight, a weight without a path, dataset.path
#    together with dataset.paths, and a missing shard are refused, naming
#    the config file's line (and the file).
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
helper="$abs_top_srcdir/tests/train/lossmask.py"
w=$workdir
cfg="$w/blend.yaml"

expect_rc 0 python3 "$helper" slice "$w/a.bin" "$data" 0 30000
expect_rc 0 python3 "$helper" slice "$w/rest.bin" "$data" 30000 100000000
expect_rc 0 python3 "$helper" slice "$w/b1.bin" "$data" 10000 40000
expect_rc 0 python3 "$helper" mask "$w/b1.bin" prompt
expect_rc 0 python3 "$helper" slice "$w/b2.bin" "$data" 40000 64000
# config: the small run's, its dataset.path replaced by the list $1
mkcfg() {
    sed "s|^  path: .*|  paths: $1|" "$small_cfg" > "$2"
}

# ---- a list is a concatenation
mkcfg "[\"$w/a.bin\", \"$w/rest.bin\"]" "$w/cat.yaml"
common="step_scheduler.max_steps=8 step_scheduler.ckpt_every_steps=4 checkpoint.keep_last_n=0"
cfg="$w/cat.yaml" train cat 1
expect_in "$out" "data: $w/a.bin (and more): 2 files, 64651 tokens" "the concatenation is logged"
cfg="$small_cfg" train one 1 dataset.path="$data"
compare_losses "$w/one.jsonl" "$w/cat.jsonl" "two files = their concatenation" 0 0

# ---- a blend
mkcfg "[2, \"$w/a.bin\", 1, \"$w/b1.bin\", \"$w/b2.bin\"]" "$cfg"
train r1 1
expect_in "$out" "data entry 0: $w/a.bin: 1 file, 30000 tokens, 468 samples; loss mask: none; weight 0.666667, realised 43691/65536 = 0.666672; 43 of the run's 64 draws (0.09 epochs)" "entry 0 logged"
expect_in "$out" "data entry 1: $w/b1.bin (and more): 2 files, 54000 tokens, 843 samples; loss mask: some files (1 of 2; the others count every target); weight 0.333333, realised 21845/65536 = 0.333328; 21 of the run's 64 draws (0.02 epochs)" "entry 1 logged"
train d2 2 distributed.strategy=fsdp2
compare_losses "$w/r1.jsonl" "$w/d2.jsonl" "blend: fsdp2 dp 2"
train t2 2 distributed.tp_size=2
compare_losses "$w/r1.jsonl" "$w/t2.jsonl" "blend: tp 2"
train re 2 distributed.strategy=fsdp2 checkpoint.resume="$w/d2/step_00000004"
expect_in "$out" "resumed from $w/d2/step_00000004 at step 4" "blend: resumed"
compare_losses "$w/d2.jsonl" "$w/re.jsonl" "blend: resumed at step 4, steps 5-8" 5 0
cfg="$small_cfg" train a 1 dataset.path="$w/a.bin"
checks=$((checks + 1))
python3 - "$w/a.jsonl" "$w/r1.jsonl" <<'PY' || fail "the blend trains as A alone"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:])
assert any(abs(x - y) > 1e-4 for x, y in zip(a, b)), (a, b)
PY

# ---- packed entries, and a validation blend
app="$bindir/meshtrain-cp"
common="$common checkpoint.enabled=false step_scheduler.local_batch_size=1
 packed_sequence.packed_sequence_size=64"
train k1 1
expect_in "$out" "rows of 64 tokens" "packed per entry"
train kc2 2 distributed.cp_size=2
compare_losses "$w/k1.jsonl" "$w/kc2.jsonl" "packed blend: cp 2"
app=
common="step_scheduler.max_steps=4 checkpoint.enabled=false step_scheduler.val_every_steps=4"
train v 1 "dataset.validation_paths=[1, $w/b2.bin, 3, $w/a.bin]"
expect_in "$out" "validation data entry 1: $w/a.bin" "validation blend logged"
expect_in "$out" "val_loss" "validation blend: a validation loss"

# ---- bad lists, named by line
printf '%s\n' "dataset:" "  paths:" "    - 1" "    - $w/a.bin" "    - -0.5" "    - $w/b2.bin" \
    > "$w/neg.yaml"
expect_rc 1 "$bindir/meshtrain-plan" --world-size 1 --config "$w/neg.yaml"
expect_in "$err" "neg.yaml:3:5: dataset.paths: item 2: weight -0.5: a blend weight must be a positive number" "negative weight"
mkcfg "[1, \"$w/a.bin\", 0, \"$w/b2.bin\"]" "$w/zero.yaml"
expect_rc 1 "$bindir/meshtrain-plan" --world-size 1 --config "$w/zero.yaml"
expect_in "$err" "zero.yaml:12:10: dataset.paths: item 2: weight 0: a blend weight must be a positive number" "zero weight"
mkcfg "[1, \"$w/a.bin\", 2]" "$w/dangling.yaml"
expect_rc 1 "$bindir/meshtrain-plan" --world-size 1 --config "$w/dangling.yaml"
expect_in "$err" "dataset.paths: item 2: weight 2 is not followed by a path" "weight without a path"
expect_rc 1 "$bindir/meshtrain-plan" --world-size 1 --config "$w/cat.yaml" dataset.path="$data"
expect_in "$err" "dataset.paths: is set together with dataset.path" "path and paths"
mkcfg "[1, \"$w/a.bin\", 1, \"$w/nope.bin\"]" "$w/missing.yaml"
expect_rc 1 np 2 "$bindir/meshtrain-dense" --config "$w/missing.yaml"
expect_in "$err" "nope.bin" "missing shard: the file"
expect_in "$err" "(dataset.paths, $w/missing.yaml:12:10)" "missing shard: the config line"
finish
