/* bench_cp.c: context-parallel attention figures (make bench-cp; never part
 * of make check).
 *
 * 1. Balance (rank 0, no MPI traffic): per-rank attention FLOPs of one row
 *    of T tokens for cp = 2, 4, 8 under load-balanced sharding (chunks r
 *    and 2cp-1-r) and naive contiguous sharding (tokens [rT/cp, (r+1)T/cp)),
 *    for plain causal rows and for packed rows (documents of random
 *    lengths, mean T/16).  FLOPs = 4 * hd * nh per visible (query, key)
 *    pair, forward (the backward's 8 per pair scales the same).  Printed:
 *    max/min over ranks.
 * 2. Overlap (every rank, cp = world size): ring attention forward +
 *    backward on random data, first moving the K/V and dK/dV blocks only
 *    (no kernels: the transfer time), then for real; the fraction of the
 *    transfer hidden behind compute is 1 - (time blocked in waits with
 *    compute) / (time blocked without it); that time includes waiting for
 *    a slower neighbour (rank skew), so the bench also counts the transfers
 *    that were complete when the compute before them finished (the last
 *    dK/dV hop of each backward has no compute after it and never is).
 *    Also each rank's computed pairs, counted by the ring, and its kernel
 *    time.
 * Arguments: [T] [nh] [hd] [reps] (defaults 4096 8 64 3). */
#include <config.h>

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_backend.h"
#include "mt_comm.h"
#include "mt_ring_attention.h"

static uint64_t lcg = 42;
static double urand(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg >> 11) / 9007199254740992.0;
}

