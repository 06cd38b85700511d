#!/bin/bash
# tests/gpu/run.sh: the GPU checks in one script, for a machine
# with an NVIDIA GPU (an H200 is the target).  Run it from the source tree:
#
#   bash tests/gpu/run.sh            (env: MT_CUDA_ARCH=sm_90, MT_GPU_BUILD=build-gpu,
#                                      MT_DEBS=debs, MT_PEAK_TFLOPS=989,
#                                      MT_GPU_SANITIZE=1 adds compute-sanitizer runs)
#
# A GPU machine without network and without autotools needs two things
# from a development machine, both ignored by git and so passed to the
# device tool as `carry`: `make dist`'s meshtrain-*.tar.gz and the debs/
# folder of share/fetch-gpu-debs.sh (about 41 MB; the carry limit is 64
# MiB).  doc/gpu.md, "Getting the dependencies onto a GPU machine".
#
# It:
#   0. unpacks debs/ (share/fetch-gpu-debs.sh made it) into a private
#      prefix with dpkg -x when the machine lacks MPICH, HDF5, libyaml or
#      OpenBLAS, and points the build at it;
#   1. builds with --with-cuda --with-nccl out of tree (from ./configure,
#      else a meshtrain-*.tar.gz from `make dist`, else ./autogen.sh);
#   2. runs the kernel tests: the CPU kernels (tests/backend/test_kernels,
#      test_kernels_layers, test_kernels_softmax: the reference), every
#      CUDA kernel against them (tests/backend/cuda/test_cuda_kernels), the bf16
#      tensor-core table (tests/backend/cuda/test_cuda_bf16) and the NCCL layer on one
#      rank (tests/comm/nccl-np1.mpi);
#   3. trains 10 steps on one rank on the GPU (distributed.device=cuda) and
#      on the CPU, dense and MoE, fp32 and bf16 (and bf16 at head dim 64,
#      the tensor-core attention, also on bf16 storage and on the WMMA
#      attention kernels instead of the mma.sync ones), and compares the
#      losses (2e-3 relative, 2e-2 in bf16); then the throughput of Llama
#      3.2 1B as shipped (vocabulary 128256) at sequence 2048 on bf16
#      storage (the default on cuda, the goal's row): 8 micro-steps of 8 x
#      2048 tokens a step, as the shipped config's rank does, and one
#      micro-step; tokens/s and MFU against MT_PEAK_TFLOPS; then that run
#      profiled (MESHTRAIN_PROFILE=1: each kernel's share of the step);
#   4. runs the GEMM throughput micro-benchmark (bench/bench_cuda_gemm:
#      bf16 cuBLASLt at Llama-1B shapes, TFLOP/s and MFU against 989, and
#      the same through the float32-storage FAST_16BF GEMM) and the 1B run
#      on float32 storage (what bf16 storage wins);
#      3b. two ranks sharing the GPU (the MPI-staged multi-rank paths: ddp,
#      fsdp2, tp 2 + SP, pp 2 in bf16, MoE ep 2) against step 3's CPU runs;
#      then the attention micro-benchmark (bench/bench_cuda_attention:
#      fp32 vs bf16 tensor-core kernels, T 2048, 32/8 heads of 64, B 1..4);
#   4a. the bf16 dense (head dim 64) and MoE runs of step 3 again with
#      MESHTRAIN_BF16_PASSES=1: the same bits as the fused roundings; the
#      1B run with the passes (what the fusion saves), and the fp32 1B run
#      (one micro-step), time permitting;
#   5. prints a short table last.
# MT_GPU_EMULATE=1 is a dry run on a machine without a GPU (its build step
# still needs the CUDA toolkit and NCCL, as the development machines
# have): the same steps on the host emulation of the CUDA kernels
# (tests/emu/cuda): the kernel tests and the apps built from the .cu
# files for the host, the throughput runs shrunk to a toy model (the
# figures mean nothing; the plumbing is what is checked), the benchmarks
# and nccl-np1 left out, and the two ranks of step 3b sharing one
# emulated GPU (MT_EMU_SHARED_GPU).  It checks this script before a GPU
# session depends on it.
# Exit status: 0 when every step that ran passed, 1 otherwise (a SKIP is
# a failure here: on a GPU machine it means the device was not seen).  Logs are
# kept under $MT_GPU_BUILD/gpu-logs/ and, when $OUT is set (the device
# tool's return folder), packed into $OUT/gpu-logs.tgz after every step;
# every step's row is printed as it ends ("ROW ...").  The whole script
# stops starting work after MT_GPU_DEADLINE seconds (540), so it fits in
# one device call of 600 s; leave MT_GPU_SANITIZE unset there (its four
# sanitizer runs do not fit).  Nothing here has run on a GPU yet:
# the first session with one runs it and fixes what it finds.
set -u
emulate=${MT_GPU_EMULATE:-0}
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${MT_GPU_BUILD:-$src/build-gpu}
arch=${MT_CUDA_ARCH:-sm_90}
debs=${MT_DEBS:-$src/debs}
peak=${MT_PEAK_TFLOPS:-989}
jobs=$(nproc 2>/dev/null || echo 4)
mkdir -p "$build/gpu-logs"
logs=$build/gpu-logs
declare -a rows
# row STEP RESULT DETAIL: kept for the final table, printed at once (a run
# cut short by the device tool's limit still shows what it got), and the
# logs so far packed into $OUT (the device tool's return folder) when set
row() {
    local l
    l=$(printf '%-34s %-6s %s' "$1" "$2" "$3")
    rows+=("$l")
    echo "ROW $l"
    [ -n "${OUT:-}" ] && [ -d "$OUT" ] && tar czf "$OUT/gpu-logs.tgz" -C "$logs" . 2>/dev/null
    return 0
}
# finish STATUS: the table of the rows so far, then exit with STATUS
finish() {
    printf '\n%-34s %-6s %s\n' "step" "result" "detail"
    printf '%s\n' "${rows[@]}"
    exit "$1"
}
# show_fail LOG: the end of a failed step's log on stdout
show_fail() { [ -f "$1" ] && { echo "---- tail of $1"; tail -n 40 "$1"; echo "----"; }; return 0; }
# the whole script must end before the device tool's 600 s: steps are cut
# off once MT_GPU_DEADLINE seconds (default 540) have passed
deadline=$(( $(date +%s) + ${MT_GPU_DEADLINE:-540} ))
left() { echo $(( deadline - $(date +%s) )); }
# limit S: S seconds, or what is left before the deadline (at least 5)
limit() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $(( l > 5 ? l : 5 )) || echo "$1"; }
fail=0
# bf16 compute on device cuda takes bf16 storage by default
# (doc/mixed-precision.md); the parity, passes and "bf16" rows measure
# float32 storage, the rows named "storage" set it to 1
MESHTRAIN_BF16_STORAGE=0
export MESHTRAIN_BF16_STORAGE

