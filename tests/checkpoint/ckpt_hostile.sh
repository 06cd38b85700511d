#!/bin/sh
# ckpt_hostile.sh: checkpoints crafted by tests/checkpoint/ckpt_craft (a
# /meta attribute stored as an array, int or fixed or variable-length
# string; a /train value stored as an array or out of range) are refused
# by meshtrain-ckpt and by resume with the attribute's name, never read
# past a buffer.  Soft and external links and datasets stored in other
# files are refused by path.  The manifest is rewritten to match, as a hostile writer
# would.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
ckpt="$bindir/meshtrain-ckpt"
craft="$abs_top_builddir/tests/checkpoint/ckpt_craft"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }
ck="$workdir/ck"
cfg="$testconfigs/train-small.yaml"
expect_rc 0 "$bindir/meshtrain-dense" --config "$cfg" dataset.path="$data" \
    checkpoint.checkpoint_dir="$ck" logging.metrics_file="$workdir/m.jsonl" \
    step_scheduler.max_steps=5

# fresh CASE: a copy of the step directory to craft, its path in $d
fresh() {
    d="$workdir/$1"
    rm -rf "$d" && mkdir -p "$d" && cp -r "$ck/step_00000005" "$d/" && d="$d/step_00000005"
}
# craft ARGS...: change model.h5, then write a matching manifest
craft() {
    checks=$((checks + 1))
    "$craft" "$d/model.h5" "$@" || fail "ckpt_craft $* failed"
    (cd "$d" && sha256sum model.h5 > manifest.sha256)
}
# readers ATTR: the commands that read /meta ATTR (resume reads format
# and version; config reads only config)
readers() {
    case "$1" in
    format | version) echo list verify resume ;;
    config) echo config ;;
    *) echo list verify ;;
    esac
}
# refused ATTR NEEDLE: each reader of ATTR exits 1 naming it
refused() {
    for cmd in $(readers "$1"); do
        if [ "$cmd" = resume ]; then
            expect_rc 1 "$bindir/meshtrain-dense" --config "$cfg" dataset.path="$data" \
                checkpoint.checkpoint_dir="$workdir/resume" checkpoint.resume="$d" \
                logging.metrics_file="$workdir/r.jsonl" step_scheduler.max_steps=6
            expect_in "$err$out" "$2" "$1: resume"
        else
            expect_rc 1 "$ckpt" $cmd "$d"
            expect_in "$err" "$2" "$1: $cmd"
        fi
    done
}

for a in version world_size; do
    fresh "int-$a"; craft attr-int-array /meta $a
    refused $a "attribute /meta $a is not a scalar (an array, 4 elements)"
done
for a in format mesh config; do
    fresh "str-$a"; craft attr-str-array /meta $a
    refused $a "attribute /meta $a is not a scalar (an array, 4 elements)"
    fresh "vstr-$a"; craft attr-vstr-array /meta $a
    refused $a "attribute /meta $a is not a scalar (an array, 4 elements)"
done

# /train values: arrays, and values no run can reach
fresh train-array; craft dset-array /train/step
expect_rc 1 "$bindir/meshtrain-dense" --config "$cfg" dataset.path="$data" \
    checkpoint.checkpoint_dir="$workdir/resume" checkpoint.resume="$d" \
    logging.metrics_file="$workdir/r.jsonl" step_scheduler.max_steps=6
expect_in "$err$out" "model.h5: /train/step is not a scalar (8 elements)" "train step array"
for v in -1 9223372036854775807; do
    fresh "step$v"; craft dset-value /train/step "$v"
    expect_rc 1 "$bindir/meshtrain-dense" --config "$cfg" dataset.path="$data" \
        checkpoint.checkpoint_dir="$workdir/resume" checkpoint.resume="$d" \
        logging.metrics_file="$workdir/r.jsonl" step_scheduler.max_steps=6
    expect_in "$err$out" "/train/step is $v, outside [0, 1099511627776]" "train step $v"
done
fresh samples; craft dset-value /train/consumed_samples -8
expect_rc 1 "$bindir/meshtrain-dense" --config "$cfg" dataset.path="$data" \
    checkpoint.checkpoint_dir="$workdir/resume" checkpoint.resume="$d" \
    logging.metrics_file="$workdir/r.jsonl" step_scheduler.max_steps=6
expect_in "$err$out" "/train/consumed_samples is -8, outside [0," "negative consumed samples"

# links and storage outside the file: every reader refuses them, naming
# the path, before it opens anything they point at
outside() {
    for cmd in list verify resume; do
        if [ "$cmd" = resume ]; then
            expect_rc 1 "$bindir/meshtrain-dense" --config "$cfg" dataset.path="$data" \
                checkpoint.checkpoint_dir="$workdir/resume" checkpoint.resume="$d" \
                logging.metrics_file="$workdir/r.jsonl" step_scheduler.max_steps=6
            expect_in "$err$out" "$1" "$2: resume"
        else
            expect_rc 1 "$ckpt" $cmd "$d"
            expect_in "$err" "$1" "$2: $cmd"
        fi
    done
}
printf 'not a tensor' > "$workdir/raw.bin"
fresh extlink; craft extlink /model/evil "$workdir/other.h5"
outside "/model/evil is an external link (to another file)" "external link"
fresh softlink; craft softlink /model/model.norm.weight /model/model.embed_tokens.weight
outside "/model/model.norm.weight is a soft link" "soft link"
fresh extstore; craft extstore /model/model.norm.weight "$workdir/raw.bin"
outside "/model/model.norm.weight keeps its data in external files" "external storage"

# object headers overwritten (bit rot, with a manifest to match): said to be
# damaged, not blamed on links
fresh damaged
head -c 4000 /dev/zero | tr '\0' 'Z' | dd of="$d/model.h5" bs=1 seek=1000 conv=notrunc 2>/dev/null
(cd "$d" && sha256sum model.h5 > manifest.sha256)
checks=$((checks + 1))
outside "cannot be opened: the file is damaged" "damaged headers"

# the untouched checkpoint still resumes
expect_rc 0 "$bindir/meshtrain-dense" --config "$cfg" dataset.path="$data" \
    checkpoint.checkpoint_dir="$workdir/resume" checkpoint.resume="$ck/step_00000005" \
    logging.metrics_file="$workdir/r.jsonl" step_scheduler.max_steps=6
finish
