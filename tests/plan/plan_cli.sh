#!/bin/sh
# plan_cli.sh: the installed-style meshtrain-plan binary, run without an
# MPI launcher: exit codes, text and JSON output (JSON parsed when python3
# is available), warnings, and the resolved config it prints.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
plan="$bindir/meshtrain-plan"

expect_rc 0 "$plan" --config "$configs/llama3-8b-fsdp2-tp8.yaml" --world-size 16 --ranks-per-node 8
expect_in "$out" "mesh                 pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 8" "8B mesh"
expect_in "$out" "parameters           8.03B" "8B parameter count"
expect_in "$out" "optimizer state" "memory table"

expect_rc 0 "$plan" --config "$configs/moe-ep16.yaml" --world-size 16 --ranks-per-node 8
expect_in "$out" "moe mesh             pp 1 x ep_shard 1 x ep 16" "moe mesh"
expect_in "$out" "ep            1 group of 16" "ep group"

expect_rc 0 "$plan" --config "$configs/tiny.yaml" --world-size 4 --print-config \
    distributed.dp_replicate_size=2
expect_in "$out" "dp_replicate_size: 2" "resolved config shows override"
expect_in "$out" "# derived: world_size=4 dp_size=4 dp_replicate=2 dp_shard=2" "derived line"

# A pipeline block with pp_size 1 is ignored with a warning, not an error.
expect_rc 0 "$plan" --config "$configs/tiny.yaml" --world-size 1 distributed.pipeline.pp_schedule=gpipe
expect_in "$err" "warning: override 'distributed.pipeline.pp_schedule=gpipe': distributed.pipeline: ignored because pp_size is 1" "pipeline warning"

expect_rc 1 "$plan" --config "$configs/tiny.yaml" --world-size 8 distributed.pp_size=2
expect_in "$err" "needs a \`pipeline:\` block" "missing pipeline block"

expect_rc 2 "$plan" --world-size 8
expect_rc 2 "$plan" --config "$configs/tiny.yaml" --world-size 8 --bogus
expect_rc 2 "$plan" --config "$configs/tiny.yaml" --world-size 8 --app giant

# The bubble is simulated from the generated schedules; all seven are listed.
expect_rc 0 "$plan" --config "$configs/qwen3-14b-tp4-pp2.yaml" --world-size 8
expect_in "$out" "pipeline bubble        11.1% (simulated: F = B = W per stage, no communication time, p=2 m=8 v=1)" "1f1b bubble (p-1)/(m+p-1)"
expect_in "$out" "* 1f1b               1    11.1%" "chosen schedule marked"
expect_in "$out" "  zero_bubble        1     4.0%" "ZB-H1 (p-1)/(3m+p-1)"
expect_in "$out" "  interleaved_1f1b   2     5.9%" "interleaved (p-1)/(vm+p-1)"
expect_rc 0 "$plan" --config "$configs/tiny.yaml" --world-size 4 distributed.pp_size=4 \
    distributed.pipeline.pp_schedule=gpipe
expect_in "$out" "interleaved_1f1b   2  n/a: interleaved_1f1b needs the number of microbatches (2" "refused schedule listed"
expect_rc 1 "$plan" --config "$configs/tiny.yaml" --world-size 4 distributed.pp_size=4 \
    distributed.pipeline.pp_schedule=interleaved_1f1b model.num_hidden_layers=8
expect_in "$err" "to be a multiple of pp_size 4" "interleaved microbatch rule"

expect_rc 0 "$plan" --config "$configs/llama3-70b-tp8-pp4.yaml" --world-size 64 --json
if command -v python3 >/dev/null 2>&1; then
    printf '%s' "$out" > "$workdir/plan.json"
    checks=$((checks + 1))
    python3 - "$workdir/plan.json" <<'PY' || fail "plan JSON does not parse or is inconsistent"
import json, sys
p = json.load(open(sys.argv[1]))
s = p["sizes"]
assert s["world"] == s["pp"] * s["dp"] * s["cp"] * s["tp"] == 64, s
for name, groups in p["groups"].items():
    flat = sorted(r for g in groups for r in g)
    assert flat == list(range(64)), name          # every rank once per axis
assert p["groups"]["tp"][1] == list(range(8, 16))
m = p["memory_per_rank_bytes"]
assert abs(m["total"] - (m["parameters"] + m["gradients"] + m["optimizer"] + m["activations"])) < 4
pl = p["pipeline"]
rows = {r["schedule"]: r for r in pl["schedules"]}
assert len(rows) == 7 and [r for r in rows.values() if r["chosen"]] == [rows[pl["schedule"]]], pl
assert rows[pl["schedule"]]["bubble_fraction"] == pl["bubble_fraction"], pl
assert rows["zero_bubble"]["bubble_fraction"] < rows["1f1b"]["bubble_fraction"], pl
PY
fi
finish
