#!/bin/sh
# fsdp_parity.sh: the sharded strategies compute the single-rank run.
#
# fsdp2 at 2, 4 and 8 ranks and in HSDP layouts 2x2 and 2x4, megatron_fsdp
# zero_dp_strategy 3 at 2, 4 and 8 (and 2 at 4, 1 at 8), and ddp at 8 train
# 20 steps of the same global batch (8 sequences; accumulation changes
# with the rank count).  Each must reproduce the 1-rank losses (step 1 to
# 1e-6 relative, every step to 1e-5) and its final parameters (each
# tensor to 1e-5 relative, norm-wise).  The same layout run twice is
# bit-identical.  Per-rank memory shrinks as 1/dp and meshtrain-plan's
# estimate is within 10% of the measurement.  Checkpoints: one written by
# fsdp2 on 8 ranks loads under megatron_fsdp zero 1 on 4 ranks and is
# written again there bit for bit, resumes under ddp on 2 ranks and under
# fsdp2 on 8 (bit-identical to the uninterrupted run), and a 1-rank
# checkpoint resumes under fsdp2 HSDP on 4.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
dense="$bindir/meshtrain-dense"
cfg="$small_cfg"
common="$parity_common"
f2="distributed.strategy=fsdp2"
mf="distributed.strategy=megatron_fsdp"
parity1() { # parity1 NAME LABEL: against the 1-rank run r1
    compare_losses "$workdir/r1.jsonl" "$workdir/$1.jsonl" "$2"
    params_close "$(final r1)" "$(final "$1")" "$2: final parameters"
}

train r1 1
train f2 2 $f2 distributed.defer_fsdp_grad_sync=false
expect_in "$out" "(4 micro-steps of 1 x 64)" "fsdp2 on 2 ranks accumulates 4 micro-steps"
train f4 4 $f2 distributed.reshard_after_forward=false
train f8 8 $f2
train h22 4 $f2 distributed.dp_replicate_size=2
expect_in "$(cat "$workdir/h22.log")" "sharded over 2 ranks" "HSDP 2x2 shards over dp_shard = 2"
train h24 8 $f2 distributed.dp_replicate_size=2 distributed.activation_checkpointing=true
train z3_2 2 $mf
train z3_4 4 $mf distributed.overlap_grad_reduce=false distributed.overlap_param_gather=false
train z3_8 8 $mf
train z2_4 4 $mf distributed.zero_dp_strategy=2
train z1_8 8 $mf distributed.zero_dp_strategy=1
train ddp8 8 distributed.strategy=ddp
for run in f2:"fsdp2, 2 ranks" f4:"fsdp2, 4 ranks, no reshard" f8:"fsdp2, 8 ranks" \
    h22:"fsdp2 HSDP 2x2" h24:"fsdp2 HSDP 2x4" z3_2:"megatron_fsdp zero 3, 2 ranks" \
    z3_4:"megatron_fsdp zero 3, 4 ranks, no overlap" z3_8:"megatron_fsdp zero 3, 8 ranks" \
    z2_4:"megatron_fsdp zero 2, 4 ranks" z1_8:"megatron_fsdp zero 1, 8 ranks" ddp8:"ddp, 8 ranks"; do
    parity1 "${run%%:*}" "${run#*:}"
done

# The same layout twice: bit-identical losses and checkpoints.
train f8b 8 $f2
compare_losses "$workdir/f8.jsonl" "$workdir/f8b.jsonl" "fsdp2 8 ranks, run twice" 0 0
checks=$((checks + 1))
h5diff "$(final f8)" "$(final f8b)" /model /model >/dev/null && \
    h5diff "$(final f8)" "$(final f8b)" /optim /optim >/dev/null || fail "fsdp2 8 ranks run twice: checkpoints differ"

# Memory: the owned shard is 1/dp of the model (parameters, gradients) and
# 2/dp (AdamW moments); the plan's totals are within 10% of the measured.
memory() { # memory NAME DP
    checks=$((checks + 1))
    python3 - "$workdir/$1.log" "$2" <<'PY' || fail "$1: memory not 1/$2 or not as planned"
import re, sys
log, dp = open(sys.argv[1]).read(), int(sys.argv[2])
m = re.search(r"sharded over (\d+) ranks \(model ([0-9.]+) MiB\): parameters ([0-9.]+) own .*"
              r"gradients ([0-9.]+) own .* optimizer state ([0-9.]+) own", log)
assert m, "no sharding line"
n, model, p, g, o = int(m[1]), *map(float, m.groups()[1:])
assert n == dp, (n, dp)
for what, got, want in (("parameters", p, model / dp), ("gradients", g, model / dp),
                        ("optimizer", o, 2 * model / dp)):
    assert abs(got - want) <= 0.02 * want + 0.002, f"{what}: {got} MiB own, expected {want:.3f}"
t = re.search(r"parameters ([0-9.]+) / ([0-9.]+), gradients ([0-9.]+) / ([0-9.]+), "
              r"optimizer state ([0-9.]+) / ([0-9.]+)", log)
v = list(map(float, t.groups()))
for what, got, plan in zip(("parameters", "gradients", "optimizer"), v[0::2], v[1::2]):
    assert abs(got - plan) <= 0.10 * got, f"{what}: measured {got} MiB, plan {plan} MiB"
print(f"dp {dp}: parameters {p} gradients {g} optimizer {o} MiB of a {model} MiB model")
PY
}
memory f2 2
memory f4 4
memory f8 8
memory z3_8 8
memory h24 4

# Resharding on load.  fsdp2 x8's step 10 -> megatron_fsdp zero 1 on 4
# ranks: saved again at once (save_initial), every dataset bit for bit,
# then trained on.
train re_z1 4 $mf distributed.zero_dp_strategy=1 checkpoint.resume="$workdir/f8/step_00000010" \
    checkpoint.save_initial=true
expect_in "$out" "resumed from $workdir/f8/step_00000010 at step 10" "fsdp2 x8 -> zero 1 x4"
for g in /model /optim /train; do
    checks=$((checks + 1))
    h5diff "$workdir/f8/step_00000010/model.h5" "$workdir/re_z1/step_00000010/model.h5" $g $g \
        >/dev/null || fail "load and save again on another mesh: $g differs"
done
compare_losses "$workdir/r1.jsonl" "$workdir/re_z1.jsonl" "fsdp2 x8 -> zero 1 x4, steps 11-20" 11
# -> ddp on 2 ranks (the data position survives dp 8 -> 2)
train re_ddp 2 distributed.strategy=ddp checkpoint.resume="$workdir/f8/step_00000010"
compare_losses "$workdir/r1.jsonl" "$workdir/re_ddp.jsonl" "fsdp2 x8 -> ddp x2, steps 11-20" 11
# -> the same mesh: bit-identical to the uninterrupted run
train re_f8 8 $f2 checkpoint.resume="$workdir/f8/step_00000010"
compare_losses "$workdir/f8.jsonl" "$workdir/re_f8.jsonl" "fsdp2 x8 resumed on x8" 11 0
# a 1-rank checkpoint -> fsdp2 HSDP 2x2
train re_h22 4 $f2 distributed.dp_replicate_size=2 checkpoint.resume="$workdir/r1/step_00000010"
compare_losses "$workdir/r1.jsonl" "$workdir/re_h22.jsonl" "1 rank -> HSDP 2x2, steps 11-20" 11
finish
