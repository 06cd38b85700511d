/* sgemm_rate: single-process SGEMM rate (GFLOP/s) of the CBLAS meshtrain
 * links, best of R runs of N^3 (default 2048, 5): the peak the benchmark's
 * MFU is measured against.  Usage: sgemm_rate [N [R]] */
#include <stdio.h>
#include <stdlib.h>

#include "mt_train.h"

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2048, r = argc > 2 ? atol(argv[2]) : 5;
    printf("sgemm n=%ld gflops=%.2f\n", n, mt_measure_sgemm_gflops(n, (int)r));
    return 0;
}
