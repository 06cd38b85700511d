#!/bin/sh
# bench_comm.sh: communication of every data-parallel strategy at 4 ranks
# (doc/performance.md), from the build directory:  make bench-comm
#
# For ddp, fsdp2, fsdp2 HSDP (2 replicas x 2 shards) and megatron_fsdp
# zero_dp_strategy 1, 2, 3 it trains the same small model for STEPS steps
# (one micro-step per step, checkpoints off) under the PMPI shim
# bench/.libs/pmpi_count.so, then
#   1. sums, per collective kind, each call's payload times the ring factor
#      of its group size n (all-reduce 2(n-1)/n, all-gather and
#      reduce-scatter (n-1)/n): bytes one rank sends per step in a ring,
#      averaged over ranks and over steps 2..STEPS; collectives of <= 64
#      bytes (token counts, loss sums, gradient norm, stop flag) are
#      "control" and kept apart;
#   2. compares that with the analytic volume from the parameter count
#      (meshtrain-plan --json);
#   3. takes the exposed communication per step, rank 0's comm_wait_s
#      from metrics.jsonl (mean over steps 2..STEPS), and the total, one
#      step's collectives replayed without compute (bench/comm_replay), and
#      prints hidden = 1 - exposed / replayed.
# doc/performance.md explains the method and its limits.  Environment:
# STEPS (20), REPS (replay repetitions, 20), NP (4), DDP_BUCKET_MB (0.5),
# PARAM_DTYPE and REDUCE_DTYPE (float32; bfloat16 sets
# distributed.mp_policy and halves the analytic all-gather of sharded
# parameters, resp. every gradient reduction: 2 bytes an element),
# MPIEXEC / MPIEXEC_NP (from configure), OUT (comm-bench: logs and traces).
set -e
srcdir=${srcdir:-$(dirname "$0")/..}
steps=${STEPS:-20} reps=${REPS:-20} np=${NP:-4} bucket=${DDP_BUCKET_MB:-0.5}
pdtype=${PARAM_DTYPE:-float32} rdtype=${REDUCE_DTYPE:-float32}
mpiexec=${MPIEXEC:-mpiexec} npflag=${MPIEXEC_NP:--n}
out=${OUT:-comm-bench}
shim=$(pwd)/bench/.libs/pmpi_count.so
[ -f "$shim" ] || { echo "bench_comm: $shim missing: make bench-comm builds it" >&2; exit 99; }
[ "$steps" -ge 3 ] || { echo "bench_comm: STEPS must be at least 3" >&2; exit 99; }
mkdir -p "$out"
rm -f "$out"/*
data=$(pwd)/share/data/tiny-corpus.bin
# hidden 128, 4 layers, vocab 258, seq 64; local batch 4 and global batch
# 4 x NP: one micro-step per step.
common="--config $srcdir/tests/configs/train-small.yaml model.hidden_size=128
 model.num_hidden_layers=4 step_scheduler.local_batch_size=4
 step_scheduler.global_batch_size=$((4 * np)) step_scheduler.max_steps=$steps
 checkpoint.enabled=false dataset.path=$data logging.log_every_steps=1000
 distributed.mp_policy.param_dtype=$pdtype distributed.mp_policy.reduce_dtype=$rdtype"
# OpenMP: the trainer gives each rank its share of the cores.
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS

plan=$(./apps/meshtrain-plan $common --world-size "$np" --json)
P=$(printf '%s\n' "$plan" | sed -n 's/.*"parameters": {"total": \([0-9]*\).*/\1/p')
HEAD=$(printf '%s\n' "$plan" | sed -n 's/.*"head": \([0-9]*\).*/\1/p')
[ -n "$P" ] && [ -n "$HEAD" ] || { echo "bench_comm: no parameter count from meshtrain-plan" >&2; exit 99; }

strategies="ddp fsdp2 hsdp zero1 zero2 zero3"
# HSDP needs 2 replicas of at least 2 shards
[ "$np" -ge 4 ] && [ $((np % 2)) -eq 0 ] || strategies="ddp fsdp2 zero1 zero2 zero3"
overrides() {
    case $1 in
    ddp)   echo "distributed.strategy=ddp distributed.ddp_bucket_cap_mb=$bucket" ;;
    fsdp2) echo "distributed.strategy=fsdp2" ;;
    hsdp)  echo "distributed.strategy=fsdp2 distributed.dp_replicate_size=2" ;;
    zero*) echo "distributed.strategy=megatron_fsdp distributed.zero_dp_strategy=${1#zero}" ;;
    esac
}

# Bytes one rank sends per step in a ring, by kind: "ar ag rs" (ints).
# S = 4 P bytes (R = 2 P with reduce_dtype bfloat16: the gradients); the
# head unit (final norm + lm_head) is gathered in forward and kept for
# backward, so sharded parameters are gathered 2P - HEAD elements per step
# (2 bytes each with param_dtype bfloat16, zero 1 and 2 included: their
# master weights are kept apart, so the rows they gather are bf16 values).
analytic() {
    awk -v s="$1" -v P="$P" -v H="$HEAD" -v n="$np" -v pd="$pdtype" -v rd="$rdtype" 'BEGIN {
        S = (pd == "bfloat16" ? 2 : 4) * P; R = (rd == "bfloat16" ? 2 : 4) * P
        g = (pd == "bfloat16" ? 2 : 4) * (2 * P - H); ar = 0; ag = 0; rs = 0
        if (s == "ddp")        ar = 2 * (n - 1) / n * R
        else if (s == "zero1") { ar = 2 * (n - 1) / n * R; ag = (n - 1) / n * S }
        else if (s == "zero2") { rs = (n - 1) / n * R; ag = (n - 1) / n * S }
        else if (s == "zero3" || s == "fsdp2") { ag = (n - 1) / n * g; rs = (n - 1) / n * R }
        else if (s == "hsdp") { k = n / 2; r = 2     # dp_shard k, dp_replicate 2
            ag = (k - 1) / k * g; rs = (k - 1) / k * R; ar = 2 * (r - 1) / r * R / k }
        printf "%.0f %.0f %.0f\n", ar, ag, rs }'
}

