#!/bin/sh
# modulefiles.sh: `make install prefix=DIR` into a scratch prefix installs
# the Lmod and Tcl module files with DIR substituted; loading each one
# (with Lmod, or Environment Modules, whichever is installed) puts the
# installed meshtrain-plan on PATH, its man pages on MANPATH, meshtrain.pc
# on PKG_CONFIG_PATH (found there, naming the install prefix) and the MESHTRAIN_* variables on directories that
# exist; unloading takes them away.  Without a module system only the
# files' contents are checked.
. "${abs_top_srcdir:-$(dirname "$0")/../..}/tests/harness/lib.sh"
prefix="$workdir/prefix"
version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"/\1/p' "$abs_top_builddir/config.h")
[ -n "$version" ] || { echo "no PACKAGE_VERSION in $abs_top_builddir/config.h"; exit 99; }
# A make of our own: not the parent's jobserver or its TESTS= override.
expect_rc 0 env -u MAKEFLAGS -u MFLAGS ${MAKE:-make} -s -C "$abs_top_builddir" install prefix="$prefix"
[ "$failures" -eq 0 ] || finish
mods="$prefix/share/modulefiles"
lua="$mods/meshtrain/$version.lua"
tcl="$mods/meshtrain/$version"
for f in "$lua" "$tcl"; do
    checks=$((checks + 1))
    [ -r "$f" ] || { fail "not installed: $f"; continue; }
    text=$(cat "$f")
    checks=$((checks + 1))
    case "$text" in *@*@*) fail "$f keeps a placeholder: $(grep -n '@[a-z]*@' "$f")" ;; esac
    for want in "$prefix/bin" "$prefix/share/man" "$prefix/lib/pkgconfig" \
                "$prefix/share/meshtrain/configs" "$prefix/share/meshtrain/jobscripts" \
                MESHTRAIN_ROOT MESHTRAIN_BINDIR MESHTRAIN_CONFIGS MESHTRAIN_JOBSCRIPTS; do
        expect_in "$text" "$want" "$(basename "$f")"
    done
done
expect_in "$(head -1 "$tcl")" "#%Module" "Tcl modulefile magic"

# The module system, if any: Lmod reads both files (.lua preferred, so the
# Tcl one is also tried alone); Environment Modules reads the Tcl one.
init=
for i in /usr/share/lmod/lmod/init/bash "${LMOD_PKG:-/nonexistent}/init/bash" \
         /usr/share/modules/init/bash /etc/profile.d/modules.sh; do
    [ -r "$i" ] && { init=$i; break; }
done
if [ -z "$init" ]; then
    echo "no Lmod or Environment Modules here: checked the files' contents only"
    finish
fi
mkdir -p "$workdir/tclonly/meshtrain" && cp "$tcl" "$workdir/tclonly/meshtrain/"
for dir in "$mods" "$workdir/tclonly"; do
    expect_rc 0 env -i HOME="$HOME" PATH=/usr/bin:/bin bash -c '
        . "$1" || exit 3
        module use "$2" && module load meshtrain || exit 4
        echo "plan=$(command -v meshtrain-plan)"
        meshtrain-plan --help | head -1
        echo "man=$(man -w meshtrain-dense 2>/dev/null)"
        echo "pc=$(pkg-config --variable=pcfiledir meshtrain) pcprefix=$(pkg-config --variable=prefix meshtrain)"
        echo "root=$MESHTRAIN_ROOT bindir=$MESHTRAIN_BINDIR"
        test -r "$MESHTRAIN_CONFIGS/tiny.yaml" && echo "configs ok"
        test -r "$MESHTRAIN_JOBSCRIPTS/meshtrain-job.sh" && echo "jobscripts ok"
        module unload meshtrain
        echo "after unload: plan=$(command -v meshtrain-plan) root=${MESHTRAIN_ROOT-unset}"
    ' sh "$init" "$dir"
    what="module load meshtrain from $dir ($(basename "$init"))"
    expect_in "$out" "plan=$prefix/bin/meshtrain-plan" "$what: PATH"
    expect_in "$out" "usage: meshtrain-plan" "$what: the installed meshtrain-plan runs"
    expect_in "$out" "man=$prefix/share/man/man1/meshtrain-dense.1" "$what: MANPATH"
    expect_in "$out" "pc=$prefix/lib/pkgconfig pcprefix=$prefix" "$what: PKG_CONFIG_PATH, meshtrain.pc names the install prefix"
    expect_in "$out" "root=$prefix bindir=$prefix/bin" "$what: MESHTRAIN_ROOT, MESHTRAIN_BINDIR"
    expect_in "$out" "configs ok" "$what: MESHTRAIN_CONFIGS"
    expect_in "$out" "jobscripts ok" "$what: MESHTRAIN_JOBSCRIPTS"
    expect_in "$out" "after unload: plan= root=unset" "$what: unload"
done
finish
