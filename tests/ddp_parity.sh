#!/bin/sh
# ddp_parity.sh: strategy ddp, and megatron_fsdp with zero_dp_strategy 0
# and 1 (optimizer state sharded), on 2 and 4 ranks compute the single-rank
# run.  The global batch (8) is the same; gradient accumulation changes
# from 4 micro-steps (1 rank) to 2 and 1.  Losses must match the 1-rank
# run: step 1 to 1e-6 relative, every step of 12 to 1e-5.  The 2-rank run
# uses tiny buckets (many overlapped all-reduces).  A checkpoint saved by
# the 2-rank run at step 6 resumes on 1 rank and continues like it.
. "${abs_top_srcdir:-$(dirname "$0")/..}/tests/lib.sh"
dense="$bindir/meshtrain-dense"
cfg="$testconfigs/train-small.yaml"
data="$abs_top_builddir/share/data/tiny-corpus.bin"
common="dataset.path=$data step_scheduler.max_steps=12 step_scheduler.ckpt_every_steps=6 step_scheduler.local_batch_size=2"
run() { name=$1; shift; echo "checkpoint.checkpoint_dir=$workdir/$name logging.metrics_file=$workdir/$name.jsonl $common"; }
ddp=distributed.strategy=ddp
np() { n=$1; shift; timeout 300 "$MPIEXEC" $MPIEXEC_NP "$n" "$@"; }

expect_rc 0 "$dense" --config "$cfg" $(run r1) $ddp
expect_rc 0 np 2 "$dense" --config "$cfg" $(run r2) $ddp distributed.ddp_bucket_cap_mb=0.01
expect_in "$out" "(2 micro-steps of 2 x 64)" "2 ranks: 2 micro-steps"
expect_rc 0 np 4 "$dense" --config "$cfg" $(run r4) $ddp

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
# resumed_matches() LOG LABEL: steps 7-12 of a resumed run's metrics (its
# last line per step) match the 1-rank run to 1e-5.
resumed_matches() {
    checks=$((checks + 1))
    python3 - "$1" "$workdir/r1.jsonl" <<'PY' || fail "$2: resumed steps 7-12 differ"
import json, sys
last = {}
for j in map(json.loads, open(sys.argv[1])):
    last[j["step"]] = j["loss"]
ref = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[2]))}
for s in range(7, 13):
    assert abs(last[s] - ref[s]) <= 1e-5 * abs(ref[s]), (s, last[s], ref[s])
PY
}
compare "$workdir/r1.jsonl" "$workdir/r2.jsonl" "2 ranks"
compare "$workdir/r1.jsonl" "$workdir/r4.jsonl" "4 ranks"

# megatron_fsdp: zero 1 shards AdamW state over dp (each rank updates its
# rows, then the parameters are all-gathered); zero 0 without overlap.
mf="distributed.strategy=megatron_fsdp"
expect_rc 0 np 4 "$dense" --config "$cfg" $(run z1) $mf distributed.zero_dp_strategy=1
mem=$(printf '%s\n' "$out" | grep "memory per rank")
checks=$((checks + 1))
printf '%s\n' "$mem" | python3 -c "
import re, sys
l = sys.stdin.read()
opt = [float(x) for x in re.search(r'optimizer state ([0-9.]+) / ([0-9.]+)', l).groups()]
par = float(re.search(r'parameters ([0-9.]+) /', l).group(1))
assert abs(opt[0] - 2 * par / 4) <= 0.05 * opt[0], (opt, par)   # 8 bytes/param over 4 ranks
assert abs(opt[0] - opt[1]) <= 0.10 * opt[0], opt                # plan agrees
" || fail "zero 1: optimizer state not sharded 1/4: $mem"
expect_rc 0 np 2 "$dense" --config "$cfg" $(run z0) $mf distributed.zero_dp_strategy=0 \
    distributed.overlap_grad_reduce=false
compare "$workdir/r1.jsonl" "$workdir/z1.jsonl" "megatron_fsdp zero 1, 4 ranks"
compare "$workdir/r1.jsonl" "$workdir/z0.jsonl" "megatron_fsdp zero 0, 2 ranks"

# A checkpoint with optimizer shards from 4 ranks resumes under ddp on 2.
rm -rf "$workdir/z1/step_00000012"; echo step_00000006 > "$workdir/z1/latest"
cp "$workdir/r1.jsonl" "$workdir/z1r.jsonl"
expect_rc 0 np 2 "$dense" --config "$cfg" $common $ddp checkpoint.checkpoint_dir="$workdir/z1" \
    logging.metrics_file="$workdir/z1r.jsonl"
expect_in "$out" "resumed from $workdir/z1/step_00000006 at step 6" "zero-1 checkpoint under ddp"
resumed_matches "$workdir/z1r.jsonl" "zero 1 -> ddp"

# zero 2 and 3 are refused on several ranks, with the reason.
expect_rc 1 np 2 "$dense" --config "$cfg" $(run z2) $mf distributed.zero_dp_strategy=2
expect_in "$err" "zero_dp_strategy 2 (sharded gradients) is the next release" "zero 2 refused"

# A checkpoint written on 2 ranks continues on 1.
rm -rf "$workdir/r2/step_00000012"; echo step_00000006 > "$workdir/r2/latest"
cp "$workdir/r1.jsonl" "$workdir/resumed.jsonl"
expect_rc 0 "$dense" --config "$cfg" $common $ddp checkpoint.checkpoint_dir="$workdir/r2" \
    logging.metrics_file="$workdir/resumed.jsonl"
expect_in "$out" "resumed from $workdir/r2/step_00000006 at step 6" "2-rank checkpoint on 1 rank"
resumed_matches "$workdir/resumed.jsonl" "2 ranks -> 1 rank"

# fsdp2 (the default) on several ranks is refused honestly, once.
expect_rc 1 np 2 "$dense" --config "$cfg" dataset.path="$data" logging.metrics_file="$workdir/x.jsonl"
expect_in "$err" "strategy fsdp2 trains on one rank in this release" "fsdp2 multi-rank refused"
finish
