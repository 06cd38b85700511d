#!/bin/sh
# bench_lora.sh: LoRA (peft:) against full fine-tuning of the same model
# on the same mesh (doc/lora.md), from the build directory:  make bench-lora
#
# Makes a base model (hidden 512, 4 layers, intermediate 1408, 8 heads,
# vocabulary 258: 13.1 M parameters) as a Hugging Face directory (the
# initial weights of tests/configs/train-small.yaml at that shape,
# exported), then trains it by name for STEPS steps of 4 x 256 tokens on
# NP ranks (default 1), full and with LoRA rank 16 on every projection,
# checkpoints off.  Reported: the log's memory line (measured and planned,
# per rank), the peak RSS of rank 0's process (/usr/bin/time -v when
# present), and the median step time of steps 2..STEPS.
# Environment: STEPS (6), NP (1), EXTRA (more key=value overrides, e.g.
# distributed.tp_size=2), MPIEXEC / MPIEXEC_NP, OUT (lora-bench).
set -e
srcdir=${srcdir:-$(dirname "$0")/..}
steps=${STEPS:-6} np=${NP:-1}
mpiexec=${MPIEXEC:-mpiexec} npflag=${MPIEXEC_NP:--n}
out=${OUT:-lora-bench}
rm -rf "$out" && mkdir -p "$out"
data=$(pwd)/share/data/tiny-corpus.bin
shape="model.hidden_size=512 model.intermediate_size=1408 model.num_hidden_layers=4
 model.num_attention_heads=8 model.num_key_value_heads=8 dataset.seq_length=256
 step_scheduler.global_batch_size=4 step_scheduler.local_batch_size=4 dataset.path=$data"
cfg="$srcdir/tests/configs/train-small.yaml"
# shellcheck disable=SC2086
apps/meshtrain-dense --config "$cfg" $shape step_scheduler.max_steps=1 checkpoint.save_initial=true \
    checkpoint.checkpoint_dir="$out/init" logging.metrics_file= > "$out/init.log"
apps/meshtrain-ckpt export "$out/init/step_00000000" -o "$out/base" > /dev/null
timer=
[ -x /usr/bin/time ] && timer="/usr/bin/time -v -o"
for run in full lora; do
    extra=
    [ $run = lora ] && extra="peft.dim=16 peft.alpha=32 peft.lora_A_init=uniform"
    # shellcheck disable=SC2086
    ${timer:+$timer "$out/$run.time"} $mpiexec $npflag "$np" apps/meshtrain-dense --config "$cfg" \
        $shape model.pretrained_model_name_or_path="$(pwd)/$out/base" checkpoint.enabled=false \
        step_scheduler.max_steps="$steps" logging.metrics_file="$out/$run.jsonl" $extra \
        ${EXTRA:-} > "$out/$run.log"
done
python3 - "$out" <<'PY'
import json, os, re, statistics, sys
out = sys.argv[1]
fig = {}
for run in ("full", "lora"):
    log = open(os.path.join(out, run + ".log")).read()
    mem = re.search(r"^memory per rank.*$", log, re.M)[0]
    steps = [json.loads(l) for l in open(os.path.join(out, run + ".jsonl"))]
    t = statistics.median(s["step_time_s"] for s in steps[1:])
    rss = ""
    tf = os.path.join(out, run + ".time")
    if os.path.exists(tf):
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(tf).read())
        rss = ", peak RSS %.1f MiB" % (int(m[1]) / 1024) if m else ""
    fig[run] = t
    print("%s: median step %.3f s%s\n  %s" % (run, t, rss, mem))
print("LoRA step time / full: %.2f" % (fig["lora"] / fig["full"]))
PY
