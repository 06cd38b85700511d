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
 * the ring computes in pieces; sliding windows narrower than a chunk
 * (where a chunk sees only itself and the chunk before it, the rest
 * skipped and counted), of one chunk over documents, wider than a chunk,
 * and in pieces.  With 4 ranks the world is
 * also split into two CP groups of 2, so the ring runs on a communicator
 * other than the world's.  On 1 rank no message moves: the block kernels
 * and their online-softmax merge alone against the dense kernels.
 * The small cases also run with K/V as bf16 bits (mt_ring_attention_bf16)
 * on K and V rounded to bf16, on the CPU backend (and, in the first case,
 * on the guarded one: host staging): out, lse, dq, dk and dv bit for bit the float32 ring's on the
 * same inputs, with 8 x kv_numel x (P - 1) fewer bytes sent (the K/V
 * shifts of both passes at half the bytes).
 * Exit 0 pass, 1 fail (agreed over all ranks). */
#include <config.h>

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The ring's outputs on one rank's slices, float32 K/V shifts or bf16. */
typedef struct {
    float *out, *lse, *dq, *dk, *dv;
    int64_t bytes;
} ring_out_t;

static void ring_run(MPI_Comm comm, const mt_backend_t *be, bool bf16, int64_t B, int64_t Tl,
                     int64_t nh, int64_t nkv, int64_t hd, const float *q, const float *k,
                     const float *v, const float *dout, const int32_t *ds, ring_out_t *o)
{
    const int64_t nq = B * Tl * nh * hd, nk = B * Tl * nkv * hd;
    o->out = calloc((size_t)nq, sizeof(float)), o->dq = calloc((size_t)nq, sizeof(float));
    o->lse = calloc((size_t)(B * nh * Tl), sizeof(float));
    o->dk = calloc((size_t)nk, sizeof(float)), o->dv = calloc((size_t)nk, sizeof(float));
    mt_ring_attention_t ra;
    CHECK(mt_ring_attention_init(&ra, comm, be, B, Tl, nkv, hd) == MT_OK, "init");
    if (bf16)
        CHECK(mt_ring_attention_bf16(&ra, nh) == MT_OK, "bf16: %s", mt_error_message());
    CHECK(mt_ring_attention_forward(&ra, o->out, o->lse, q, k, v, ds, nh) == MT_OK, "forward");
    CHECK(mt_ring_attention_backward(&ra, o->dq, o->dk, o->dv, dout, o->out, o->lse, q, k, v, ds,
                                     nh) == MT_OK, "backward");
    o->bytes = ra.bytes_sent;
    mt_ring_attention_free(&ra);
}

static void ring_out_free(ring_out_t *o)
{
    free(o->out), free(o->lse), free(o->dq), free(o->dk), free(o->dv);
}

/* bf16 K/V shifts against float32 ones on the same bf16-valued K and V */
static void bf16_check(MPI_Comm comm, const char *name, const mt_backend_t *be, int64_t B,
                       int64_t Tl, int64_t nh, int64_t nkv, int64_t hd, const float *q,
                       const float *k, const float *v, const float *dout, const int32_t *ds)
{
    const int64_t nq = B * Tl * nh * hd, nk = B * Tl * nkv * hd;
    float *kb = malloc(sizeof(float) * (size_t)nk), *vb = malloc(sizeof(float) * (size_t)nk);
    memcpy(kb, k, sizeof(float) * (size_t)nk), memcpy(vb, v, sizeof(float) * (size_t)nk);
    mt_backend_cpu()->round_bf16(kb, nk), mt_backend_cpu()->round_bf16(vb, nk);
    ring_out_t f, h;
    ring_run(comm, be, false, B, Tl, nh, nkv, hd, q, kb, vb, dout, ds, &f);
    ring_run(comm, be, true, B, Tl, nh, nkv, hd, q, kb, vb, dout, ds, &h);
    int64_t bad = 0;
    for (int64_t i = 0; i < nq; i++)
        bad += (fbits(f.out[i]) != fbits(h.out[i])) + (fbits(f.dq[i]) != fbits(h.dq[i]));
    for (int64_t i = 0; i < nk; i++)
        bad += (fbits(f.dk[i]) != fbits(h.dk[i])) + (fbits(f.dv[i]) != fbits(h.dv[i]));
    for (int64_t i = 0; i < B * nh * Tl; i++)
        bad += fbits(f.lse[i]) != fbits(h.lse[i]);
    int P;
    MPI_Comm_size(comm, &P);
    CHECK(bad == 0, "%s (%s): bf16 K/V shifts change %lld values", name, be->name,
          (long long)bad);
    CHECK(h.bytes == f.bytes - 8 * nk * (P - 1), "%s (%s): %lld bytes with bf16 K/V, %lld "
          "without", name, be->name, (long long)h.bytes, (long long)f.bytes);
    ring_out_free(&f), ring_out_free(&h);
    free(kb), free(vb);
}

