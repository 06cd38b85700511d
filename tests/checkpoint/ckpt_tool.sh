#!/bin/sh
# ckpt_tool.sh: meshtrain-ckpt, run directly (no MPI launcher), on a real
# checkpoint_dir written by a short dense training run (steps 5 and 10):
# list (text and JSON, the JSON parsed when python3 is available), verify
# before and after a byte of model.h5 is corrupted, steps, config, the
# resolution of a checkpoint_dir to a step, files that are not
# checkpoints, and usage errors (exit 2).
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
ckpt="$bindir/meshtrain-ckpt"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
ck="$workdir/ck"

expect_rc 0 "$bindir/meshtrain-dense" --config "$testconfigs/train-small.yaml" \
    dataset.path="$data" checkpoint.checkpoint_dir="$ck" \
    logging.metrics_file="$workdir/m.jsonl" step_scheduler.max_steps=10
checks=$((checks + 1))
[ -d "$ck/step_00000005" ] && [ -d "$ck/step_00000010" ] || fail "training wrote: $(ls "$ck")"

# list: a checkpoint_dir resolves to the step `latest` names
expect_rc 0 "$ckpt" list "$ck"
expect_in "$err" "using $ck/step_00000010 (named by $ck/latest)" "resolution note"
expect_in "$out" "step dir          $ck/step_00000010" "step dir line"
expect_in "$out" "format            meshtrain-checkpoint, version 1" "format line"
expect_in "$out" "step              10" "step line"
expect_in "$out" "consumed samples  80" "consumed samples (10 steps x 8)"
expect_in "$out" "mesh              world 1: pp 1 x dp_replicate 1 x dp_shard 1 x cp 1 x tp 1" "mesh line"
expect_in "$out" "world size        1" "world size line"
expect_in "$out" "software          meshtrain " "software line"
line=$(printf '%s\n' "$out" | grep '^/model/model.layers.0.self_attn.q_proj.weight ')
expect_in "$line" " [64, 64] " "q_proj shape"
expect_in "$line" " float32 " "q_proj dtype"
expect_in "$line" " 16384" "q_proj bytes"
expect_in "$out" "/optim/model.layers.1.mlp.down_proj.weight/exp_avg_sq" "optimizer state listed"
expect_in "$out" "/train/step" "train scalars listed"
# 2 layers of 64x64 q/o, 32x64 k/v, 3 MLP 64x160 matrices, 2 norms; 258x64
# embedding and head; the final norm: 119360.  Adam holds two copies.
expect_in "$out" "model parameters  119360" "parameter total"
expect_in "$out" "optimizer state   238720" "optimizer state total"
expect_in "$out" "file bytes        $(wc -c < "$ck/step_00000010/model.h5" | tr -d ' ')" "file bytes"

# the step directory itself, and its model.h5, work the same way
expect_rc 0 "$ckpt" list "$ck/step_00000005"
expect_in "$out" "step              5" "explicit step dir"
expect_rc 0 "$ckpt" list "$ck/step_00000005/model.h5"
expect_in "$out" "step dir          $ck/step_00000005" "model.h5 path"

expect_rc 0 "$ckpt" list --json "$ck/step_00000010"
if command -v python3 >/dev/null 2>&1; then
    printf '%s' "$out" > "$workdir/list.json"
    checks=$((checks + 1))
    python3 - "$workdir/list.json" "$ck/step_00000010" <<'PY' || fail "list JSON does not parse or is wrong"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["step_dir"] == sys.argv[2], j["step_dir"]
assert (j["format"], j["version"], j["step"], j["consumed_samples"]) == ("meshtrain-checkpoint", 1, 10, 80), j
assert j["world_size"] == 1 and j["mesh"].startswith("world 1: "), j
ds = {d["path"]: d for d in j["datasets"]}
q = ds["/model/model.layers.0.self_attn.q_proj.weight"]
assert q["shape"] == [64, 64] and q["dtype"] == "float32" and q["bytes"] == 64 * 64 * 4, q
assert ds["/train/step"]["shape"] == [] and ds["/train/step"]["value"] == 10
model = [d for p, d in ds.items() if p.startswith("/model/")]
optim = [d for p, d in ds.items() if p.startswith("/optim/") and p != "/optim/step"]
assert len(model) == 21 and len(optim) == 42, (len(model), len(optim))
t = j["totals"]
assert t["datasets"] == len(ds) == 21 + 42 + 1 + 5, t
assert t["model_parameters"] == sum(d["elements"] for d in model) == 119360, t
assert t["optimizer_state"] == 2 * t["model_parameters"], t
assert t["tensor_bytes"] == sum(d["bytes"] for d in ds.values()) < t["file_bytes"], t
PY
fi