export PATH=/usr/local/cuda/bin:$PATH
# configure's default prefix is /usr/local/cuda: follow nvcc where it is elsewhere
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    export CUDA_HOME
fi
echo "run.sh: CUDA_HOME=${CUDA_HOME:-unset} ($(nvcc --version 2>/dev/null | tail -1))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv,noheader | sed 's/^/gpu: /'

# ---------------------------------------------------------------- 0. debs
ma=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
have_deps() { # MPICH, parallel HDF5 for MPICH, libyaml, OpenBLAS (openmp) all present?
    command -v mpicc.mpich >/dev/null && pkg-config --exists hdf5-mpich yaml-0.1 2>/dev/null &&
        [ -e "/usr/lib/$ma/openblas-openmp/libopenblas.so" ]
}
if [ -d "$debs" ] && ! have_deps; then
    root=$build/deps
    echo "run.sh: unpacking $(ls "$debs"/*.deb | wc -l) packages from $debs into $root"
    mkdir -p "$root"
    for d in "$debs"/*.deb; do dpkg -x "$d" "$root" || { echo "dpkg -x $d failed" >&2; fail=1; }; done
    # the MPICH wrappers name /usr paths: point them at the prefix
    for w in "$root"/usr/bin/mpicc.mpich "$root"/usr/bin/mpicxx.mpich; do
        [ -f "$w" ] && sed -i -e "s|^prefix=/usr|prefix=$root/usr|" \
            -e "s|^exec_prefix=/usr|exec_prefix=$root/usr|" \
            -e "s|^includedir=/usr|includedir=$root/usr|" -e "s|^libdir=/usr|libdir=$root/usr|" \
            -e "s|^sysconfdir=/etc|sysconfdir=$root/etc|" "$w"
    done
    export PATH=$root/usr/bin:$PATH
    export MPICC=$root/usr/bin/mpicc.mpich MPIEXEC=$root/usr/bin/mpiexec.hydra
    export CPATH=$root/usr/include:$root/usr/include/$ma${CPATH:+:$CPATH}
    export LIBRARY_PATH=$root/usr/lib/$ma:$root/usr/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=$root/usr/lib/$ma:$root/usr/lib/$ma/openblas-openmp:$root/usr/lib/$ma/hdf5/mpich${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_PATH=$root/usr/lib/$ma/pkgconfig:$root/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$root
    extra_cfg=(--with-blas="-L$root/usr/lib/$ma/openblas-openmp -Wl,-rpath,$root/usr/lib/$ma/openblas-openmp -lopenblas"
               BLAS_CFLAGS="-I$root/usr/include/$ma/openblas-openmp")
    row "deps from debs/ (dpkg -x)" "ok" "$root"
else
    extra_cfg=()
fi

# ---------------------------------------------------------------- NCCL
# configure looks in the CUDA prefix; where NCCL only comes as the Python
# wheel (nvidia-nccl-cu13: include/ and lib/libnccl.so.2, no libnccl.so),
# make a prefix of links to it
nccl_cfg=--with-nccl
if [ ! -f "${CUDA_HOME:-/usr/local/cuda}/include/nccl.h" ]; then
    wheel=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
    if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then
        mkdir -p "$build/nccl/include" "$build/nccl/lib"
        ln -sf "$wheel"/include/*.h "$build/nccl/include/"
        ln -sf "$(ls "$wheel"/lib/libnccl.so* | head -1)" "$build/nccl/lib/libnccl.so"
        export LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        nccl_cfg=--with-nccl=$build/nccl
        row "NCCL from the Python wheel" "ok" "$wheel"
    fi
fi

# ---------------------------------------------------------------- 1. build
cfg=$src/configure
if [ -f "$src/config.status" ]; then
    # configured in place: a VPATH build beside it is refused, so build there
    echo "run.sh: $src is configured in place: building there, not in $build"
    build=$src
fi
if [ ! -x "$cfg" ]; then
    tarball=$(ls "$src"/meshtrain-*.tar.gz 2>/dev/null | head -1)
    if [ -n "$tarball" ]; then
        tar -C "$build" -xzf "$tarball" && cfg=$(ls -d "$build"/meshtrain-*/configure | head -1)
        pkg=$(dirname "$cfg")
        # the tarball must be this tree: an old one would test old code
        if ! diff -rq "$src/src" "$pkg/src" >/dev/null 2>&1 ||
           ! cmp -s "$src/Makefile.am" "$pkg/Makefile.am" ||
           ! diff -rq "$src/tests" "$pkg/tests" -x '*.log' -x '*.trs' -x '*.o' >/dev/null 2>&1; then
            row "source tarball" "FAIL" "$(basename "$tarball") is not this tree: run make dist again"
            finish 1
        fi
    else
        (cd "$src" && ./autogen.sh) > "$logs/autogen.log" 2>&1
    fi
