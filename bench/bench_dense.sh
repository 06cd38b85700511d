#!/bin/sh
# bench_dense.sh: meshtrain-dense against PyTorch eager on the bench
# config (bench/dense.yaml), same threads, same steps, same BLAS.
# Alternates the two REPS times (default 3) and prints the median tokens/s
# of each, their ratio, and MFU against the best single-process SGEMM rate
# measured before and after the runs.  Run from the build directory:  make bench
# (THREADS=2 by default; PyTorch from Debian's python3-torch, installed
# here if missing).
#
# PyTorch runs on the OpenBLAS meshtrain links (the OpenMP build, through
# LD_LIBRARY_PATH): Debian's default libblas.so.3 is the pthread OpenBLAS,
# whose own thread pool fights PyTorch's libgomp pool on 2 cores and
# halves PyTorch's speed, which is no fair comparison.
set -e
srcdir=${srcdir:-$(dirname "$0")/..}
threads=${THREADS:-2}
# the shape: BATCH sequences of SEQ tokens a step (bench/dense.yaml: 4 x 256)
batch=${BATCH:-4} seq=${SEQ:-256}
steps=12 warm=2
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    echo "bench: installing python3-torch (benchmark only)"
    sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y -qq python3-torch >/dev/null
fi
# The VM's SGEMM rate drifts; take the best of measurements around the runs.
sgemm() { ./bench/sgemm_rate 2048 5 | sed -n 's/.*gflops=//p'; }
r1=$(sgemm)
mt_run() {
    rm -f bench-metrics.jsonl
    ./apps/meshtrain-dense --config "$srcdir/bench/dense.yaml" \
        step_scheduler.max_steps=$steps step_scheduler.global_batch_size=$batch \
        step_scheduler.local_batch_size=$batch dataset.seq_length=$seq > bench-dense.log
    awk -v w=$warm -F'"tokens_per_s": ' 'NR > w { split($2, a, ","); s += a[1]; n++ } END { printf "%.1f", s / n }' bench-metrics.jsonl
}
# the directory of the libopenblas that libmeshtrain loads; its
# libblas.so.3 then serves PyTorch too
blasdir=$(ldd ./src/.libs/libmeshtrain.so | awk '/libopenblas/ { print $3; exit }')
blasdir=$(dirname "$(readlink -f "$blasdir")")
[ -f "$blasdir/libblas.so.3" ] || { echo "bench: no libblas.so.3 beside $blasdir/libopenblas" >&2; exit 1; }
echo "bench: PyTorch on $blasdir/libblas.so.3 (meshtrain's OpenBLAS)"
torch_run() {
    LD_LIBRARY_PATH="$blasdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" /usr/bin/python3 "$srcdir/bench/torch_llama.py" --threads "$threads" --batch "$batch" --seq "$seq" --steps $((steps - warm)) \
        --warmup $warm | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p'
}
# Alternate the two trainers (REPS times each) and report medians.
reps=${REPS:-3}
mts= ts=
for i in $(seq 1 "$reps"); do
    mts="$mts $(mt_run)"
    ts="$ts $(torch_run)"
done
r2=$(sgemm)
median() { printf '%s\n' $* | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
mt=$(median $mts); torch=$(median $ts)
rate=$(printf '%s\n%s\n' "$r1" "$r2" | sort -n | tail -1)
echo "runs: meshtrain-dense$mts; pytorch$ts (tokens/s); sgemm $r1, $r2 GFLOP/s"
# FLOPs per token: 6 x matmul parameters + 6 x layers x seq x hidden (causal attention)
flops=$(awk -v T="$seq" 'BEGIN { d=512; L=4; kv=256; I=1408; V=8192;
    layer = d*d*2 + 2*kv*d + 3*d*I; print 6*(L*layer + V*d) + 6*L*T*d }')
awk -v mt="$mt" -v t="$torch" -v r="$rate" -v f="$flops" -v th="$threads" -v shape="$batch x $seq" 'BEGIN {
    printf "threads                 %d\n", th
    printf "shape                   %s\n", shape
    printf "sgemm 2048^3 (best)     %.1f GFLOP/s\n", r
    printf "meshtrain-dense median  %.1f tokens/s  (%.1f GFLOP/s, MFU %.1f%% of sgemm)\n", mt, mt*f/1e9, 100*mt*f/1e9/r
    printf "pytorch eager median    %.1f tokens/s  (%.1f GFLOP/s, MFU %.1f%% of sgemm)\n", t, t*f/1e9, 100*t*f/1e9/r
    printf "ratio meshtrain/pytorch %.2fx\n", mt/t
}'
