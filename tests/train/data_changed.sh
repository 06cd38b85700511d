#!/bin/sh
# data_changed.sh: a token file changed under a running 2-rank job stops it
# with an error naming the file and the offset, not ids past the embedding
# table or SIGBUS.  The run reads the corpus in order (shuffle off) for many
# epochs; once its first steps are logged, the file is changed at the start,
# which the run reads again at the next epoch.
#  1. one token overwritten in place (dd conv=notrunc) with id 65535;
#  2. the file truncated (truncate -s) to 4096 bytes.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
dense="$bindir/meshtrain-dense"
[ -r "$data" ] || { echo "no $data: build it with make"; exit 99; }

# run NAME: a long run on $workdir/NAME.bin in the background ($pid); waits
# for two logged steps
run() {
    cp "$data" "$workdir/$1.bin"
    np 2 "$dense" --config "$small_cfg" dataset.path="$workdir/$1.bin" dataset.shuffle=false \
        step_scheduler.max_steps=5000 checkpoint.enabled=false logging.log_every_steps=1 \
        logging.metrics_file="$workdir/$1.jsonl" > "$workdir/$1.out" 2>&1 &
    pid=$!
    for i in $(seq 1 6000); do
        [ "$(cat "$workdir/$1.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && return 0
        sleep 0.01
    done
    fail "$1: no step logged: $(cat "$workdir/$1.out")"
}
# stopped NAME NEEDLE...: the run exited 1 with each NEEDLE in its output
stopped() {
    name=$1; shift
    wait "$pid"; rc=$?
    o=$(cat "$workdir/$name.out")
    checks=$((checks + 1))
    [ "$rc" -eq 1 ] || fail "$name: exit $rc, expected 1 (not a signal): $o"
    for n in "$@"; do expect_in "$o" "$n" "$name"; done
}

# token 100 (byte 1024 + 2 * 100 = 1224, after the 1024-byte llm.c header)
run bad
printf '\377\377' | dd of="$workdir/bad.bin" bs=1 seek=1224 conv=notrunc 2>/dev/null
stopped bad "$workdir/bad.bin: token 65535 at byte offset 1224 (token 100) is out of range [0, 258)"

size=$(wc -c < "$data" | tr -d ' ')
run short
truncate -s 4096 "$workdir/short.bin"
stopped short "$workdir/short.bin: truncated while mapped: 4096 bytes now, $size when opened" \
    "is gone"
finish