fi
t0=$(date +%s)
if (cd "$build" && "$cfg" --with-cuda "$nccl_cfg" --with-cuda-arch="$arch" "${extra_cfg[@]}" \
        > "$logs/configure.log" 2>&1 && make -j"$jobs" > "$logs/make.log" 2>&1 &&
        make -j"$jobs" check TESTS= > "$logs/make-check-build.log" 2>&1); then
    row "build (--with-cuda --with-nccl)" "ok" "$arch, $(( $(date +%s) - t0 )) s"
else
    row "build (--with-cuda --with-nccl)" "FAIL" "see $logs/configure.log, make.log"
    show_fail "$logs/configure.log"; show_fail "$logs/make.log"
    finish 1
fi

apps=$build/apps
if [ "$emulate" = 1 ]; then
    export MT_EMU_POISON=1 MT_EMU_SHARED_GPU=1
    if (cd "$build" && make tests/emu/cuda/build/bin/test_cuda_kernels > "$logs/emulate-build.log" 2>&1); then
        apps=$build/tests/emu/cuda/build/bin
        row "emulated kernels build (dry run)" "ok" "$apps"
    else
        row "emulated kernels build (dry run)" "FAIL" "see $logs/emulate-build.log"
        show_fail "$logs/emulate-build.log"
        finish 1
    fi