/* W > 0: a sliding window over the documents (none: plain causal rows),
 * as the model hands it to the kernels and the ring, each query's first
 * visible key max(doc_start, t - W + 1) on global indices */
static void run_case(MPI_Comm cp_comm, const char *name, int docs, int64_t B, int64_t C,
                     int64_t nh, int64_t nkv, int64_t hd, int64_t W)
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
            if (W > 0 && t - W + 1 > ds[b * T + t])
                ds[b * T + t] = (int32_t)(t - W + 1);
        }
    }
    const bool masked = docs != DOCS_NONE || W > 0;
    const int32_t *dsp = masked ? ds : NULL;
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
        const int32_t *ldsp = masked ? lds : NULL;
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
        if (docs == DOCS_NONE && W >= 2 && W <= C + 1) /* a window of at most a chunk (+1):
                                * each chunk sees itself and the chunk before it only */
            CHECK(tot[0] == 2 * B * (4 * P - 1), "%s cp%d: %lld blocks computed, expected %lld",
                  name, P, (long long)tot[0], (long long)(2 * B * (4 * P - 1)));
        if (docs == DOCS_NONE && W == 0) /* causality alone: (2P)(2P+1)/2 of (2P)^2 pairs per row */
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
        if (C <= 40) /* the small cases (time); the guard is slow: one case */
            bf16_check(cp_comm, name, mt_backend_cpu(), B, Tl, nh, nkv, hd, lq, lk, lv, ldo, ldsp);
        if (strcmp(name, "causal") == 0)
            bf16_check(cp_comm, name, mt_backend_cpu_guarded(), B, Tl, nh, nkv, hd, lq, lk, lv,
                       ldo, ldsp);
    }
    free(q), free(dout), free(k), free(v), free(out), free(lse), free(dq), free(dk), free(dv);
    free(ds), free(lds), free(lq), free(ldo), free(lk), free(lv), free(lout), free(llse);
    free(ldq), free(ldk), free(ldv), free(map);
}

static void run_all(MPI_Comm comm)
{
    run_case(comm, "causal", DOCS_NONE, 2, 24, 4, 2, 16, 0);
    run_case(comm, "causal, 2 key blocks per chunk", DOCS_NONE, 1, 136, 2, 1, 8, 0);
    run_case(comm, "documents across chunks", DOCS_RANDOM, 2, 40, 4, 2, 16, 0);
    run_case(comm, "documents across chunks, long", DOCS_RANDOM, 1, 150, 4, 4, 8, 0);
    run_case(comm, "one document per chunk", DOCS_CHUNKS, 1, 32, 4, 2, 16, 0);
    /* chunks over 256 queries: the ring calls the kernels piece by piece */
    run_case(comm, "documents across chunks, pieces", DOCS_RANDOM, 1, 300, 2, 1, 8, 0);
    run_case(comm, "causal, pieces", DOCS_NONE, 1, 300, 2, 1, 8, 0);
    /* sliding windows: narrower than a chunk (only the chunk before is
     * seen: the rest is skipped), one chunk with documents, wider than a
     * chunk, and in pieces */
    run_case(comm, "window", DOCS_NONE, 2, 24, 4, 2, 16, 10);
    run_case(comm, "window of a chunk, documents", DOCS_RANDOM, 2, 40, 4, 2, 16, 40);
    run_case(comm, "window over chunks", DOCS_NONE, 1, 24, 2, 1, 16, 60);
    run_case(comm, "window, documents, pieces", DOCS_RANDOM, 1, 300, 2, 1, 8, 100);
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
