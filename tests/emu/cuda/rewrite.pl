#!/usr/bin/perl
# rewrite.pl: a .cu file as C++ for the host emulation of the CUDA kernels
# (tests/emu/cuda, build.sh): `kernel<<<grid, block, smem, stream>>>(args)`
# becomes `emu_launch("kernel", grid, block, smem, stream).go(kernel, args)`
# and `extern __shared__ T name[]` a pointer to the block's dynamic shared
# memory.  Line numbers are kept (a #line names the .cu file).
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
die "$file: a <<< left that the rewrite did not understand\n" if $s =~ /<<</;
print "#line 1 \"$file\"\n$s";