static void balance(int64_t T, int64_t nh, int64_t hd)
{
    int32_t *docs = malloc(sizeof(int32_t) * (size_t)T);
    int64_t start = 0, next = 0;
    for (int64_t t = 0; t < T; t++) {
        if (t == next) {
            start = t;
            next = t + 1 + (int64_t)(urand() * (double)(T / 8)); /* mean ~T/16 */
        }
        docs[t] = (int32_t)start;
    }
    printf("per-rank attention forward GFLOP, one row of T = %lld (nh %lld, hd %lld)\n",
           (long long)T, (long long)nh, (long long)hd);
    for (int pass = 0; pass < 2; pass++)
        for (int cp = 2; cp <= 8; cp *= 2) {
            if (T % (2 * cp))
                continue;
            for (int contiguous = 0; contiguous < 2; contiguous++) {
                double mx = 0, mn = INFINITY;
                printf("  %-6s cp %d %-10s:", pass ? "packed" : "causal", cp,
                       contiguous ? "contiguous" : "balanced");
                for (int r = 0; r < cp; r++) {
                    double f = 4.0 * (double)(hd * nh) *
                               mt_cp_rank_pairs(pass ? docs : NULL, T, r, cp, contiguous) / 1e9;
                    mx = fmax(mx, f), mn = fmin(mn, f);
                    printf(" %.3f", f);
                }
                printf("  | max/min %.3f\n", mx / mn);
            }
        }
    free(docs);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, P;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    int64_t T = argc > 1 ? atoll(argv[1]) : 4096, nh = argc > 2 ? atoll(argv[2]) : 8;
    int64_t hd = argc > 3 ? atoll(argv[3]) : 64;
    int reps = argc > 4 ? atoi(argv[4]) : 3;
    if (rank == 0)
        balance(T, nh, hd);
    if (T % (2 * P)) {
        if (rank == 0)
            fprintf(stderr, "bench_cp: T %lld is not divisible by 2 x %d ranks\n", (long long)T, P);
        MPI_Finalize();
        return 1;
    }

    MPI_Comm node; /* the trainer's wait mode and thread count for ranks sharing a node */
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    mt_comm_set_wait_mode(node);
    int threads = mt_comm_set_threads(node);
    MPI_Comm_free(&node);
    if (rank == 0)
        printf("%d ranks, %d threads each\n", P, threads);
    const mt_backend_t *be = mt_backend_cpu();
    const int64_t Tl = T / P, nkv = nh, qn = Tl * nh * hd, kn = Tl * nkv * hd;
    float *q = malloc(sizeof(float) * (size_t)qn), *k = malloc(sizeof(float) * (size_t)kn);
    float *v = malloc(sizeof(float) * (size_t)kn), *dout = malloc(sizeof(float) * (size_t)qn);
    float *out = malloc(sizeof(float) * (size_t)qn), *lse = malloc(sizeof(float) * (size_t)(nh * Tl));
    float *dq = malloc(sizeof(float) * (size_t)qn), *dk = malloc(sizeof(float) * (size_t)kn);
    float *dv = malloc(sizeof(float) * (size_t)kn);
    lcg = 1000 + (uint64_t)rank;
    for (int64_t i = 0; i < qn; i++)
        q[i] = (float)urand() - 0.5f, dout[i] = (float)urand() - 0.5f;
    for (int64_t i = 0; i < kn; i++)
        k[i] = (float)urand() - 0.5f, v[i] = (float)urand() - 0.5f;
    mt_ring_attention_t ra;
    if (mt_ring_attention_init(&ra, MPI_COMM_WORLD, be, 1, Tl, nkv, hd) != MT_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);

    double res[2][3]; /* [comm only, with compute][wait, compute, wall] */
    for (int mode = 0; mode < 2; mode++) {
        ra.no_compute = mode == 0;
        for (int it = 0; it <= reps; it++) { /* iteration 0 warms up */
            if (it == 1)
                mt_ring_attention_reset_stats(&ra);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (mt_ring_attention_forward(&ra, out, lse, q, k, v, NULL, nh) != MT_OK ||
                mt_ring_attention_backward(&ra, dq, dk, dv, dout, out, lse, q, k, v, NULL,
                                           nh) != MT_OK)
                MPI_Abort(MPI_COMM_WORLD, 1);
            if (it == 1)
                res[mode][2] = 0;
            if (it >= 1)
                res[mode][2] += MPI_Wtime() - t0;
        }
        res[mode][0] = ra.t_wait / reps, res[mode][1] = ra.t_compute / reps;
        res[mode][2] /= reps;
        if (mode == 1) {
            double mine[3] = {ra.pairs / reps / 2, ra.t_compute / reps, ra.t_wait / reps};
            int64_t w[4] = {ra.waits[0], ra.waits_hidden[0], ra.waits[1], ra.waits_hidden[1]};
            int64_t wt[4];
            MPI_Reduce(w, wt, 4, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
            for (int kind = 0; kind < 2 && rank == 0; kind++)
                printf("%s transfers complete when the compute before them was done: %lld of "
                       "%lld (%.1f%%)\n", kind ? "dK/dV" : "K/V", (long long)wt[2 * kind + 1],
                       (long long)wt[2 * kind],
                       wt[2 * kind] ? 100.0 * (double)wt[2 * kind + 1] / (double)wt[2 * kind]
                                    : 100.0);
            double *all = rank == 0 ? malloc(sizeof(double) * 3 * (size_t)P) : NULL;
            MPI_Gather(mine, 3, MPI_DOUBLE, all, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                printf("ring attention, cp %d, T %lld (%lld per rank), fwd+bwd, mean of %d:\n", P,
                       (long long)T, (long long)Tl, reps);
                double pmx = 0, pmn = INFINITY, cmx = 0, cmn = INFINITY;
                for (int r = 0; r < P; r++) {
                    printf("  rank %d: %.0f visible pairs per head, kernels %.4f s, waits %.4f s\n",
                           r, all[3 * r], all[3 * r + 1], all[3 * r + 2]);
                    pmx = fmax(pmx, all[3 * r]), pmn = fmin(pmn, all[3 * r]);
                    cmx = fmax(cmx, all[3 * r + 1]), cmn = fmin(cmn, all[3 * r + 1]);
                }
                printf("  computed pairs max/min %.3f, kernel time max/min %.3f\n", pmx / pmn,
                       cmx / cmn);
                free(all);
            }
        }
    }
    /* the hidden fraction, averaged over ranks */
    double hid = res[0][0] > 0 ? 1.0 - res[1][0] / res[0][0] : 1.0;
    hid = hid < 0 ? 0 : hid > 1 ? 1 : hid;
    double mine[3] = {hid, res[0][0], res[1][0]}, tot[3];
    MPI_Reduce(mine, tot, 3, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("K/V and dK/dV transfers: %.4f s blocked without compute, %.4f s with it (mean "
               "over ranks; with compute this includes waiting for a slower neighbour): %.1f%% "
               "hidden by time\n", tot[1] / P, tot[2] / P, 100.0 * tot[0] / P);
    mt_ring_attention_free(&ra);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    MPI_Finalize();
    return 0;
}
