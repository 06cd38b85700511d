#!/bin/sh
# plot.sh: meshtrain-plot draws a run's metrics.jsonl into a PNG (magic
# bytes, IHDR size, not trivially small), with and without val_loss, and
# fails clearly on a missing, empty or foreign file.  Skips (77) without
# gnuplot.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
plot="$abs_top_srcdir/apps/meshtrain-plot"
command -v gnuplot >/dev/null 2>&1 || { echo "SKIP: no gnuplot (Debian: gnuplot-nox)"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }

# is_png FILE W H: PNG signature and the IHDR width and height.
is_png() {
    checks=$((checks + 1))
    python3 - "$@" <<'PY' || fail "$1 is not a ${2}x${3} PNG of some content"
import struct, sys, os
path, w, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
b = open(path, "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n", b[:8]
assert b[12:16] == b"IHDR"
assert struct.unpack(">II", b[16:24]) == (w, h), struct.unpack(">II", b[16:24])
assert os.path.getsize(path) > 5000, os.path.getsize(path)
PY
}

# A metrics file as the trainers write it: 30 steps, val_loss every 10,
# and steps 21..25 written twice (a resumed run appends).
python3 - "$workdir/m.jsonl" <<'PY'
import json, math, sys
with open(sys.argv[1], "w") as f:
    def row(s):
        r = {"step": s, "loss": 5.5 * math.exp(-s / 12) + 1.0, "grad_norm": 1.0, "lr": 1e-3,
             "tokens": 512, "step_time_s": 0.1, "tokens_per_s": 5120.0, "mfu": 0.1}
        if s % 10 == 0:
            r["val_loss"] = r["loss"] + 0.1
        f.write(json.dumps(r) + "\n")
    for s in range(1, 26): row(s)
    for s in range(21, 31): row(s)
PY
expect_rc 0 "$plot" "$workdir/m.jsonl" -o "$workdir/loss.png"
expect_in "$out" "wrote $workdir/loss.png: steps 1..30, 30 losses, 3 validation losses" "summary line"
is_png "$workdir/loss.png" 960 600
sed 's/, "val_loss": [-0-9.e]*//' "$workdir/m.jsonl" > "$workdir/noval.jsonl"
expect_rc 0 "$plot" "$workdir/noval.jsonl" -o "$workdir/noval.png" --size 640x400 --smooth 5 \
    --log-y --title 'a "quoted" title'
expect_in "$out" "30 losses" "without val_loss"
is_png "$workdir/noval.png" 640 400
# the default output name, in the current directory
(cd "$workdir" && "$plot" noval.jsonl >/dev/null) && is_png "$workdir/loss.png" 960 600

expect_rc 1 "$plot" "$workdir/missing.jsonl" -o "$workdir/x.png"
expect_in "$err" "cannot read $workdir/missing.jsonl: No such file or directory" "missing file"
: > "$workdir/empty.jsonl"
expect_rc 1 "$plot" "$workdir/empty.jsonl" -o "$workdir/x.png"
expect_in "$err" "has no metrics lines" "empty file"
echo '{"step": 1, "loss": 2.0}' > "$workdir/bad.jsonl"; echo 'not json' >> "$workdir/bad.jsonl"
expect_rc 1 "$plot" "$workdir/bad.jsonl" -o "$workdir/x.png"
expect_in "$err" "bad.jsonl:2: " "bad line named"
checks=$((checks + 1))
[ ! -e "$workdir/x.png" ] || fail "a failed plot left $workdir/x.png"
expect_rc 2 "$plot"
expect_in "$err" "usage: meshtrain-plot" "usage"
expect_rc 0 "$plot" --help
finish
