#!/bin/sh
# config_overflow.sh: model sizes whose products overflow int64 (vocab_size,
# hidden_size, num_hidden_layers, num_experts of 2^62) are refused by
# meshtrain-plan's validation naming the key and the product, instead of a
# SIGFPE or a negative memory estimate.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
plan="$bindir/meshtrain-plan"
cfg="$testconfigs/train-small.yaml"
big=4611686018427387904
expect_rc 0 "$plan" --config "$cfg" --world-size 1
for key in vocab_size hidden_size num_hidden_layers intermediate_size; do
    expect_rc 1 "$plan" --config "$cfg" --world-size 1 model.$key=$big
    expect_in "$out$err" "model.$key: " "$key named"
    expect_in "$out$err" "overflows a 64-bit integer: the model is too large to size" "$key overflow"
done
expect_rc 1 "$bindir/meshtrain-plan" --config "$cfg" --world-size 1 \
    model.num_experts=$big model.moe_intermediate_size=64
expect_in "$out$err" "model.num_experts: num_experts x hidden_size x 3 x moe_intermediate_size" \
    "num_experts overflow"
finish
