#!/bin/sh
# bench_pp.sh: the measured idle share of every pipeline schedule at pp = 4
# against the simulator's bubble for the same action lists with the
# measured mean F, B and W costs (the executor's end-of-run line, see
# doc/pipeline.md "Measured bubble").  Not part of make check.
#
#   sh bench/bench_pp.sh [STEPS]        (from the build directory)
#
# Environment: NP (default 4 = pp_size), MPIEXEC (default mpiexec),
# BENCH_ARGS (extra key=value overrides).  On fewer cores than ranks the
# ranks share cores, so a rank waiting for a message may be waiting for a
# core as well: the measured figure is then an upper bound.
top=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-6}
np=${NP:-4}
mpiexec=${MPIEXEC:-mpiexec}
data="$top/share/data/tiny-corpus.bin"
[ -f "$data" ] || { echo "bench_pp: build first (make), $data is missing" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pp-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
model="model.num_hidden_layers=8 model.hidden_size=128 model.intermediate_size=352
 model.num_attention_heads=4 model.num_key_value_heads=2 dataset.seq_length=128
 step_scheduler.local_batch_size=8 step_scheduler.global_batch_size=8
 distributed.pp_size=$np checkpoint.enabled=false"
printf '%-18s %10s %10s %10s %8s %8s %8s\n' schedule measured simulated "step s" "F ms" "B ms" "W ms"
for s in gpipe 1f1b interleaved_1f1b looped_bfs dfs zero_bubble v_schedule; do
    log="$tmp/$s.log"
    OMP_NUM_THREADS=1 "$mpiexec" -n "$np" "$top/apps/meshtrain-dense" \
        --config "$top/tests/configs/train-small.yaml" dataset.path="$data" \
        step_scheduler.max_steps="$steps" distributed.pipeline.pp_schedule=$s $model \
        logging.metrics_file="$tmp/$s.jsonl" $BENCH_ARGS >"$log" 2>&1 ||
        { echo "$s: run failed, see below" >&2; tail -5 "$log" >&2; continue; }
    python3 - "$log" "$tmp/$s.jsonl" "$s" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
m = re.search(r"pipeline idle: ([0-9.]+)% .* gives ([0-9.]+)% .* F ([0-9.]+) ms, B ([0-9.]+) ms, W ([0-9.]+) ms", text)
steps = [json.loads(l) for l in open(sys.argv[2])]
dt = sorted(j["step_time_s"] for j in steps[1:] or steps)[len(steps[1:] or steps) // 2]
print(f"{sys.argv[3]:<18} {m[1]:>9}% {m[2]:>9}% {dt:10.3f} {m[3]:>8} {m[4]:>8} {m[5]:>8}")
PY
done