# verify, config
expect_rc 0 "$ckpt" verify "$ck/step_00000010"
expect_in "$out" "$ck/step_00000010: OK" "verify ok"
expect_rc 0 "$ckpt" config "$ck"
expect_in "$out" "hidden_size: 64" "stored config"
expect_in "$out" "max_steps: 10" "stored config has the command-line override"
expect_in "$out" "# derived: world_size=1" "stored config is the resolved one"
printf '%s\n' "$out" > "$workdir/stored.yaml"
expect_rc 0 "$bindir/meshtrain-plan" --config "$workdir/stored.yaml" --world-size 1

# steps: both complete, the newer one is `latest`
expect_rc 0 "$ckpt" steps "$ck"
expect_in "$out" "  step_00000005  complete" "steps: 5 complete"
expect_in "$out" "* step_00000010  complete" "steps: 10 complete and latest"

# Corrupt one byte of the newest: verify fails naming the file and the
# problem; steps reports it and what resume: auto would load instead.
printf 'X' | dd of="$ck/step_00000010/model.h5" bs=1 seek=4096 conv=notrunc 2>/dev/null
mkdir "$ck/step_00000015.tmp"
expect_rc 1 "$ckpt" verify "$ck/step_00000010"
expect_in "$err" "verify failed: $ck/step_00000010/model.h5: SHA-256 mismatch" "verify names the problem"
expect_rc 1 "$ckpt" verify "$ck"
expect_in "$err" "SHA-256 mismatch" "verify of the checkpoint_dir checks what latest names"
expect_rc 0 "$ckpt" steps "$ck"
expect_in "$out" "* step_00000010      corrupt: $ck/step_00000010/model.h5: SHA-256 mismatch" "steps: corrupt"
expect_in "$out" "  step_00000005      complete" "steps: older still complete"
expect_in "$out" "  step_00000015.tmp  partial" "steps: partial"
expect_in "$out" "auto-resume     step_00000005" "steps: resume target"
expect_rc 0 "$ckpt" steps --json "$ck"
if command -v python3 >/dev/null 2>&1; then
    printf '%s' "$out" > "$workdir/steps.json"
    checks=$((checks + 1))
    python3 - "$workdir/steps.json" <<'PY' || fail "steps JSON does not parse or is wrong"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["latest"] == "step_00000010" and j["resume"] == "step_00000005", j
got = [(s["name"], s["step"], s["status"], s["latest"]) for s in j["steps"]]
assert got == [("step_00000005", 5, "complete", False), ("step_00000010", 10, "corrupt", True),
               ("step_00000015.tmp", 15, "partial", False)], got
assert "SHA-256 mismatch" in j["steps"][1]["reason"] and j["steps"][0]["reason"] is None
PY
fi

# Without `latest`, a checkpoint_dir resolves to the newest that verifies.
rm "$ck/latest"
expect_rc 0 "$ckpt" list "$ck"
expect_in "$out" "step dir          $ck/step_00000005" "fallback to newest complete"
expect_in "$err" "skipping checkpoint step_00000010" "fallback warns about the corrupt one"

# Not checkpoints.
mkdir "$workdir/junk"
echo "not hdf5" > "$workdir/junk/model.h5"
expect_rc 1 "$ckpt" list "$workdir/junk"
expect_in "$err" "$workdir/junk/model.h5: cannot open as HDF5 (HDF5: file signature not found)" "not HDF5"
expect_rc 1 "$ckpt" verify "$workdir/junk"
expect_in "$err" "no manifest.sha256" "no manifest"
if command -v h5copy >/dev/null 2>&1; then
    mkdir "$workdir/other"
    h5copy -i "$ck/step_00000005/model.h5" -o "$workdir/other/model.h5" -s /model -d /model
    expect_rc 1 "$ckpt" list "$workdir/other"
    expect_in "$err" "not a meshtrain checkpoint: it has no /meta group" "another program's file"
fi
expect_rc 1 "$ckpt" list "$workdir/none"
expect_in "$err" "$workdir/none: No such file or directory" "missing path"
expect_rc 1 "$ckpt" steps "$workdir/none"

# Usage errors.
expect_rc 2 "$ckpt"
expect_in "$err" "a command is required" "no command"
expect_rc 2 "$ckpt" frobnicate "$ck"
expect_in "$err" "unknown command 'frobnicate'" "unknown command"
expect_rc 2 "$ckpt" list
expect_in "$err" "list needs a PATH" "missing path"
expect_rc 2 "$ckpt" list "$ck" "$ck"
expect_rc 2 "$ckpt" list --bogus "$ck"
expect_rc 2 "$ckpt" verify --json "$ck"
expect_rc 0 "$ckpt" --help
expect_in "$out" "usage: meshtrain-ckpt list" "help"
finish