fi

# ---------------------------------------------------------------- 2. kernel tests
# (a hung kernel must not eat the machine's time: each test gets 5 minutes)
cpu_kernel_tests="tests/backend/test_kernels tests/backend/test_kernels_layers tests/backend/test_kernels_softmax"
kernel_tests="$cpu_kernel_tests tests/backend/cuda/test_cuda_kernels tests/backend/cuda/test_cuda_bf16 tests/comm/nccl-np1.mpi"
if [ "$emulate" = 1 ]; then # the emulated CUDA tests; nccl-np1 needs a device
    kernel_tests=$cpu_kernel_tests
    for t in test_cuda_kernels test_cuda_bf16; do
        if timeout "$(limit 150)" "$apps/$t" > "$logs/$t.emulated.log" 2>&1; then
            row "tests/$t (emulated)" "PASS" "$(tail -n 1 "$logs/$t.emulated.log")"
        else
            row "tests/$t (emulated)" "FAIL" "see $logs/$t.emulated.log"
            show_fail "$logs/$t.emulated.log"; fail=1
        fi
    done
fi
for t in $kernel_tests; do
    base=${t%.mpi}  # automake names the .log and .trs without the extension
    (cd "$build" && MT_TEST_VERBOSE=1 timeout "$(limit 150)" make check TESTS="$t" \
        > "$logs/$(basename "$base").check.log" 2>&1)
    res=$(sed -n 's/^:test-result: //p' "$build/$base.trs" 2>/dev/null | head -1)
    [ -n "$res" ] || res="ERROR"
    case $res in PASS) ;; *) fail=1; show_fail "$build/$base.log" ;; esac
    detail=$(grep -E 'checks|skipping|failed' "$build/$base.log" 2>/dev/null | tail -1)
    row "$t" "$res" "${detail:-see $build/$base.log}"
done

# ---------------------------------------------------------------- 2b. sanitizer
# memcheck and racecheck of the kernel test (shared-memory races in the
# attention and reduction kernels are what reading cannot rule out)
if [ "${MT_GPU_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    for t in test_cuda_kernels test_cuda_bf16; do
    for tool in memcheck racecheck; do
        if (cd "$build" && timeout "$(limit 120)" compute-sanitizer --tool "$tool" --error-exitcode 1 \
                tests/$t > "$logs/sanitizer-$tool-$t.log" 2>&1); then
            row "compute-sanitizer $tool" "ok" "tests/$t"
        else
            row "compute-sanitizer $tool" "FAIL" "tests/$t: see $logs/sanitizer-$tool-$t.log"
            fail=1
        fi
    done
    done
fi

# ---------------------------------------------------------------- 3. parity
# One rank trains 10 steps on the GPU (distributed.device=cuda: the model,
# AdamW and clipping on the device) and on the CPU, from the same seed, for
# the dense small model and a MoE (shared expert, activation
# checkpointing), each in fp32 and in bf16 mixed precision
# (doc/mixed-precision.md; on the GPU the tensor-core table).  The losses
# must agree at every step within 2e-3 relative in fp32 (sums in another
# order over 10 steps) and 2e-2 in bf16 (attention rounds P to bf16 on the
# tensor cores, and one-ulp differences move bf16 values by 2^-8).  Then
# the throughput of Llama 3.2 1B at sequence 2048 on the GPU, bf16 (the
# issue's goal) and fp32: tokens/s and MFU against the bf16 dense peak
# (meshtrain reports MFU against MT_PEAK_TFLOPS on cuda).
mpirun=${MPIEXEC:-mpiexec}
command -v "$mpirun" >/dev/null || mpirun=
# a launcher that cannot start here (hostname, proxy): one rank runs as an
# MPI singleton instead
if [ -n "$mpirun" ] && ! timeout 20 "$mpirun" -n 1 true >/dev/null 2>&1; then
    echo "run.sh: $mpirun -n 1 true fails: launching single ranks as MPI singletons"
    mpirun=
fi
# loss_diff REF OTHER TOL: 10 steps each, every loss within TOL relative
loss_diff() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:3])
assert len(a) == len(b) == 10, (len(a), len(b))
w = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"worst relative loss difference {w:.2e} over 10 steps (bound {sys.argv[3]})")
assert w <= float(sys.argv[3]), w
PY
}
run1() { # run1 SECONDS APP LOG ARGS...: one rank, at most SECONDS (and the deadline)
    t=$(limit "$1") app=$2 log=$3; shift 3
    if [ -n "$mpirun" ]; then timeout "$t" "$mpirun" -n 1 "$apps/$app" "$@" > "$log" 2>&1
    else timeout "$t" "$apps/$app" "$@" > "$log" 2>&1; fi
}
small="--config $src/tests/configs/train-small.yaml dataset.path=$build/share/data/tiny-corpus.bin
 step_scheduler.max_steps=10 step_scheduler.local_batch_size=1 checkpoint.enabled=false
 logging.log_every_steps=1"
