# lib.sh: helpers for the shell tests (sourced).  Exit codes follow
# Automake: 0 pass, 1 fail, 77 skip, 99 hard error.
: "${abs_top_builddir:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${abs_top_srcdir:=$abs_top_builddir}"
: "${MPIEXEC:=mpiexec}"
: "${MPIEXEC_NP:=-n}"
# MESHTRAIN_TEST_BINDIR: the trainers to test instead of the build's
# (tests/emu/nccl/build/bin: the parity tests on the host emulation of
# the GPUs, with MESHTRAIN_TEST_GPUS; doc/testing.md)
bindir="${MESHTRAIN_TEST_BINDIR:-$abs_top_builddir/apps}"
configs="$abs_top_srcdir/share/configs"
testconfigs="$abs_top_srcdir/tests/configs"
# the float64 references' arguments for the settings of
# $testconfigs/hf-reference.yaml
hf_ref_args="--seq 64 --global-batch 2 --local-batch 1 --steps 3 --lr 2e-3 --betas 0.9,0.95
 --eps 1e-8 --weight-decay 0.1 --max-grad-norm 1.0 --warmup 2 --decay cosine --min-lr 2e-4"
# the corpus make builds, and the small model most training tests use
data="$abs_top_builddir/share/data/tiny-corpus.bin"
small_cfg="$testconfigs/train-small.yaml"
# the parity tests' runs: 20 steps of one-sequence micro-batches,
# checkpoints at steps 10 and 20, all kept
parity_common="dataset.path=$data step_scheduler.max_steps=20 step_scheduler.ckpt_every_steps=10
 step_scheduler.local_batch_size=1 checkpoint.keep_last_n=0"
failures=0
checks=0
workdir=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain-test.XXXXXX") || exit 99
trap 'rm -rf "$workdir"' EXIT

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect_rc WANT CMD...: run CMD, keep stdout/stderr in $out/$err.
expect_rc() {
    want=$1; shift
    checks=$((checks + 1))
    "$@" >"$workdir/out" 2>"$workdir/err"
    got=$?
    out=$(cat "$workdir/out"); err=$(cat "$workdir/err")
    [ "$got" -eq "$want" ] || fail "exit $got, expected $want: $*
--- stdout ---
$out
--- stderr ---
$err"
}

# expect_in TEXT NEEDLE WHAT
expect_in() {
    checks=$((checks + 1))
    case "$1" in *"$2"*) ;; *) fail "$3: expected \"$2\" in:
$1" ;; esac
}

# np N CMD...: CMD on N MPI ranks, at most 300 s.
np() { n=$1; shift; timeout 300 "$MPIEXEC" $MPIEXEC_NP "$n" "$@"; }

# make check MESHTRAIN_TEST_GPUS=N on a machine with N GPUs per node: the
# training runs of train() below go to the GPUs (distributed.device=cuda;
# NCCL where no two ranks of a node share a GPU, the MPI-staged path where
# they do), so the parity tests check the GPU paths against the 1-rank GPU
# run (doc/gpu.md, doc/testing.md).  A test may clear gpu_args.
gpu_args=
[ "${MESHTRAIN_TEST_GPUS:-0}" -gt 0 ] 2>/dev/null && gpu_args=distributed.device=cuda

# The parity tests' training runs: $app (default meshtrain-dense) with the
# config $cfg (default train-small.yaml) and the overrides $common.
# train NAME NP [key=value ...]: checkpoints in $workdir/NAME, metrics in
# NAME.jsonl, stdout kept in NAME.log and $out; prints the run's time.
train() {
    name=$1 n=$2; shift 2
    t0=$(date +%s.%N)
    expect_rc 0 np "$n" "${app:-$bindir/meshtrain-dense}" \
        --config "${cfg:-$small_cfg}" $common checkpoint.checkpoint_dir="$workdir/$name" \
        logging.metrics_file="$workdir/$name.jsonl" $gpu_args "$@"
    printf '%s\n' "$out" > "$workdir/$name.log"
    echo "$name ($n ranks): $(python3 -c 'import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))' "$t0" "$(date +%s.%N)") s"
}

# compare_losses REF OTHER LABEL [FROM [TOL]]: the per-step losses and
# gradient norms (the clipping input: the global norm must not depend on
# the strategy) of two metrics.jsonl files (the last line for each step, so
# a resumed run's file may repeat steps) agree: every step of REF from FROM
# (default: all, and OTHER must have the same steps) within relative TOL
# (default 1e-5, and 1e-6 at step 1; STEP1_TOL, a 6th argument, sets step
# 1's).  TOL 0 demands bit-identical values.
# The gradient norm gets 10 x TOL: it is the most rounding-sensitive figure
# of a step (over 20-30 fp32 steps it has differed by up to 9e-5 between
# thread counts while the losses agreed to 1e-7).
compare_losses() {
    checks=$((checks + 1))
    python3 - "$1" "$2" "${4:-0}" "${5:-}" "${6:-}" <<'PY' || fail "$3: losses differ"
import json, sys
def load(path):
    d = {}
    for line in open(path):
        j = json.loads(line)
        d[j["step"]] = (j["loss"], j["grad_norm"])
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
frm = int(sys.argv[3])
if frm == 0:
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
steps = [s for s in sorted(a) if s >= frm]
assert steps and all(s in b for s in steps), ("missing steps", steps, sorted(b))
for s in steps:
    tol = float(sys.argv[4]) if sys.argv[4] else (1e-6 if s == 1 else 1e-5)
    if s == 1 and sys.argv[5]:
        tol = float(sys.argv[5])
    for k, what in enumerate(("loss", "grad_norm")):
        x, y = a[s][k], b[s][k]
        rel = abs(x - y) / abs(x)
        assert rel <= (tol if k == 0 else 10 * tol), f"step {s} {what}: {x:.9g} vs {y:.9g}: relative difference {rel:.3e} > {tol}"
print(f"{len(steps)} steps agree (loss and grad_norm)")
PY
}