# Measured from the traces: "ar ag rs other control_bytes control_calls"
# per rank per step, over steps 2..STEPS.  A step ends with the trainer's
# stop-flag agreement (blocking MPI_Allreduce of one int, MPI_MAX, whole
# world): the last STEPS markers bound steps 2..STEPS.
measured() {
    for f in "$1".*; do
        awk -v steps="$steps" -v world="$np" '
        $1 == "call" {
            n++; kind[n] = $3; bytes[n] = $5 * $6; size[n] = $8
            if ($3 == "allreduce" && $4 == "int" && $6 == 1 && $12 == "max" && $11 == 1 && $8 == world)
                mark[++m] = n
        }
        END {
            if (m < steps) { print "bench_comm: " FILENAME ": " m " step markers, expected " steps > "/dev/stderr"; exit 1 }
            for (i = mark[m - steps + 1] + 1; i <= mark[m]; i++) {
                k = kind[i]; b = bytes[i]; p = size[i]
                f = p > 1 ? (k == "allreduce" ? 2 * (p - 1) / p : k ~ /^(allgather|reduce_scatter)/ ? (p - 1) / p : 1) : 0
                if (b <= 64) { cb += b * f; cc++ }
                else if (k == "allreduce") ar += b * f
                else if (k ~ /^allgather/) ag += b * f
                else if (k ~ /^reduce_scatter/) rs += b * f
                else ot += b * f
            }
            d = steps - 1
            printf "%.1f %.1f %.1f %.1f %.1f %.2f\n", ar / d, ag / d, rs / d, ot / d, cb / d, cc / d
        }' "$f"
    done | awk '{ for (i = 1; i <= NF; i++) s[i] += $i; n++ }
        END { printf "%.0f %.0f %.0f %.0f %.1f %.1f\n", s[1]/n, s[2]/n, s[3]/n, s[4]/n, s[5]/n, s[6]/n }'
}

echo "model: $P parameters ($((4 * P)) bytes fp32; head unit $HEAD), $np ranks, $steps steps (steps 2..$steps counted), one micro-step per step"
echo "wire dtypes: param_dtype $pdtype, reduce_dtype $rdtype"
echo "bytes: what one rank sends per step in a ring (payload x 2(n-1)/n all-reduce, (n-1)/n all-gather / reduce-scatter), MB = 1e6 bytes"
printf '%-6s | %8s %8s %8s %6s | %9s | %8s | %8s | %6s | %9s | %9s | %7s\n' strategy \
    "AR MB" "AG MB" "RS MB" "other" "control" "measured" "analytic" "ratio" \
    "exposed s" "replay s" "hidden"
for s in $strategies; do
    log="$out/$s.log"
    # shellcheck disable=SC2046
    $mpiexec $npflag "$np" env LD_PRELOAD="$shim" MT_PMPI_OUT="$out/$s.trace" \
        ./apps/meshtrain-dense $common $(overrides "$s") logging.metrics_file="$out/$s.jsonl" \
        > "$log" 2>&1 || { echo "bench_comm: $s failed, see $log" >&2; exit 1; }
    set -- $(measured "$out/$s.trace")
    m_ar=$1 m_ag=$2 m_rs=$3 m_ot=$4 m_cb=$5 m_cc=$6
    set -- $(analytic "$s")
    a_ar=$1 a_ag=$2 a_rs=$3
    exposed=$(awk -F'"comm_wait_s": ' 'NR > 1 { split($2, a, "}"); t += a[1]; n++ } END { printf "%.4f", t / n }' "$out/$s.jsonl")
    $mpiexec $npflag "$np" ./bench/comm_replay "$out/$s.trace" "$reps" > "$out/$s.replay" 2>&1 ||
        { echo "bench_comm: replay of $s failed, see $out/$s.replay" >&2; exit 1; }
    replay=$(sed -n 's/^replay step_s \([0-9.]*\).*/\1/p' "$out/$s.replay")
    awk -v s="$s" -v ar="$m_ar" -v ag="$m_ag" -v rs="$m_rs" -v ot="$m_ot" -v cb="$m_cb" -v cc="$m_cc" \
        -v aar="$a_ar" -v aag="$a_ag" -v ars="$a_rs" -v ex="$exposed" -v re="$replay" 'BEGIN {
        m = ar + ag + rs + ot; a = aar + aag + ars
        printf "%-6s | %8.4f %8.4f %8.4f %6.4f | %4.0fB/%2.0fc | %8.4f | %8.4f | %6.4f | %9.4f | %9.4f | %6.0f%%\n",
            s, ar / 1e6, ag / 1e6, rs / 1e6, ot / 1e6, cb, cc, m / 1e6, a / 1e6, m / a, ex, re,
            100 * (1 - ex / re) }'
    echo "$s analytic: AR $a_ar AG $a_ag RS $a_rs bytes; measured: AR $m_ar AG $m_ag RS $m_rs other $m_ot control $m_cb bytes in $m_cc calls; $(cat "$out/$s.replay")" >> "$out/detail.txt"
done
echo "control: bytes/calls per step of collectives <= 64 bytes, not in the ratio; exposed: rank 0's comm_wait_s;"
echo "replay: the step's collectives back to back without compute; hidden = 1 - exposed / replay (details: $out/detail.txt)"
