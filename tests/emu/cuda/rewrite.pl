#!/usr/bin/perl
# rewrite.pl: a .cu file as C++ for the host emulation of the CUDA kernels
# (tests/emu/cuda, build.sh): `kernel<<<grid, block, smem, stream>>>(args)`
# becomes `emu_launch("kernel", grid, block, smem, stream).go(kernel, args)`
# and `extern __shared__ T name[]` a pointer to the block's dynamic shared
# memory; a static `__shared__` declaration gets a poisoning call after it.
# Line numbers are kept (a #line names the .cu file).
use strict;
use warnings;
local $/;
my $file = $ARGV[0];
open(my $in, '<', $file) or die "$file: $!";
my $s = <$in>;
close $in;
my $n = 0;
$s =~ s{(\b[A-Za-z_]\w*(?:\s*<[^<>;()]*>)?)(\s*)<<<(.*?)>>>\s*\(}{
    my ($k, $ws, $cfg) = ($1, $2, $3);
    $n++;
    (my $name = $k) =~ s/\s+//g;
    "emu_launch(\"$name\", $cfg).go($k,$ws"
}gse;
$s =~ s{extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([A-Za-z_][\w ]*?)\s+(\w+)\[\]}{$1 *$2 = ($1 *)emu_smem}g;
# `__shared__ T a[N], b;` (statics here, emu_kernel.h): each one filled
# with 0xff bytes by the first thread of every block to reach it, so a
# read before any write shows up as it does in the dynamic buffer
$s =~ s{(?<!extern )__shared__\s+([A-Za-z_][\w ]*?)\s+([^;]+);}{
    my ($t, $decl) = ($1, $2);
    my $poison = join(' ', map { (my $v = $_) =~ s/^\s+|\s+$//g; $v =~ s/\[.*//;
                                 "emu_poison_shared(&$v, sizeof $v);" } split(/,/, $decl));
    "__shared__ $t $decl; $poison"
}ge;
die "$file: a <<< left that the rewrite did not understand\n" if $s =~ /<<</;
print "#line 1 \"$file\"\n$s";
