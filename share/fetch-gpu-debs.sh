#!/bin/sh
# fetch-gpu-debs.sh: download (never install) the Debian packages that
# meshtrain needs to build and run on a GPU machine that cannot reach a
# package registry: MPICH, parallel HDF5, libyaml, OpenMP OpenBLAS and
# their library dependencies, as .deb files into one folder.  Run it on a
# Debian 12 machine with network access (no root needed: apt-get download
# writes into the current directory), copy the folder next to the source
# tree as debs/, and tests/gpu/run.sh unpacks them with `dpkg -x` into a
# private prefix (nothing is installed system-wide).  Not installed.
#
#   share/fetch-gpu-debs.sh [DIR]        (default DIR: debs)
#
# Packages the GPU machine's own base system certainly has (libc, libgcc,
# libstdc++, zlib, ...) are left out: mixing a second libc into
# LD_LIBRARY_PATH breaks every program.  The GPU machine should run the
# same Debian release (12) as the one the packages come from; CUDA itself
# is not fetched (the GPU machine has its toolkit and driver).
set -e
dir=${1:-debs}
top="mpich libmpich-dev libhdf5-mpich-dev libyaml-dev libopenblas-openmp-dev pkg-config"
# the base system (Debian "required" and the compiler runtime): never fetched
skip='^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|zlib1g|libcrypt1|libcrypt-dev|debconf|dpkg|perl-base|tar|libselinux1|libpcre2-8-0|libzstd1|liblzma5|libbz2-1\.0|libtinfo6|libgcc-[0-9]+-dev|libgomp1|libstdc\+\+-[0-9]+-dev|gcc|gcc-[0-9]+|cpp|cpp-[0-9]+|binutils.*|libbinutils|libctf.*|libgprofng0|libjansson4|libisl23|libmpc3|libmpfr6|libgmp10|libasan[0-9]+|liblsan[0-9]+|libtsan[0-9]+|libubsan[0-9]+|libitm1|libatomic1|libcc1-0|libhwasan0|libnsl.*|libtirpc.*|libtirpc-common|libgssapi.*|libkrb5.*|libk5crypto3|libkeyutils1|libcom-err2|libssl3|libsystemd0|libudev1|libcap2|libgcrypt20|libgpg-error0|liblz4-1|libmd0|libdb5\.3|libaudit.*|libcap-ng0|libpam.*|sensible-utils|init-system-helpers|adduser|passwd|login|libsemanage.*|libsepol2|mount|util-linux|libblkid1|libmount1|libsmartcols1|libuuid1|coreutils|bash|dash|sed|grep|findutils|diffutils|base-files|base-passwd|debianutils|hostname|mawk|ncurses-base|ncurses-bin|libacl1|libattr1|libxxhash0|libdebconfclient0|lsb-base|sysvinit-utils)$'
# not needed to build or run meshtrain's C code, and large: compilers (the
# GPU machine has its own gcc for nvcc), perl, autotools (build from a
# `make dist` tarball), Fortran and C++ HDF5 bindings, and the -dev
# packages that only the four -dev packages we use drag in (but not
# libhwloc-dev and libucx-dev: mpich.pc links -lhwloc -lucp -lucs, whose
# .so links only they hold).  About 40 MB: under the device tool's 64 MiB
# carry limit.
unneeded='^(g\+\+.*|gfortran.*|libgfortran-[0-9]+-dev|perl|perl-modules-.*|libperl.*|libgdbm.*|autoconf|automake|autotools-dev|m4|hwloc-nox|rpcsvc-proto|libhdf5-mpich-(cpp|fortran|hl-cpp|hl-fortran)-.*|lib(curl4-openssl|jpeg62-turbo|jpeg|ssl|aec|ltdl|numa)-dev|zlib1g-dev)$'
mkdir -p "$dir"
cd "$dir"
command -v apt-get >/dev/null || { echo "fetch-gpu-debs: apt-get not found (Debian/Ubuntu only)" >&2; exit 1; }
[ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v lock)" ] ||
    echo "fetch-gpu-debs: the package lists look empty: run 'apt-get update' first" >&2
# the packages apt would install on an EMPTY system (a status file with
# nothing in it): the dependency closure with alternatives resolved as apt
# resolves them, no recommends; simulation only, nothing is installed
empty=$(mktemp)
deps=$(apt-get -o Dir::State::status="$empty" -o Debug::NoLocking=1 --no-install-recommends \
           -s install $top 2>/dev/null | awk '/^Inst / {print $2}' | sort -u | grep -Ev "$skip" | grep -Ev "$unneeded" || true)
rm -f "$empty"
[ -n "$deps" ] || { echo "fetch-gpu-debs: apt-get resolved no packages" >&2; exit 1; }
n=0
for p in $deps; do
    if apt-get download "$p" >/dev/null 2>&1; then
        n=$((n + 1))
    else
        echo "fetch-gpu-debs: could not download $p (skipped)" >&2
    fi
done
echo "fetch-gpu-debs: $n packages in $(pwd)"
