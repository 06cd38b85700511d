#!/bin/sh
# checkpoint_h5dump.sh: a checkpoint written by 2 ranks reads with the
# stock tools, as doc/checkpoints.md shows: h5dump and h5ls see the
# documented paths, dtypes, shapes, values and /meta attributes (also of
# tensors written as column blocks), and coreutils' sha256sum accepts the
# manifest.  Skips (77) without h5dump.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"

command -v h5dump >/dev/null 2>&1 || { echo "checkpoint_h5dump.sh: no h5dump; skipping"; exit 77; }
prog="$abs_top_builddir/tests/checkpoint/test_checkpoint"
[ -x "$prog" ] || { echo "checkpoint_h5dump.sh: $prog not built" >&2; exit 99; }

# test_checkpoint save=DIR writes step 7: three tensors, rows split over
# the ranks, and a small config.
expect_rc 0 timeout 120 "$MPIEXEC" $MPIEXEC_NP 2 "$prog" "save=$workdir/ckpt"
step="$workdir/ckpt/step_00000007"
file="$step/model.h5"

checks=$((checks + 1))
[ "$(cat "$workdir/ckpt/latest")" = step_00000007 ] || fail "latest: $(cat "$workdir/ckpt/latest")"

expect_rc 0 h5dump -A "$file"
expect_in "$out" 'ATTRIBUTE "format"' "format attribute"
expect_in "$out" '(0): "meshtrain-checkpoint"' "format value"
expect_in "$out" 'ATTRIBUTE "version" {
         DATATYPE  H5T_STD_I32LE
         DATASPACE  SCALAR
         DATA {
         (0): 1' "version attribute"
expect_in "$out" 'ATTRIBUTE "world_size"' "world_size attribute"
expect_in "$out" '(0): "dp_shard=2 (world 2)"' "mesh attribute"
expect_in "$out" 'DATASET "model.embed_tokens.weight" {
         DATATYPE  H5T_IEEE_F32LE
         DATASPACE  SIMPLE { ( 10, 6 ) / ( 10, 6 ) }' "embedding dataset"
expect_in "$out" 'GROUP "model.layers.0.self_attn.q_proj.weight" {
         DATASET "exp_avg" {
            DATATYPE  H5T_IEEE_F32LE
            DATASPACE  SIMPLE { ( 3, 4, 5 ) / ( 3, 4, 5 ) }' "optimizer state dataset"

# The config prints as readable text.
expect_rc 0 h5dump -a /meta/config "$file"
expect_in "$out" '(0): "model:
             hidden_size: 64' "config text"

# Values written by two ranks (rank 0 rows 0-6, rank 1 none) in order.
expect_rc 0 h5dump -d /model/model.norm.weight "$file"
expect_in "$out" '(0): 406.75, 407.25, 407.75, 408.25, 408.75, 409.25, 409.75' "norm values"
expect_rc 0 h5dump -d /train/step "$file"
expect_in "$out" 'DATATYPE  H5T_STD_I64LE' "step dtype"
expect_in "$out" '(0): 7' "step value"

if command -v h5ls >/dev/null 2>&1; then
    expect_rc 0 h5ls -r "$file"
    got=$(printf '%s\n' "$out" | awk '{print $1}' | tr '\n' ' ')
    want="/ /meta /model /model/model.embed_tokens.weight /model/model.norm.weight /optim \
/optim/model.layers.0.self_attn.q_proj.weight /optim/model.layers.0.self_attn.q_proj.weight/exp_avg \
/optim/step /train /train/consumed_samples /train/data_epoch /train/rng_offset /train/rng_seed \
/train/step "
    checks=$((checks + 1))
    [ "$got" = "$want" ] || fail "h5ls -r lists:
$got
expected:
$want"
fi

# Blocks of rows x columns (tensor parallelism's column blocks): at 2
# ranks, rank 0 writes columns [0, 4) of o_proj and rank 1 columns
# [4, 8); the file holds the full logical tensor in PyTorch's order.
expect_rc 0 timeout 120 "$MPIEXEC" $MPIEXEC_NP 2 "$prog" "save-blocks=$workdir/blocks"
bfile="$workdir/blocks/step_00000001/model.h5"
expect_rc 0 h5dump -d /model/model.layers.0.self_attn.o_proj.weight "$bfile"
expect_in "$out" 'DATASPACE  SIMPLE { ( 6, 8 ) / ( 6, 8 ) }' "o_proj shape"
expect_in "$out" '(0,0): -99.25, -98.75, -98.25, -97.75, -97.25, -96.75, -96.25, -95.75,
   (1,0): -95.25, -94.75, -94.25, -93.75, -93.25, -92.75, -92.25, -91.75,' "o_proj rows 0-1"
expect_in "$out" '(5,0): -79.25, -78.75, -78.25, -77.75, -77.25, -76.75, -76.25, -75.75' \
    "o_proj row 5"
# a 3-D tensor split at column 3 of dim 1: (1, 2, :) from rank 0, (1, 3, :) from rank 1
expect_rc 0 h5dump -d /optim/model.layers.0.mlp.experts.down_proj/exp_avg -s "1,2,0" -c "1,2,3" "$bfile"
expect_in "$out" '(1,2,0): 912.75, 913.25, 913.75,
      (1,3,0): 914.25, 914.75, 915.25' "3-D tensor across the column split"

if command -v sha256sum >/dev/null 2>&1; then
    expect_rc 0 sh -c "cd '$step' && sha256sum -c manifest.sha256"
    expect_in "$out" "model.h5: OK" "sha256sum -c"
fi
finish