# the dry run: 2 sequences a step, not 8 (the emulation is slow)
[ "$emulate" = 1 ] && small="$small step_scheduler.global_batch_size=2"
moe="model.num_experts=4 model.num_experts_per_tok=2 model.moe_intermediate_size=32
 model.num_shared_experts=1 model.router_aux_loss_coef=0.01 distributed.activation_checkpointing=true"
bf16=distributed.mp_policy.param_dtype=bfloat16
# head dim 64: the tensor-core attention serves it (train-small's is 16: fp32 kernels)
hd64="model.hidden_size=256 model.num_attention_heads=4 model.num_key_value_heads=2
 model.intermediate_size=512"
for case in "dense|meshtrain-dense|" "moe|meshtrain-moe|$moe" "dense-bf16|meshtrain-dense|$bf16" \
    "moe-bf16|meshtrain-moe|$moe $bf16" "dense-bf16-hd64|meshtrain-dense|$hd64 $bf16"; do
    name=${case%%|*}; rest=${case#*|}; app=${rest%%|*}; extra=${rest#*|}
    case $name in *bf16*) tol=2e-2 ;; *) tol=2e-3 ;; esac
    for dev in cpu cuda; do
        # shellcheck disable=SC2086
        run1 90 "$app" "$logs/parity-$name-$dev.log" $small $extra distributed.device=$dev \
            logging.metrics_file="$logs/parity-$name-$dev.jsonl"
        echo "exit $?" >> "$logs/parity-$name-$dev.log"
    done
    if out=$(loss_diff "$logs/parity-$name-cpu.jsonl" "$logs/parity-$name-cuda.jsonl" "$tol"); then
        row "$name 1-rank parity vs CPU" "ok" "$out"
    else
        row "$name 1-rank parity vs CPU" "FAIL" "${out:-no metrics}; see $logs/parity-$name-*.log"
        show_fail "$logs/parity-$name-cuda.log"
        fail=1
    fi
done

# hd64_vs_cpu LABEL NAME NEED VAR=VALUE...: the dense bf16 head-dim-64
# run of the parity rows on the GPU again with the variables set, against
# the CPU's (bf16 tolerance); NEED, when not empty, must be in its log
hd64_vs_cpu() {
    label=$1 name=$2 need=$3
    shift 3
    log=$logs/$name.log
    # (export VAR=VALUE sets it; SC2163 does not know that)
    # shellcheck disable=SC2086,SC2163
    (export "$@"; run1 90 meshtrain-dense "$log" $small $hd64 $bf16 distributed.device=cuda \
        logging.metrics_file="$logs/$name.jsonl")
    echo "exit $?" >> "$log"
    if [ -n "$need" ] && ! grep -q "$need" "$log"; then
        row "$label" "FAIL" "not on the expected path ($need): see $log"
        show_fail "$log"
        fail=1
        return 1
    elif out=$(loss_diff "$logs/parity-dense-bf16-hd64-cpu.jsonl" "$logs/$name.jsonl" 2e-2); then
        row "$label" "ok" "$out"
    else
        row "$label" "FAIL" "${out:-no metrics}; see $log"
        show_fail "$log"
        fail=1
        return 1
    fi
}
# bf16 storage (the default on cuda, doc/mixed-precision.md): its GEMMs
# are cuBLASLt's bf16 ones, so bf16 tolerance, not bits; checked before
# the 1B run on it times it
mma_ok=1 wmma_ok=1
hd64_vs_cpu "dense-bf16-hd64 bf16 storage vs CPU" storage-dense-bf16-hd64 \
    "device: cuda_bf16_storage backend" MESHTRAIN_BF16_STORAGE=1 || mma_ok=0
