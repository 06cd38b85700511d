#!/bin/sh
# bench_dense.sh: meshtrain-dense against PyTorch eager on the dense-model
# issue's bench config (bench/dense-bench.yaml), same threads, same steps.
# Prints both tokens/s, their ratio, and MFU against this machine's
# single-process SGEMM rate.  Run from the build directory:  make bench
# (THREADS=2 by default; PyTorch from Debian's python3-torch, installed
# here if missing).
set -e
srcdir=${srcdir:-$(dirname "$0")/..}
threads=${THREADS:-2}
steps=12 warm=2
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    echo "bench: installing python3-torch (benchmark only)"
    sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y -qq python3-torch >/dev/null
fi
rate=$(./bench/sgemm_rate 2048 5 | sed -n 's/.*gflops=//p')
rm -f bench-metrics.jsonl
./apps/meshtrain-dense --config "$srcdir/bench/dense-bench.yaml" \
    step_scheduler.max_steps=$steps > bench-dense.log
mt=$(awk -v w=$warm -F'"tokens_per_s": ' 'NR > w { split($2, a, ","); s += a[1]; n++ } END { printf "%.1f", s / n }' bench-metrics.jsonl)
torch=$(/usr/bin/python3 "$srcdir/bench/torch_llama.py" --threads "$threads" --steps $((steps - warm)) --warmup $warm | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
# FLOPs per token: 6 x matmul parameters + 6 x layers x seq x hidden (causal attention)
flops=$(awk 'BEGIN { d=512; L=4; kv=256; I=1408; V=8192; T=256;
    layer = d*d*2 + 2*kv*d + 3*d*I; print 6*(L*layer + V*d) + 6*L*T*d }')
awk -v mt="$mt" -v t="$torch" -v r="$rate" -v f="$flops" -v th="$threads" 'BEGIN {
    printf "threads                 %d\n", th
    printf "sgemm 2048^3            %.1f GFLOP/s\n", r
    printf "meshtrain-dense         %.1f tokens/s  (%.1f GFLOP/s, MFU %.1f%% of sgemm)\n", mt, mt*f/1e9, 100*mt*f/1e9/r
    printf "pytorch eager           %.1f tokens/s  (%.1f GFLOP/s, MFU %.1f%% of sgemm)\n", t, t*f/1e9, 100*t*f/1e9/r
    printf "ratio meshtrain/pytorch %.2fx\n", mt/t
}'
