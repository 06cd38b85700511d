#!/bin/sh
# install-deps.sh: install the Debian 12 packages meshtrain builds and tests
# with, only those missing.  Uses sudo when not root.  Not installed.
# The second group is for the HPC-ecosystem tests: a private Slurm with
# munge (tests/slurm_*.sh), gnuplot for meshtrain-plot, Lmod for the module
# files (it reads the Tcl one too; it conflicts with environment-modules),
# groff for the man pages.  Their daemons are not started here: the tests
# start their own.
set -e
pkgs="mpich libmpich-dev libhdf5-mpich-dev hdf5-tools libyaml-dev libjansson-dev libssl-dev libopenblas-dev libopenblas-openmp-dev
      libpcre2-dev libutf8proc-dev libzstd-dev
      autoconf automake libtool pkg-config make gcc g++ python3 python3-torch python3-numpy
      slurm-wlm munge gnuplot-nox lmod groff-base"
missing=
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && { echo "install-deps: all packages present"; exit 0; }
sudo=
[ "$(id -u)" -eq 0 ] || sudo=sudo
echo "install-deps: installing$missing"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