# the WMMA attention kernels (the mma.sync ones are the default, in every
# row above): if the default's rows fail and this one passes, the
# mma.sync kernels are wrong on the hardware, and
# MESHTRAIN_ATTENTION_KERNEL=wmma is the workaround, which the
# benchmarks below then take, so that their figures are of kernels that
# compute the right thing
hd64_vs_cpu "dense-bf16-hd64 WMMA attention vs CPU" wmma-dense-bf16-hd64 "" \
    MESHTRAIN_ATTENTION_KERNEL=wmma || wmma_ok=0
if [ "$mma_ok" = 0 ] && [ "$wmma_ok" = 1 ]; then
    export MESHTRAIN_ATTENTION_KERNEL=wmma
    row "attention for the 1B rows" "wmma" "the mma.sync kernels failed parity above, WMMA's passed"
fi

# throughput: Llama 3.2 1B as shipped (share/configs/llama3.2-1b-fsdp2.yaml:
# 1.24B parameters, vocabulary 128256, tied) at sequence 2048, and a
# rank's work per step as in that config: 8 micro-steps of 16384 tokens
# (there 4 x 4096, here 8 x 2048), 131072 tokens a step; 5 steps, the
# first 2 left out of the figures.  The config is bf16, so fp32 overrides
# it.  (Until 0.1's GPU script: a byte vocabulary and one micro-step of
# 4 x 2048, which left out the LM head's GEMMs and paid the optimizer
# every 8192 tokens: doc/gpu.md, "The 1B benchmark".)
llama="--config $src/share/configs/llama3.2-1b-fsdp2.yaml dataset.path=$build/share/data/tiny-corpus.bin
 dataset.format=auto dataset.seq_length=2048 step_scheduler.max_steps=5 checkpoint.enabled=false
 logging.log_every_steps=1"
# the batches: 8 micro-steps (the goal's figure), or one micro-step (what
# the optimizer's pass costs when it is not shared)
big="step_scheduler.global_batch_size=64 step_scheduler.local_batch_size=8"
one="step_scheduler.global_batch_size=8 step_scheduler.local_batch_size=8"
# the dry run: a toy of the same config, last on the command line so that
# it wins (only the plumbing is checked)
emu=
[ "$emulate" = 1 ] && emu="model.hidden_size=128 model.intermediate_size=256 model.vocab_size=512
 model.num_hidden_layers=2 model.num_attention_heads=2 model.num_key_value_heads=1
 dataset.seq_length=128 step_scheduler.global_batch_size=2 step_scheduler.local_batch_size=1
 step_scheduler.max_steps=4"
# llama_run PREC big|one: the 1B run.  PREC: bf16-storage keeps
# activations and weights as bf16 bits (the default on cuda, the goal's
# path); bf16 is bf16 compute on float32 storage; bf16-passes that with
# every rounding in a pass (MESHTRAIN_BF16_PASSES): what the fused
# roundings save; fp32 is float32 throughout
llama_run() {
    prec=$1 batch=$big label="Llama-3.2-1B s2048, $1" passes=0 storage=0
    [ "$2" = one ] && batch=$one label="$label, 1 micro-step"
    extra=$bf16
    case $prec in
    fp32) extra=distributed.mp_policy.param_dtype=float32 ;;
    bf16-passes) passes=1 ;;
    bf16-storage) storage=1 ;;
    esac
    name=llama1b-$prec-$2
    # shellcheck disable=SC2086
    if MESHTRAIN_BF16_PASSES=$passes MESHTRAIN_BF16_STORAGE=$storage MT_PEAK_TFLOPS=$peak \
            run1 150 meshtrain-dense "$logs/$name.log" $llama $batch $extra \
            distributed.device=cuda logging.metrics_file="$logs/$name.jsonl" $emu &&
       out=$(python3 - "$logs/$name.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][2:]
assert r, "fewer than 3 steps in the metrics"
tps = sum(x["tokens_per_s"] for x in r) / len(r)
mfu = sum(x["mfu"] for x in r) / len(r)
dt = sum(x["step_time_s"] for x in r) / len(r)
print(f"{tps:.0f} tokens/s, {dt:.3f} s a step, MFU {100 * mfu:.1f}% (goal: 50% in bf16)")
PY
       ); then
        row "$label" "ok" "$out"
    else
        row "$label" "FAIL" "${out:-} see $logs/$name.log"
        show_fail "$logs/$name.log"
        fail=1
    fi
}
# the goal's row first: bf16 storage, 8 micro-steps a step
llama_run bf16-storage big
llama_run bf16-storage one

