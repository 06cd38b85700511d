#!/bin/sh
# build.sh SRCDIR OUTDIR NCCL_OBJDIR: the CUDA backend's .cu files compiled
# for the host against the emulation's headers (tests/emu/cuda; doc/gpu.md,
# "Host emulation of the CUDA kernels"), and linked with the NCCL
# emulation's objects (the library's C files and emu_runtime.c, built by
# tests/emu/nccl/build.sh; its emu_backend.c is what this replaces) into
# OUTDIR/bin: the CUDA kernel tests (test_cuda_kernels, test_cuda_bf16)
# and the apps.  CC, CPPFLAGS, CFLAGS and LIBS come from make (`make
# emulate-cuda`); the .cu files go through rewrite.pl (the <<<>>> launches)
# and CC -x c++.
set -e
src=$1 out=$2 nobj=$3
emu="$src/tests/emu/cuda"
mkdir -p "$out/cu" "$out/obj" "$out/bin"
flags="-I$emu -I$src/tests/emu/nccl -I$src/tests/harness -I$src/tests/backend/cuda -DMT_HAVE_CUDA=1 -DMT_HAVE_NCCL=1 $CPPFLAGS"
cxx="-x c++ -std=c++17 -O2 -g -fno-strict-aliasing -fsanitize=alignment -fno-sanitize-recover=alignment -Wno-error"
jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
# the flags of the last build: when they change, everything is stale
stamp="$out/obj/flags"
printf '%s\n' "$CC $flags $cxx $CFLAGS" > "$stamp.new"
cmp -s "$stamp.new" "$stamp" || { mv "$stamp.new" "$stamp"; touch "$stamp"; }
rm -f "$stamp.new"
newest=$(ls -t "$src"/src/*/*.h "$src"/src/*/*/*.h "$src"/src/backend/cuda/*.cuh "$src"/src/backend/*.def \
    "$emu"/*.h "$emu"/cub/device/*.cuh "$src"/tests/emu/nccl/*.h "$src"/tests/*/*.h \
    "$src"/tests/backend/cuda/*.h config.h "$stamp" \
    "$emu"/build.sh "$emu"/rewrite.pl 2>/dev/null | head -n 1)
list=
objs=
# add NAME SRC KIND: obj/NAME.o from SRC (KIND cu, cc or c), compiled when
# SRC, a header, the flags or this script's tools are newer than it
add() {
    o="$out/obj/$1.o"
    objs="$objs $o"
    if [ ! -f "$o" ] || [ "$2" -nt "$o" ] || [ "$newest" -nt "$o" ]; then
        list="$list $3:$2:$o"
    fi
}
for f in "$src"/src/backend/cuda/cuda_*.cu; do add "$(basename "$f" .cu)" "$f" cu; done
add emu_kernels "$emu/emu_kernels.cc" cc
add emu_blas "$emu/emu_blas.cc" cc
for t in test_cuda_kernels test_cuda_attention test_cuda_kernels_moe test_cuda_bf16 \
    test_cuda_storage; do
    add "$t" "$src/tests/backend/cuda/$t.c" c
done
printf '%s\n' $list | sed '/^$/d' | xargs -P "$jobs" -I{} sh -c '
    kind=${1%%:*} rest=${1#*:}; f=${rest%%:*} o=${rest#*:}
    case $kind in
    cu) c='"$out"'/cu/$(basename "$f" .cu).cc
        perl '"$emu"'/rewrite.pl "$f" > "$c" && $CC '"$cxx $flags"' -c "$c" -o "$o" ;;
    cc) $CC '"$cxx $flags"' -c "$f" -o "$o" ;;
    c) $CC '"$flags"' $CFLAGS -Wno-error -c "$f" -o "$o" ;;
    esac' _ {}
lib=$(ls "$nobj"/*.o | grep -v emu_backend)
cuobjs=$(printf '%s\n' $objs | grep -v '/test_cuda')
link() { # link NAME OBJ...
    name=$1; shift
    $CC $CFLAGS -fsanitize=alignment -o "$out/bin/$name" "$@" $cuobjs $lib $LIBS -lstdc++
}
# make's target, test_cuda_kernels, is linked last: a failure before it
# leaves no fresh target behind
rm -f "$out/bin/test_cuda_kernels"
link test_cuda_bf16 "$out/obj/test_cuda_bf16.o" "$out/obj/test_cuda_storage.o"
for app in "$src"/apps/meshtrain-*.c; do
    name=$(basename "$app" .c)
    $CC $flags $CFLAGS -Wno-error -c "$app" -o "$out/obj/app-$name.o"
    link "$name" "$out/obj/app-$name.o"
done
link test_cuda_kernels "$out/obj/test_cuda_kernels.o" "$out/obj/test_cuda_attention.o" \
    "$out/obj/test_cuda_kernels_moe.o"
echo "emulate-cuda: built the CUDA kernel tests and the apps in $out/bin"
