/* test_ring_attention.c: ring attention (context parallelism) against the
 * dense CPU kernels, on every CP size the rank count allows.
 *
 * Each case builds the same full rows on every rank (q, k, v, dout and,
 * for packed rows, doc_start), runs the dense attention_forward/backward
 * of the CPU backend on the whole rows as the reference, then the ring over
 * the CP group on this rank's two load-balanced chunks, and compares out,
 * lse, dq, dk and dv slice by slice (max error relative to the tensor's
 * largest value, 2e-5 in fp32).  Cases: plain causal rows; documents of
 * random lengths that start and end inside chunks and span chunk
 * boundaries (one longer than a chunk); and documents that are exactly one
 * chunk each, where every off-diagonal block pair is masked and must be
 * skipped (the block counters are checked); chunks of 300 tokens, which
 * the ring computes in pieces.  With 4 ranks the world is
 * also split into two CP groups of 2, so the ring runs on a communicator
 * other than the world's.  On 1 rank no message moves: the block kernels
 * and their online-softmax merge alone against the dense kernels.
 * Exit 0 pass, 1 fail (agreed over all ranks). */
#include <config.h>

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>

#include "mt_backend.h"
#include "mt_ring_attention.h"
#include "mt_test.h"

static uint64_t lcg;

static float frand(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* max |a - b| / max |b| over the local slices */
static double rel_err(const float *loc, const float *full, int64_t n, int64_t width,
                      const int64_t *map)
{
    double err = 0, big = 1e-30;
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < width; d++) {
            double a = loc[i * width + d], b = full[map[i] * width + d];
            err = fmax(err, fabs(a - b));
            big = fmax(big, fabs(b));
        }
    return err / big;
}

enum { DOCS_NONE, DOCS_RANDOM, DOCS_CHUNKS };