# where that step's time goes: the goal's run for 2 steps with every
# backend entry timed alone (MESHTRAIN_PROFILE=1, kernels_profile.c; the
# first step left out, so the second's 8 micro-steps and its optimizer
# step): the table is in the log, its top four entries in the row
# shellcheck disable=SC2086
if MESHTRAIN_PROFILE=1 MESHTRAIN_BF16_STORAGE=1 MT_PEAK_TFLOPS=$peak \
        run1 120 meshtrain-dense "$logs/llama1b-profile.log" \
        $llama $big $bf16 distributed.device=cuda step_scheduler.max_steps=2 \
        logging.metrics_file="$logs/llama1b-profile.jsonl" $emu &&
   grep -q '^kernel profile' "$logs/llama1b-profile.log"; then
    sed -n '/^kernel profile/,/^meshtrain-dense: done/p' "$logs/llama1b-profile.log"
    top=$(awk '/^kernel profile/ { on = 1 } on && NF == 5 && $4 ~ /%$/ { printf "%s %s; ", $1, $4; if (++n == 4) exit }' \
        "$logs/llama1b-profile.log")
    row "Llama-3.2-1B bf16-storage profile" "ok" "$top"
else
    row "Llama-3.2-1B bf16-storage profile" "FAIL" "see $logs/llama1b-profile.log"
    show_fail "$logs/llama1b-profile.log"
    fail=1
fi

# ---------------------------------------------------------------- 4. benchmark
# bench LABEL PROGRAM: build bench/PROGRAM, run it (exit 0 ok, 77 no device),
# the row's detail its RESULT line
bench() {
    label=$1 prog=$2 log=$logs/$2.log
    if [ "$emulate" = 1 ]; then
        row "$label" "SKIP" "dry run: no benchmark on the emulation"
        return
    fi
    if ! (cd "$build" && make "bench/$prog" > "$logs/$prog-build.log" 2>&1); then
        row "$label" "FAIL" "does not build: $logs/$prog-build.log"
        fail=1
        return
    fi
    timeout "$(limit 90)" "$build/bench/$prog" --peak "$peak" > "$log" 2>&1
    rc=$?
    cat "$log"
    case $rc in
    0) row "$label" "ok" "$(sed -n 's/^RESULT //p' "$log")" ;;
    77) row "$label" "SKIP" "no CUDA device" ;;
    *) row "$label" "FAIL" "exit $rc, see $log"; fail=1 ;;
    esac
}
bench "GEMM bench (Llama-1B shapes)" bench_cuda_gemm
# the same 1B run on float32 storage holding bf16 values: what bf16
# storage wins, next to the GEMM bench's figures for the GEMMs alone
if [ "$(left)" -gt 60 ]; then llama_run bf16 big; else row "Llama-3.2-1B s2048, bf16" "SKIP" "no time left"; fi

# ---------------------------------------------------------------- 3b. ranks sharing the GPU
# (after the GEMM bench: if time runs short, the figures come first)
# The multi-rank code paths on one GPU: two ranks share it, so collectives
# auto takes the MPI-staged fallback (host copies of device memory; the
# log says so), and each mesh must train what step 3's 1-rank CPU run
# trained: ddp, fsdp2, tp 2 with sequence parallelism, pp 2 in bf16 (bf16
# pipeline messages) and MoE with ep 2.
if [ -z "$mpirun" ]; then
    row "2 ranks sharing the GPU" "SKIP" "no MPI launcher that starts here"
