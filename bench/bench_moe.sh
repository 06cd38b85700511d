#!/bin/sh
# bench_moe.sh: expert-parallel all-to-all traffic and its share of the
# step (doc/moe.md), from the build directory:  make bench-moe
#
# Trains share/configs/moe-tiny.yaml (hidden 128, 4 MoE layers of 8
# experts, top 2, 2 x 128 tokens per micro-step, 16 sequences per step)
# for STEPS steps at ep 2 on 2 ranks, ep 4 on 4 ranks and ep 2 x tp 2 on
# 4 ranks (each TP rank routes half of a micro-batch's tokens), checkpoints
# off, then from metrics.jsonl (steps 3..STEPS):
#   1. a2a_bytes: the bytes the ranks sent to other ranks in the step's
#      all-to-alls (moe_dispatch.c counts what it hands MPI: rows to other
#      ranks, and the expert counts), summed over ranks, against the
#      analytic volume under uniform routing: per micro-step, MoE layer
#      and rank, (N/tp) K (ep-1)/ep rows of H floats, 4 times (dispatch and
#      combine, forward and backward), plus the counts, El int64 to each
#      of ep-1 ranks; the ratio departs from 1 by how unevenly the router
#      spreads tokens over the ranks;
#   2. a2a_s / step_time_s: the share of the step spent inside the
#      dispatch and combine all-to-alls (the slowest rank's seconds, so it
#      includes waiting for a rank with more routed tokens).
# Environment: STEPS (10), MPIEXEC / MPIEXEC_NP, OUT (moe-bench).
set -e
srcdir=${srcdir:-$(dirname "$0")/..}
steps=${STEPS:-10}
mpiexec=${MPIEXEC:-mpiexec} npflag=${MPIEXEC_NP:--n}
out=${OUT:-moe-bench}
mkdir -p "$out"
rm -f "$out"/*
data=$(pwd)/share/data/tiny-corpus.bin
for case in 2:1 4:1 2:2; do
    ep=${case%:*} tp=${case#*:}
    $mpiexec $npflag $((ep * tp)) apps/meshtrain-moe \
        --config "$srcdir/share/configs/moe-tiny.yaml" \
        distributed.ep_size=$ep distributed.tp_size=$tp step_scheduler.max_steps=$steps \
        checkpoint.enabled=false dataset.path="$data" \
        logging.metrics_file="$out/ep$ep-tp$tp.jsonl" logging.log_every_steps=1000 \
        > "$out/ep$ep-tp$tp.log"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
H, L, E, K, B, T, G = 128, 4, 8, 2, 2, 128, 16      # moe-tiny.yaml
N = B * T
print(f"{'ep':>3} {'tp':>3} {'ranks':>5} {'micro':>5} {'bytes/step':>12} {'analytic':>12} "
      f"{'ratio':>6} {'a2a s':>8} {'step s':>8} {'share':>6}")
for ep, tp in ((2, 1), (4, 1), (2, 2)):
    rows = [json.loads(l) for l in open(f"{out}/ep{ep}-tp{tp}.jsonl")][2:]
    ranks, El = ep * tp, E // ep
    micro = G // (B * ep)                         # micro-steps per rank (dp = ep here)
    rows_off = N // tp * K * (ep - 1) / ep        # per rank, layer, micro-step
    analytic = micro * L * ranks * (4 * rows_off * H * 4 + (ep - 1) * El * 8)
    b = sum(r["a2a_bytes"] for r in rows) / len(rows)
    s = sum(r["a2a_s"] for r in rows) / len(rows)
    t = sum(r["step_time_s"] for r in rows) / len(rows)
    print(f"{ep:>3} {tp:>3} {ranks:>5} {micro:>5} {b:>12.0f} {analytic:>12.0f} "
          f"{b / analytic:>6.3f} {s:>8.4f} {t:>8.4f} {100 * s / t:>5.1f}%")
PY
