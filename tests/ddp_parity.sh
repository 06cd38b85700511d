#!/bin/sh
# ddp_parity.sh: strategy ddp on 2 and 4 ranks computes the single-rank
# run.  The global batch (8) is the same; gradient accumulation changes
# from 4 micro-steps (1 rank) to 2 and 1.  Losses must match the 1-rank
# run: step 1 to 1e-6 relative, every step of 12 to 1e-5.  The 2-rank run
# uses tiny buckets (many overlapped all-reduces).  A checkpoint saved by
# the 2-rank run at step 6 resumes on 1 rank and continues like it.
. "${abs_top_srcdir:-$(dirname "$0")/..}/tests/lib.sh"
dense="$bindir/meshtrain-dense"
cfg="$testconfigs/train-small.yaml"
data="$abs_top_builddir/share/data/tiny-corpus.bin"
common="dataset.path=$data distributed.strategy=ddp step_scheduler.max_steps=12 step_scheduler.ckpt_every_steps=6 step_scheduler.local_batch_size=2"
run() { name=$1; shift; echo "checkpoint.checkpoint_dir=$workdir/$name logging.metrics_file=$workdir/$name.jsonl $common"; }
np() { n=$1; shift; timeout 300 "$MPIEXEC" $MPIEXEC_NP "$n" "$@"; }

expect_rc 0 "$dense" --config "$cfg" $(run r1)
expect_rc 0 np 2 "$dense" --config "$cfg" $(run r2) distributed.ddp_bucket_cap_mb=0.01
expect_in "$out" "(2 micro-steps of 2 x 64)" "2 ranks: 2 micro-steps"
expect_rc 0 np 4 "$dense" --config "$cfg" $(run r4)

compare() { # compare() REF OTHER LABEL
    checks=$((checks + 1))
    python3 - "$1" "$2" <<'PY' || fail "$3: losses differ from the 1-rank run"
import json, sys
a = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[1]))}
b = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[2]))}
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
worst = 0
for s in sorted(a):
    rel = abs(a[s] - b[s]) / abs(a[s])
    tol = 1e-6 if s == 1 else 1e-5
    print(f"step {s}: {a[s]:.9g} vs {b[s]:.9g} rel {rel:.2e}")
    assert rel <= tol, f"step {s}: relative difference {rel:.3e} > {tol}"
PY
}
compare "$workdir/r1.jsonl" "$workdir/r2.jsonl" "2 ranks"
compare "$workdir/r1.jsonl" "$workdir/r4.jsonl" "4 ranks"

# A checkpoint written on 2 ranks continues on 1.
rm -rf "$workdir/r2/step_00000012"; echo step_00000006 > "$workdir/r2/latest"
cp "$workdir/r1.jsonl" "$workdir/resumed.jsonl"
expect_rc 0 "$dense" --config "$cfg" $common checkpoint.checkpoint_dir="$workdir/r2" \
    logging.metrics_file="$workdir/resumed.jsonl"
expect_in "$out" "resumed from $workdir/r2/step_00000006 at step 6" "2-rank checkpoint on 1 rank"
python3 - "$workdir/resumed.jsonl" "$workdir/r1.jsonl" <<'PY' || fail "resumed steps 7-12 differ"
import json, sys
last = {}
for j in map(json.loads, open(sys.argv[1])):
    last[j["step"]] = j["loss"]
ref = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[2]))}
for s in range(7, 13):
    assert abs(last[s] - ref[s]) <= 1e-5 * abs(ref[s]), (s, last[s], ref[s])
PY
checks=$((checks + 1))

# fsdp2 (the default) on several ranks is refused honestly, once.
expect_rc 1 np 2 "$dense" --config "$cfg" dataset.path="$data" logging.metrics_file="$workdir/x.jsonl"
expect_in "$err" "use distributed.strategy=ddp" "fsdp2 multi-rank refused"
finish
