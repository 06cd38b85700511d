#!/bin/sh
# metrics_nonfinite.sh: a run that diverges (lr 1e30, the loss NaN within
# a few steps) keeps metrics.jsonl valid JSON: every line parses under a
# strict reader that refuses NaN and Infinity, and a non-finite loss or
# grad_norm is written as null.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
command -v python3 >/dev/null 2>&1 || { echo "no python3"; exit 77; }
m="$workdir/m.jsonl"
"$bindir/meshtrain-dense" --config "$testconfigs/train-small.yaml" dataset.path="$data" \
    checkpoint.enabled=false logging.metrics_file="$m" optimizer.lr=1e30 \
    lr_scheduler.lr_warmup_steps=0 step_scheduler.max_steps=6 > "$workdir/out" 2>&1
rc=$?
checks=$((checks + 1))
python3 - "$m" "$rc" <<'PY' || fail "metrics.jsonl is not strict JSON (run exit $rc)"
import json, math, sys
def refuse(c):
    raise ValueError("non-JSON constant " + c)
lines = open(sys.argv[1]).read().splitlines()
assert lines, "no metrics lines"
rows = [json.loads(l, parse_constant=refuse) for l in lines]
nulls = [r["step"] for r in rows if r["loss"] is None or r["grad_norm"] is None]
for r in rows:
    for k, v in r.items():
        assert v is None or not isinstance(v, float) or math.isfinite(v), (k, v)
# the run diverged: either a step logged null, or the run refused to go on
assert nulls or sys.argv[2] != "0", "lr 1e30 stayed finite: %r" % rows
print("steps with null:", nulls)
PY
finish