static void run_case(MPI_Comm cp_comm, const char *name, int docs, int64_t B, int64_t C,
                     int64_t nh, int64_t nkv, int64_t hd)
{
    const mt_backend_t *be = mt_backend_cpu();
    int r, P;
    MPI_Comm_rank(cp_comm, &r);
    MPI_Comm_size(cp_comm, &P);
    const int64_t T = 2 * P * C, Tl = 2 * C, qs = nh * hd, kvs = nkv * hd;
    const int64_t N = B * T, Nl = B * Tl;
    float *q = malloc(sizeof(float) * (size_t)(N * qs)), *dout = malloc(sizeof(float) * (size_t)(N * qs));
    float *k = malloc(sizeof(float) * (size_t)(N * kvs)), *v = malloc(sizeof(float) * (size_t)(N * kvs));
    float *out = malloc(sizeof(float) * (size_t)(N * qs)), *lse = malloc(sizeof(float) * (size_t)(B * nh * T));
    float *dq = malloc(sizeof(float) * (size_t)(N * qs)), *dk = malloc(sizeof(float) * (size_t)(N * kvs));
    float *dv = malloc(sizeof(float) * (size_t)(N * kvs));
    int32_t *ds = malloc(sizeof(int32_t) * (size_t)N), *lds = malloc(sizeof(int32_t) * (size_t)Nl);
    /* local copies */
    float *lq = malloc(sizeof(float) * (size_t)(Nl * qs)), *ldo = malloc(sizeof(float) * (size_t)(Nl * qs));
    float *lk = malloc(sizeof(float) * (size_t)(Nl * kvs)), *lv = malloc(sizeof(float) * (size_t)(Nl * kvs));
    float *lout = malloc(sizeof(float) * (size_t)(Nl * qs)), *llse = malloc(sizeof(float) * (size_t)(B * nh * Tl));
    float *ldq = malloc(sizeof(float) * (size_t)(Nl * qs)), *ldk = malloc(sizeof(float) * (size_t)(Nl * kvs));
    float *ldv = malloc(sizeof(float) * (size_t)(Nl * kvs));
    int64_t *map = malloc(sizeof(int64_t) * (size_t)Nl);

    lcg = 12345 + (uint64_t)(C * 7 + docs);
    for (int64_t i = 0; i < N * qs; i++)
        q[i] = 2.0f * frand(), dout[i] = frand();
    for (int64_t i = 0; i < N * kvs; i++)
        k[i] = 2.0f * frand(), v[i] = frand();
    for (int64_t b = 0; b < B; b++) {
        int64_t start = 0, next = 0;
        for (int64_t t = 0; t < T; t++) {
            if (docs == DOCS_CHUNKS && t % C == 0)
                start = t;
            if (docs == DOCS_RANDOM && t == next) {
                start = t;
                /* lengths 1..1.5 C, so documents start and end inside chunks */
                next = t + 1 + (int64_t)((frand() + 1.0f) * 0.75f * (float)C);
                if (t == 0)
                    next = t + C + C / 2 + 3; /* the first one longer than a chunk */
            }
            ds[b * T + t] = docs == DOCS_NONE ? 0 : (int32_t)start;
        }
    }
    const int32_t *dsp = docs == DOCS_NONE ? NULL : ds;
    be->attention_forward(out, lse, q, k, v, dsp, B, T, nh, nkv, hd);
    be->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, dsp, B, T, nh, nkv, hd);

    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Tl; i++) {
            int64_t g = b * T + mt_cp_global_index(i, Tl, r, P), l = b * Tl + i;
            map[l] = g;
            memcpy(lq + l * qs, q + g * qs, sizeof(float) * (size_t)qs);
            memcpy(ldo + l * qs, dout + g * qs, sizeof(float) * (size_t)qs);
            memcpy(lk + l * kvs, k + g * kvs, sizeof(float) * (size_t)kvs);
            memcpy(lv + l * kvs, v + g * kvs, sizeof(float) * (size_t)kvs);
            lds[l] = ds[g];
        }
    mt_ring_attention_t ra;
    mt_status_t s = mt_ring_attention_init(&ra, cp_comm, be, B, Tl, nkv, hd);
    CHECK(s == MT_OK, "%s: init failed", name);
    if (s == MT_OK) {
        const int32_t *ldsp = docs == DOCS_NONE ? NULL : lds;
        CHECK(mt_ring_attention_forward(&ra, lout, llse, lq, lk, lv, ldsp, nh) == MT_OK,
              "%s: forward", name);
        CHECK(mt_ring_attention_backward(&ra, ldq, ldk, ldv, ldo, lout, llse, lq, lk, lv, ldsp,
                                         nh) == MT_OK, "%s: backward", name);
        const double tol = 2e-5;
        double e_out = rel_err(lout, out, Nl, qs, map), e_dq = rel_err(ldq, dq, Nl, qs, map);
        double e_dk = rel_err(ldk, dk, Nl, kvs, map), e_dv = rel_err(ldv, dv, Nl, kvs, map);
        double e_lse = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t i = 0; i < Tl; i++) {
                    int64_t g = mt_cp_global_index(i, Tl, r, P);
                    e_lse = fmax(e_lse, fabs(llse[(b * nh + h) * Tl + i] - lse[(b * nh + h) * T + g]) /
                                            fmax(1.0, fabs(lse[(b * nh + h) * T + g])));
                }
        CHECK(e_out <= tol, "%s cp%d rank %d: out relative error %.3e", name, P, r, e_out);
        CHECK(e_lse <= tol, "%s cp%d rank %d: lse relative error %.3e", name, P, r, e_lse);
        CHECK(e_dq <= tol, "%s cp%d rank %d: dq relative error %.3e", name, P, r, e_dq);
        CHECK(e_dk <= tol, "%s cp%d rank %d: dk relative error %.3e", name, P, r, e_dk);
        CHECK(e_dv <= tol, "%s cp%d rank %d: dv relative error %.3e", name, P, r, e_dv);
        /* block accounting over forward + backward: 4 pairs x P shards x B
         * rows per pass on each rank */
        int64_t done = ra.blocks_done, skipped = ra.blocks_skipped, tot[2], loc[2] = {done, skipped};
        MPI_Allreduce(loc, tot, 2, MPI_INT64_T, MPI_SUM, cp_comm);
        CHECK(done + skipped == 2 * 4 * P * B, "%s: %lld + %lld block pairs", name,
              (long long)done, (long long)skipped);
        if (docs == DOCS_NONE) /* causality alone: (2P)(2P+1)/2 of (2P)^2 pairs per row */
            CHECK(tot[0] == 2 * B * P * (2 * P + 1), "%s cp%d: %lld blocks computed, expected %lld",
                  name, P, (long long)tot[0], (long long)(2 * B * P * (2 * P + 1)));
        if (docs == DOCS_CHUNKS) /* one document per chunk: the diagonal pairs only */
            CHECK(tot[0] == 2 * B * 2 * P, "%s cp%d: %lld blocks computed, expected %lld", name, P,
                  (long long)tot[0], (long long)(2 * B * 2 * P));
        int world_rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        if (world_rank == 0)
            printf("%s cp%d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e, blocks %lld computed %lld "
                   "skipped (all ranks, fwd+bwd)\n", name, P, e_out, e_lse, e_dq, e_dk, e_dv,
                   (long long)tot[0], (long long)tot[1]);
        mt_ring_attention_free(&ra);
    }
    free(q), free(dout), free(k), free(v), free(out), free(lse), free(dq), free(dk), free(dv);
    free(ds), free(lds), free(lq), free(ldo), free(lk), free(lv), free(lout), free(llse);
    free(ldq), free(ldk), free(ldv), free(map);
}

static void run_all(MPI_Comm comm)
{
    run_case(comm, "causal", DOCS_NONE, 2, 24, 4, 2, 16);
    run_case(comm, "causal, 2 key blocks per chunk", DOCS_NONE, 1, 136, 2, 1, 8);
    run_case(comm, "documents across chunks", DOCS_RANDOM, 2, 40, 4, 2, 16);
    run_case(comm, "documents across chunks, long", DOCS_RANDOM, 1, 150, 4, 4, 8);
    run_case(comm, "one document per chunk", DOCS_CHUNKS, 1, 32, 4, 2, 16);
    /* chunks over 256 queries: the ring calls the kernels piece by piece */
    run_case(comm, "documents across chunks, pieces", DOCS_RANDOM, 1, 300, 2, 1, 8);
    run_case(comm, "causal, pieces", DOCS_NONE, 1, 300, 2, 1, 8);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    run_all(MPI_COMM_WORLD);
    if (size == 4) { /* two CP groups of 2: the ring must stay on its communicator */
        MPI_Comm half;
        MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &half);
        run_all(half);
        MPI_Comm_free(&half);
    }
    int rc = mt_test_exit_mpi("test_ring_attention", MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
