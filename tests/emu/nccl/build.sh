#!/bin/sh
# build.sh SRCDIR OUTDIR SOURCE...: libmeshtrain's C sources (and the
# apps) compiled against the host emulation of the CUDA runtime and NCCL
# (tests/emu/nccl), into OUTDIR/bin/meshtrain-*.  CC,
# CPPFLAGS, CFLAGS and LIBS come from make (`make emulate-nccl`): the
# library's own flags, with the emulation's headers first on the include
# path and MT_HAVE_CUDA, MT_HAVE_NCCL defined, whatever configure found.
# Every app is built, so the parity tests can run on it whole
# (MESHTRAIN_TEST_BINDIR, doc/testing.md).
set -e
src=$1 out=$2
shift 2
emu="$src/tests/emu/nccl"
mkdir -p "$out/obj" "$out/bin"
flags="-I$emu -DMT_HAVE_CUDA=1 -DMT_HAVE_NCCL=1 $CPPFLAGS $CFLAGS -Wno-error"
jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
objs=
list=
# the newest header: an object older than it is compiled again
newest=$(ls -t "$src"/src/*/*.h "$src"/src/*/*/*.h "$src"/src/backend/*.def "$emu"/*.h config.h 2>/dev/null | head -n 1)
for f in $(printf '%s\n' "$@" | sort -u) tests/emu/nccl/emu_runtime.c tests/emu/nccl/emu_backend.c; do
    case $f in *.c) ;; *) continue ;; esac
    o="$out/obj/$(echo "$f" | tr / _ | sed 's/\.c$/.o/')"
    objs="$objs $o"
    if [ ! -f "$o" ] || [ "$src/$f" -nt "$o" ] || [ "$newest" -nt "$o" ]; then
        list="$list $f:$o"
    fi
done
# compile what changed, $jobs at a time
printf '%s\n' $list | sed '/^$/d' | xargs -P "$jobs" -I{} sh -c '
    f=${1%%:*} o=${1#*:}
    $CC '"$flags"' -c "'"$src"'/$f" -o "$o"' _ {}
for app in "$src"/apps/meshtrain-*.c; do
    name=$(basename "$app" .c)
    $CC $flags -o "$out/bin/$name" "$app" $objs $LIBS
done
echo "emulate-nccl: built the apps in $out/bin"