else
    for case in "ddp|meshtrain-dense|dense|distributed.strategy=ddp" \
        "fsdp2|meshtrain-dense|dense|distributed.strategy=fsdp2" \
        "tp2-sp|meshtrain-dense|dense|distributed.tp_size=2 distributed.sequence_parallel=true" \
        "pp2-bf16|meshtrain-dense|dense-bf16|distributed.pp_size=2 distributed.pipeline.pp_microbatch_size=1 $bf16" \
        "moe-ep2|meshtrain-moe|moe|$moe distributed.ep_size=2"; do
        name=${case%%|*}; rest=${case#*|}; app=${rest%%|*}; rest=${rest#*|}
        ref=${rest%%|*}; extra=${rest#*|}
        case $ref in *bf16*) tol=2e-2 ;; *) tol=2e-3 ;; esac
        log=$logs/shared-$name.log
        # shellcheck disable=SC2086
        timeout "$(limit 60)" "$mpirun" -n 2 "$apps/$app" $small $extra \
            distributed.device=cuda logging.metrics_file="$logs/shared-$name.jsonl" > "$log" 2>&1
        echo "exit $?" >> "$log"
        if ! grep -q "collectives MPI on host copies" "$log"; then
            row "$name, 2 ranks share the GPU" "FAIL" "not the staged path: see $log"
            show_fail "$log"; fail=1
        elif out=$(loss_diff "$logs/parity-$ref-cpu.jsonl" "$logs/shared-$name.jsonl" "$tol"); then
            row "$name, 2 ranks share the GPU" "ok" "$out"
        else
            row "$name, 2 ranks share the GPU" "FAIL" "${out:-no metrics}; see $log"
            show_fail "$log"; fail=1
        fi
    done
fi

# attention: fp32 (CUDA cores) vs bf16 tensor cores at the 1B shape; exit 1
# when the two tables' outputs differ beyond the bf16 bound
bench "attention bench (1B shape, B=4)" bench_cuda_attention
# the bf16 table rounds in its kernels' stores and loads; with
# MESHTRAIN_BF16_PASSES=1 the model rounds in passes instead and the
# kernels' roundings meet bf16 values: the same bits, loss and gradient
# norm, at every step (doc/mixed-precision.md).  After the benchmarks: the
# figures come first if time runs short
for name in dense-bf16-hd64 moe-bf16; do
    case $name in moe*) app=meshtrain-moe extra="$moe $bf16" ;; *) app=meshtrain-dense extra="$hd64 $bf16" ;; esac
    log=$logs/passes-$name.log
    # shellcheck disable=SC2086
    MESHTRAIN_BF16_PASSES=1 run1 90 "$app" "$log" $small $extra distributed.device=cuda \
        logging.metrics_file="$logs/passes-$name.jsonl"
    echo "exit $?" >> "$log"
    if ! grep -q "rounding in passes" "$log"; then
        row "$name fused = passes (bits)" "FAIL" "MESHTRAIN_BF16_PASSES did not take: see $log"
        show_fail "$log"
        fail=1
    elif out=$(python3 - "$logs/parity-$name-cuda.jsonl" "$logs/passes-$name.jsonl" <<'PY'
import json, sys
a, b = ([(j["loss"], j["grad_norm"]) for j in map(json.loads, open(f))] for f in sys.argv[1:3])
assert len(a) == len(b) == 10, (len(a), len(b))
bad = [i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y]
print(f"{len(a)} steps bit for bit" if not bad else f"steps {bad} differ: {a[bad[0] - 1]} vs {b[bad[0] - 1]}")
assert not bad
PY
    ); then
        row "$name fused = passes (bits)" "ok" "$out"
    else
        row "$name fused = passes (bits)" "FAIL" "${out:-no metrics}; see $log"
        show_fail "$log"
        fail=1
    fi
done

# the bf16 1B run with every rounding in a pass: what the roundings fused
# into the kernels' stores and loads save, measured
if [ "$(left)" -gt 60 ]; then llama_run bf16-passes big; else row "Llama-3.2-1B s2048, bf16-passes" "SKIP" "no time left"; fi
# fp32 at scale last, one micro-step (the least needed if time runs short)
if [ "$(left)" -gt 30 ]; then llama_run fp32 one; else row "Llama-3.2-1B s2048, fp32" "SKIP" "no time left"; fi

# ---------------------------------------------------------------- 5. table
finish "$fail"