# params_close A.h5 B.h5 LABEL [RTOL]: every /model tensor of two
# checkpoint files agrees norm-wise, ||a - b|| <= RTOL ||a|| (default
# 1e-5), reading the raw float32 data that h5dump -b writes.
params_close() {
    checks=$((checks + 1))
    python3 - "$1" "$2" "${4:-1e-5}" "$workdir" <<'PY' || fail "$3: parameters differ"
import array, math, os, re, subprocess, sys
a, b, rtol, tmp = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
ls = [l.split(None, 1) for l in subprocess.run(["h5ls", "-r", a + "/model"], check=True,
      capture_output=True, text=True).stdout.splitlines() if "Dataset" in l]
names = [n for n, _ in ls]
sizes = [math.prod(int(x) for x in re.findall(r"\d+", d.split("{", 1)[1])) for _, d in ls]
assert names, "no /model tensors in " + a
def load_all(f):
    # one h5dump for every tensor: their bytes concatenated in this order
    out = os.path.join(tmp, "t.bin")
    cmd = ["h5dump", "-b", "LE", "-o", out]
    for n in names:
        cmd += ["-d", "/model" + n]
    subprocess.run(cmd + [f], check=True, capture_output=True)
    v = array.array("f"); v.frombytes(open(out, "rb").read())
    assert len(v) == sum(sizes), (f, len(v), sum(sizes))
    parts, at = {}, 0
    for n, k in zip(names, sizes):
        parts[n], at = v[at:at + k], at + k
    return parts
ta, tb = load_all(a), load_all(b)
worst = 0
for n in names:
    x, y = ta[n], tb[n]
    assert len(x) == len(y), (n, len(x), len(y))
    d = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)))
    r = d / max(math.sqrt(sum(p * p for p in x)), 1e-30)
    worst = max(worst, r)
    assert r <= rtol, f"{n}: relative difference {r:.3e} > {rtol}"
print(f"{len(names)} tensors agree, worst relative difference {worst:.2e}")
PY
}

# final NAME: the step-20 checkpoint file of the parity run NAME.
final() { echo "$workdir/$1/step_00000020/model.h5"; }

# parity REF NAME LABEL: run NAME computes run REF: the losses and gradient
# norms (compare_losses) and the final parameters within 5e-5 per tensor
# (params_close; the parallel sums round differently from one device's).
parity() {
    compare_losses "$workdir/$1.jsonl" "$workdir/$2.jsonl" "$3"
    params_close "$(final "$1")" "$(final "$2")" "$3: final parameters" 5e-5
}

# val_close REF NAME LABEL: the validation losses of two runs (at step 20,
# their only validation) agree within 1e-5 relative.
val_close() {
    checks=$((checks + 1))
    python3 - "$workdir/$1.jsonl" "$workdir/$2.jsonl" <<'PY' || fail "$3: validation losses differ"
import json, sys
def val(path):
    return {j["step"]: j["val_loss"] for j in map(json.loads, open(path)) if "val_loss" in j}
a, b = val(sys.argv[1]), val(sys.argv[2])
assert sorted(a) == [20] and sorted(b) == sorted(a), (a, b)
for s in a:
    assert abs(a[s] - b[s]) <= 1e-5 * abs(a[s]), (s, a[s], b[s])
print("validation losses agree:", a, b)
PY
}

# smaller_as_planned REF.log RUN.log WHAT FACTOR TOL LABEL: the log's
# memory line WHAT ("activations", "optimizer state"): RUN's measured
# figure is below FACTOR x REF's and within TOL (relative) of its plan.
smaller_as_planned() {
    checks=$((checks + 1))
    python3 - "$1" "$2" "$3" "$4" "$5" <<'PY' || fail "$6: $3 not smaller or not as planned"
import re, sys
def fig(path):
    m = re.search(sys.argv[3] + r" ([0-9.]+) / ([0-9.]+)", open(path).read())
    return float(m[1]), float(m[2])
(ref, _), (run, plan) = fig(sys.argv[1]), fig(sys.argv[2])
assert run < float(sys.argv[4]) * ref, (ref, run)
assert abs(run - plan) <= float(sys.argv[5]) * run, (run, plan)
print(f"{sys.argv[3]}: {ref} MiB -> {run} MiB (plan {plan})")
PY
}

finish() {
    echo "$(basename "$0"): $checks checks, $failures failed"
    [ "$failures" -eq 0 ] || exit 1
    exit 0
}
