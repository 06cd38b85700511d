#!/bin/sh
# window_parity.sh: a Mistral model with a sliding window narrower than
# its rows (model.sliding_window 13, rows of 64: doc/sliding-window.md)
# trains the same on every path that applies the window as on one rank:
# context parallelism (cp 2: the ring's chunks of 16 tokens on global
# indices, so each chunk sees itself and the one before), tensor
# parallelism with sequence parallelism (tp 2) and pipeline parallelism
# (pp 2, 1f1b), on packed rows (meshtrain-cp, packed_sequence_size 64:
# the window inside each document) and on plain rows (meshtrain-dense,
# two rows per micro-batch, with the validation loss, also under cp).  20
# steps, as the other parity tests: step 1 within 1e-6, every step within
# 1e-5, final parameters within 5e-5.  And the window is in force: the
# 1-rank runs' losses differ from the same runs without it.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
cfg="$small_cfg"
mistral=model.architecture=MistralForCausalLM
win="model.sliding_window=13"
pp2="distributed.pp_size=2 distributed.pipeline.pp_schedule=1f1b"

# ---- packed rows
app="$bindir/meshtrain-cp"
common="$parity_common $mistral packed_sequence.packed_sequence_size=64"
train p1 1 $win
train p1full 1
train pc2 2 $win distributed.cp_size=2
train pt2 2 $win distributed.tp_size=2 distributed.sequence_parallel=true
train pp2 2 $win $pp2
parity p1 pc2 "packed, window, cp 2"
parity p1 pt2 "packed, window, tp 2 (sequence parallel)"
parity p1 pp2 "packed, window, pp 2"

# ---- plain rows
app="$bindir/meshtrain-dense"
common="$parity_common $mistral step_scheduler.local_batch_size=2 dataset.validation_path=$data
 step_scheduler.val_every_steps=10"
train u1 1 $win
train u1full 1
train uc2 2 $win distributed.cp_size=2
train ut2 2 $win distributed.tp_size=2 distributed.sequence_parallel=true
train up2 2 $win $pp2
parity u1 uc2 "plain rows, window, cp 2"
parity u1 ut2 "plain rows, window, tp 2 (sequence parallel)"
parity u1 up2 "plain rows, window, pp 2"

checks=$((checks + 1))
python3 - "$workdir" <<'PY' || fail "the window is not in force, or validation losses differ"
import json, os, sys
w = sys.argv[1]
def load(n, key):
    return {j["step"]: j[key] for j in map(json.loads, open(os.path.join(w, n + ".jsonl")))
            if key in j}
for win, full in (("p1", "p1full"), ("u1", "u1full")):
    a, b = load(win, "loss"), load(full, "loss")
    assert a[1] != b[1], f"{win}: step 1 loss {a[1]} with the window, {b[1]} without"
    print(f"{win}: step 1 loss {a[1]:.6f} with the window, {b[1]:.6f} without")
ref = load("u1", "val_loss")
assert sorted(ref) == [10, 20], ref
for n in ("uc2", "ut2", "up2"):
    got = load(n, "val_loss")
    for s in ref:
        rel = abs(got[s] - ref[s]) / ref[s]
        assert rel <= 1e-5, f"{n} step {s}: val_loss {got[s]} vs {ref[s]} ({rel:.2e})"
print("validation losses agree")
PY
finish
