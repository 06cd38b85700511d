/* ring_attention.c: ring attention over the CP group (mt_ring_attention.h).
 *
 * Schedule on CP rank r of P, step s = 0..P-1: the rank holds the K/V
 * shard of rank src = r - s (mod P), posts the receive of the next shard
 * from r - 1 and the send of the current one to r + 1, computes its two
 * query chunks against the two key chunks of src (skipping pairs nothing
 * in them can see), then waits.  Between blocks it calls MPI_Test so
 * the transfer progresses while the kernels run (MPICH moves large
 * messages only inside MPI calls).
 *
 * Backward walks the same ring.  The dK/dV of shard src collect the
 * blocks of every rank: each rank computes its share into a zeroed
 * accumulator first and only then waits for the partial sum arriving from
 * r - 1, adds it, and sends the sum on to r + 1.  So the gradient
 * transfer of one step overlaps the compute of the next, and after P
 * steps each shard's total lands at its owner.  The sums always run in
 * the same order (owner first, then around the ring), so results are
 * deterministic.
 *
 * The loss of numerical identity with the dense kernel is only the order
 * of the softmax merges and of the dK/dV sums: parity is to rounding
 * (tests/parallel/test_ring_attention.c).
 *
 * Memory: the blocks and accumulators are the backend's, touched only by
 * its kernels and copies.  Off the plain CPU backend (mt_stage_needed) the
 * transfers run on host buffers (mt_stage_isend / irecv / recv_finish:
 * copied out before a send, in after a receive's wait), and the block
 * skipping reads a host copy of doc_start; on the CPU backend MPI and the
 * skipping work on the buffers themselves, as they always did. */
#include <config.h>

#include "mt_ring_attention.h"

#include <limits.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt_comm.h"
#include "mt_stage.h"
#ifdef MT_HAVE_NCCL
#include "mt_cuda.h"
#include "mt_nccl.h"
#define CS ((cudaStream_t)mt_cuda_stream())
#endif

enum { TAG_K = 701, TAG_V, TAG_DK, TAG_DV }; /* a pair: tag, tag + 1 */

/* Queries per kernel call: MPICH moves a large message only while some MPI
 * call runs, so the ring tests its transfers between calls; 256 rows keep
 * the kernels' GEMMs large and the tests frequent (a few per block). */
#define PIECE 256

mt_status_t mt_ring_attention_init(mt_ring_attention_t *ra, MPI_Comm comm, const mt_backend_t *be,
                                   int64_t B, int64_t Tl, int64_t nkv, int64_t hd)
{
    memset(ra, 0, sizeof *ra);
    ra->comm = comm, ra->be = be, ra->B = B, ra->Tl = Tl, ra->nkv = nkv, ra->hd = hd;
    MT_MPI_TRY(MPI_Comm_rank(comm, &ra->rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &ra->size));
    if (Tl % 2 || Tl < 2)
        MT_FAIL(MT_ERR_RANGE, "ring attention: %lld local tokens per row; load-balanced "
                "sharding needs an even number (two chunks)", (long long)Tl);
    if (!be->attention_block_forward || !be->attention_block_backward)
        MT_FAIL(MT_ERR_UNSUPPORTED, "ring attention: backend %s has no block attention kernels",
                be->name);
    ra->kv_numel = B * Tl * nkv * hd;
    if (ra->kv_numel > INT_MAX)
        MT_FAIL(MT_ERR_RANGE, "ring attention: a K/V shard of %lld elements is over one MPI "
                "message (INT_MAX)", (long long)ra->kv_numel);
    size_t bytes = sizeof(float) * (size_t)ra->kv_numel;
    const bool staged = mt_stage_needed(be);
#ifdef MT_HAVE_NCCL
    ra->nccl = mt_nccl_for(comm); /* NCCL on device memory: no host transfer buffers */
#endif
    bool ok = true;
    for (int i = 0; i < 2; i++) {
        ra->dkv_in[i] = be->device_alloc(bytes);
        ok = ok && ra->dkv_in[i];
        for (int j = 0; j < 2; j++) { /* (bf16 storage: the K/V shards only as bf16 bits) */
            ra->kv[i][j] = be->stores_bf16 ? NULL : be->device_alloc(bytes);
            ra->dkv[i][j] = be->device_alloc(bytes);
            ok = ok && (ra->kv[i][j] || be->stores_bf16) && ra->dkv[i][j];
        }
    }
    for (int i = 0; staged && !ra->nccl && i < 2; i++) {
        ra->h_kv_out[i] = malloc(bytes), ra->h_kv_in[i] = malloc(bytes);
        ra->h_dkv_in[i] = malloc(bytes);
        ra->h_dkv_out[i][0] = malloc(bytes), ra->h_dkv_out[i][1] = malloc(bytes);
        ok = ok && ra->h_kv_out[i] && ra->h_kv_in[i] && ra->h_dkv_in[i] &&
             ra->h_dkv_out[i][0] && ra->h_dkv_out[i][1];
    }
    if (staged) { /* the block skipping reads doc_start on the host */
        ra->h_doc = malloc(sizeof(int32_t) * (size_t)(B * Tl));
        ok = ok && ra->h_doc;
    }
    if (!ok) {
        mt_ring_attention_free(ra);
        MT_FAIL(MT_ERR_NOMEM, "ring attention buffers (%zu bytes each)", bytes);
    }
    return MT_OK;
}

mt_status_t mt_ring_attention_bf16(mt_ring_attention_t *ra, int64_t nh)
{
    if (ra->kv_numel % 2) /* sent as kv_numel / 2 floats' worth of bytes */
        MT_FAIL(MT_ERR_RANGE, "ring attention: bf16 K/V of an odd %lld elements",
                (long long)ra->kv_numel);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (!ra->kv16[i][j] &&
                !(ra->kv16[i][j] = ra->be->device_alloc(sizeof(uint16_t) * (size_t)ra->kv_numel)))
                MT_FAIL(MT_ERR_NOMEM, "ring attention: bf16 K/V buffers");
    if (!ra->be->stores_bf16 || ra->bits)
        return MT_OK;
    /* bf16 storage: the shards stay bf16 bits (init made no float32 ones);
     * the block sums need float32 */
    ra->bits = true;
    ra->acc_numel = ra->B * ra->Tl * nh * ra->hd;
    size_t bytes = sizeof(float) * (size_t)ra->acc_numel;
    if (!(ra->out32 = ra->be->device_alloc(bytes)) || !(ra->dq32 = ra->be->device_alloc(bytes)))
        MT_FAIL(MT_ERR_NOMEM, "ring attention: float32 accumulators (2 x %zu bytes)", bytes);
    return MT_OK;
}

double mt_ring_attention_bytes(const mt_ring_attention_t *ra)
{
    return (double)ra->kv_numel * ((ra->bits ? 24.0 : 40.0) + (ra->kv16[0][0] ? 8.0 : 0.0)) +
           8.0 * (double)ra->acc_numel;
}

void mt_ring_attention_free(mt_ring_attention_t *ra)
{
    for (int i = 0; ra->be && i < 2; i++) {
        ra->be->device_free(ra->dkv_in[i]);
        for (int j = 0; j < 2; j++)
            ra->be->device_free(ra->kv[i][j]), ra->be->device_free(ra->dkv[i][j]),
                ra->be->device_free(ra->kv16[i][j]);
        free(ra->h_kv_out[i]), free(ra->h_kv_in[i]), free(ra->h_dkv_in[i]);
        free(ra->h_dkv_out[i][0]), free(ra->h_dkv_out[i][1]);
    }
    if (ra->be)
        ra->be->device_free(ra->out32), ra->be->device_free(ra->dq32);
    free(ra->h_doc), free(ra->h_lse);
    memset(ra, 0, sizeof *ra);
}

void mt_ring_attention_reset_stats(mt_ring_attention_t *ra)
{
    ra->blocks_done = ra->blocks_skipped = 0;
    ra->pairs = ra->t_compute = ra->t_wait = 0;
    ra->waits[0] = ra->waits[1] = ra->waits_hidden[0] = ra->waits_hidden[1] = 0;
}

/* Global start of local chunk c (0 or 1) of CP rank r. */
static int64_t chunk_start(int64_t C, int r, int P, int c)
{
    return (int64_t)(c == 0 ? r : 2 * P - 1 - r) * C;
}

/* Visible (query, key) pairs between nq queries at global q0.. (first
 * document tokens ds, or NULL) and nk keys at global k0..: 0 means the
 * block is fully masked and is skipped. */
static int64_t visible_pairs(const int32_t *ds, int64_t nq, int64_t q0, int64_t k0, int64_t nk)
{
    if (k0 > q0 + nq - 1)
        return 0; /* every key in the future */
    int64_t n = 0;
    for (int64_t i = 0; i < nq; i++) {
        const int64_t t = q0 + i, lo = ds ? ds[i] : 0;
        const int64_t a = lo > k0 ? lo : k0, b = t < k0 + nk - 1 ? t : k0 + nk - 1;
        n += b >= a ? b - a + 1 : 0;
    }
    return n;
}

/* Wait for transfers.  kind: 0 K/V, 1 dK/dV, for the statistics of what
 * compute hid; -1 for the waits for send buffers to be reusable. */
static mt_status_t wait_timed(mt_ring_attention_t *ra, int n, MPI_Request *rq, int kind)
{
#ifdef MT_HAVE_NCCL
    if (ra->nccl) { /* the compute stream waits on the device for the post that
                     * filled rq (everything queued, if unknown); the host goes on */
        /* (no hidden-wait statistics: the host does not wait) */
        for (int i = 0; i < ra->nposted; i++)
            if (ra->posted[i].key == (const void *)rq)
                return mt_nccl_join_event(ra->posted[i].event, CS);
        return mt_nccl_join(ra->nccl, CS);
    }
#endif
    int done = 1;
    for (int i = 0; i < n; i++)
        if (rq[i] != MPI_REQUEST_NULL) {
            int flag;
            MPI_Test(&rq[i], &flag, MPI_STATUS_IGNORE);
            done = done && flag;
        }
    if (kind >= 0) {
        ra->waits[kind]++;
        ra->waits_hidden[kind] += done;
    }
    double t0 = MPI_Wtime();
    mt_status_t s = mt_wait_all(n, rq);
    ra->t_wait += MPI_Wtime() - t0;
    return s;
}

/* Drive pending transfers between kernels (see the top of the file). */
static void poke(int n, MPI_Request *rq)
{
    for (int i = 0; i < n; i++)
        if (rq[i] != MPI_REQUEST_NULL) {
            int flag; /* a completed request becomes MPI_REQUEST_NULL, which the waits skip */
            MPI_Test(&rq[i], &flag, MPI_STATUS_IGNORE);
        }
}

/* Element i of an input tensor: bf16 bits under bf16 storage */
static const float *in_at(const mt_ring_attention_t *ra, const float *p, int64_t i)
{
    return (const float *)((const char *)p + (ra->bits ? 2 : 4) * i);
}

/* The 2 x 2 block pairs of this rank's queries against the K/V shard of
 * rank src: forward (dq NULL) merges into out/lse, backward adds into dq
 * and the accumulators dk/dv.  doc_start is the kernels' (backend memory),
 * h_doc the same on the host (for the skipping), both NULL unpacked.
 * Under bf16 storage q, k, v, dout and backward's out are bf16 bits;
 * forward's out and dq, dk, dv are float32 (the block sums). */
static void compute_shard(mt_ring_attention_t *ra, int src, float *out, float *lse, float *dq,
                          float *dk, float *dv, const float *dout, const float *q, const float *k,
                          const float *v, const int32_t *doc_start, const int32_t *h_doc,
                          int64_t nh, int npend, MPI_Request *pend)
{
    const mt_backend_t *be = ra->be;
    const int64_t Tl = ra->Tl, C = Tl / 2, nkv = ra->nkv, hd = ra->hd;
    const int64_t qs = nh * hd, kvs = nkv * hd;
    for (int64_t b = 0; b < ra->B; b++)
        for (int qc = 0; qc < 2; qc++)
            for (int kc = 0; kc < 2; kc++) {
                const int64_t q0 = chunk_start(C, ra->rank, ra->size, qc);
                const int64_t k0 = chunk_start(C, src, ra->size, kc);
                const int64_t qi = b * Tl + qc * C, ki = b * Tl + kc * C;
                const int32_t *ds = doc_start ? doc_start + qi : NULL;
                const int32_t *hds = h_doc ? h_doc + qi : NULL;
                const int64_t pairs = visible_pairs(hds, C, q0, k0, C);
                if (pairs == 0) {
                    ra->blocks_skipped++;
                    continue;
                }
                ra->blocks_done++;
                ra->pairs += (double)pairs;
                if (ra->no_compute)
                    continue;
                /* in pieces of PIECE queries, poking the transfers between them */
                for (int64_t p0 = 0; p0 < C; p0 += PIECE) {
                    const int64_t np = C - p0 < PIECE ? C - p0 : PIECE, qp = qi + p0;
                    const int32_t *dsp = ds ? ds + p0 : NULL;
                    if (visible_pairs(hds ? hds + p0 : NULL, np, q0 + p0, k0, C) == 0)
                        continue;
                    double t0 = MPI_Wtime();
                    float *lse_b = (float *)lse + b * nh * Tl + qc * C + p0;
                    const float *qb = in_at(ra, q, qp * qs), *kb = in_at(ra, k, ki * kvs);
                    const float *vb = in_at(ra, v, ki * kvs);
                    if (!dq)
                        be->attention_block_forward(out + qp * qs, lse_b, Tl, qb, kb, vb, dsp, np,
                                                    C, q0 + p0, k0, nh, nkv, hd);
                    else
                        be->attention_block_backward(dq + qp * qs, dk + ki * kvs, dv + ki * kvs,
                                                     in_at(ra, dout, qp * qs),
                                                     in_at(ra, out, qp * qs), lse_b, Tl, qb, kb,
                                                     vb, dsp, np, C, q0 + p0, k0, nh, nkv, hd);
                    ra->t_compute += MPI_Wtime() - t0;
                    poke(npend, pend);
                }
            }
}

/* Post the shift of a pair of shards one step around the ring: receive
 * into in[0..1] from the left (requests rrq[0..1]), send out[0..1] to the
 * right (srq[0..1]), n floats each (or their bytes: bf16 K/V go as
 * kv_numel / 2 floats; MPI and NCCL only move them), through the host
 * buffers h_in, h_out when staged (finish_pair completes the receives
 * after their wait). */
static mt_status_t post_pair(mt_ring_attention_t *ra, const float *const out[2],
                             float *const h_out[2], float *const in[2], float *const h_in[2],
                             int n, int tag, MPI_Request *rrq, MPI_Request *srq)
{
    const int P = ra->size, left = (ra->rank + P - 1) % P, right = (ra->rank + 1) % P;
    ra->bytes_sent += 2 * (int64_t)sizeof(float) * n;
#ifdef MT_HAVE_NCCL
    if (ra->nccl) { /* one grouped step on the CP group's stream; requests stay null */
        MT_TRY(mt_nccl_ring_step(ra->nccl, out, in, 2, (size_t)n, left, right, CS));
        void *ev = mt_nccl_last_event(ra->nccl);
        const void *keys[2] = {rrq, srq}; /* what wait_timed is given for each side */
        for (int k = 0; k < 2; k++) {
            int i = 0;
            while (i < ra->nposted && ra->posted[i].key != keys[k])
                i++;
            if (i == ra->nposted && i < 8)
                ra->nposted++;
            if (i < 8)
                ra->posted[i].key = keys[k], ra->posted[i].event = ev;
        }
        return MT_OK;
    }
#else
    (void)h_out, (void)h_in;
#endif
    for (int i = 0; i < 2; i++)
        MT_TRY(mt_stage_irecv(h_in[i], in[i], n, left, tag + i, ra->comm, &rrq[i]));
    for (int i = 0; i < 2; i++)
        MT_TRY(mt_stage_isend(ra->be, h_out[i], out[i], n, right, tag + i, ra->comm, &srq[i]));
    return MT_OK;
}

static void finish_pair(mt_ring_attention_t *ra, float *const h_in[2], float *const in[2], int n)
{
    if (ra->nccl) /* received on the device */
        return;
    for (int i = 0; i < 2; i++)
        mt_stage_recv_finish(ra->be, h_in[i], in[i], n);
}

/* The K/V shift (rq[0..3]): the shard in hand out, the next into buffer
 * nb.  Float32: (k, v) out, into kv[nb].  bf16: the shard's bits out
 * (step 0: k and v packed into kv16[nb ^ 1]; later: the bits received),
 * into kv16[nb]; shift_done widens them into kv[nb] (under bf16 storage
 * k and v themselves go out at step 0, and nothing is widened). */
static mt_status_t post_shift(mt_ring_attention_t *ra, const float *k, const float *v, int nb,
                              int s, MPI_Request *rq)
{
    if (!ra->kv16[0][0]) {
        const float *const out[2] = {k, v};
        return post_pair(ra, out, ra->h_kv_out, ra->kv[nb], ra->h_kv_in, (int)ra->kv_numel,
                         TAG_K, rq, rq + 2);
    }
    uint16_t *const *cur = ra->kv16[nb ^ 1];
    if (s == 0 && !ra->bits)
        ra->be->to_bf16(cur[0], k, ra->kv_numel), ra->be->to_bf16(cur[1], v, ra->kv_numel);
    /* (bf16 storage: k and v are the bits already, sent from where they
     * are; nothing writes them while the ring runs) */
    const float *const out[2] = {s == 0 && ra->bits ? k : (const float *)cur[0],
                                 s == 0 && ra->bits ? v : (const float *)cur[1]};
    float *const in[2] = {(float *)ra->kv16[nb][0], (float *)ra->kv16[nb][1]};
    return post_pair(ra, out, ra->h_kv_out, in, ra->h_kv_in, (int)(ra->kv_numel / 2), TAG_K, rq,
                     rq + 2);
}

/* After the K/V shift's wait: the received shard, float32, in kv[nb]
 * (under bf16 storage its bits in kv16[nb]); *ck, *cv point at it. */
static void shift_done(mt_ring_attention_t *ra, int nb, const float **ck, const float **cv)
{
    *ck = ra->kv[nb][0], *cv = ra->kv[nb][1];
    if (!ra->kv16[0][0]) {
        finish_pair(ra, ra->h_kv_in, ra->kv[nb], (int)ra->kv_numel);
        return;
    }
    float *const in[2] = {(float *)ra->kv16[nb][0], (float *)ra->kv16[nb][1]};
    finish_pair(ra, ra->h_kv_in, in, (int)(ra->kv_numel / 2));
    if (ra->bits) {
        *ck = in[0], *cv = in[1];
        return;
    }
    for (int i = 0; i < 2; i++)
        ra->be->from_bf16(ra->kv[nb][i], ra->kv16[nb][i], ra->kv_numel);
}

/* A bf16-storage backend's shards are bf16 bits: mt_ring_attention_bf16
 * has to have run */
static mt_status_t storage_ready(const mt_ring_attention_t *ra)
{
    if (ra->be->stores_bf16 && !ra->bits)
        MT_FAIL(MT_ERR_RANGE, "ring attention on the %s backend: mt_ring_attention_bf16 first "
                "(its shards are bf16 bits)", ra->be->name);
    return MT_OK;
}

/* doc_start for the block skipping: itself, or its host copy when staged */
static const int32_t *host_doc(mt_ring_attention_t *ra, const int32_t *doc_start)
{
    if (!doc_start || !ra->h_doc)
        return doc_start;
    ra->be->copy_to_host(ra->h_doc, doc_start, sizeof(int32_t) * (size_t)(ra->B * ra->Tl));
    return ra->h_doc;
}

mt_status_t mt_ring_attention_forward(mt_ring_attention_t *ra, float *out, float *lse,
                                      const float *q, const float *k, const float *v,
                                      const int32_t *doc_start, int64_t nh)
{
    const int P = ra->size;
    const int64_t nq = ra->B * ra->Tl, nl = nq * nh;
    ra->nposted = 0;
    MT_TRY(storage_ready(ra));
    if (ra->bits && nq * nh * ra->hd != ra->acc_numel)
        MT_FAIL(MT_ERR_RANGE, "ring attention: %lld query heads, the accumulators hold %lld",
                (long long)nh, (long long)(ra->acc_numel / (nq * ra->hd)));
    float *merged = ra->bits ? ra->out32 : out; /* the running merge */
    ra->be->zero(merged, sizeof(float) * (size_t)(nq * nh * ra->hd));
    /* lse starts at -inf: written in place, or on the host and copied in */
    float *l0 = lse;
    if (mt_stage_needed(ra->be)) {
        if (ra->h_lse_numel < nl) {
            float *h = realloc(ra->h_lse, sizeof(float) * (size_t)nl);
            if (!h)
                MT_FAIL(MT_ERR_NOMEM, "ring attention: host lse of %lld floats", (long long)nl);
            ra->h_lse = h, ra->h_lse_numel = nl;
        }
        l0 = ra->h_lse;
    }
    for (int64_t i = 0; i < nl; i++)
        l0[i] = -INFINITY;
    if (l0 != lse)
        ra->be->copy_to_device(lse, l0, sizeof(float) * (size_t)nl);
    const int32_t *h_doc = host_doc(ra, doc_start);
    const float *ck = k, *cv = v;
    int nb = 0;
    for (int s = 0; s < P; s++) {
        MPI_Request rq[4] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL,
                             MPI_REQUEST_NULL};
        if (s < P - 1)
            MT_TRY(post_shift(ra, ck, cv, nb, s, rq));
        compute_shard(ra, (ra->rank - s + P) % P, merged, lse, NULL, NULL, NULL, NULL, q, ck, cv,
                      doc_start, h_doc, nh, s < P - 1 ? 4 : 0, rq);
        if (s < P - 1) {
            MT_TRY(wait_timed(ra, 4, rq, 0));
            shift_done(ra, nb, &ck, &cv);
            nb ^= 1;
        }
    }
    if (ra->bits) /* rounded once, as the model rounds the float32 merge */
        ra->be->to_bf16((uint16_t *)out, merged, nq * nh * ra->hd);
    return MT_OK;
}

mt_status_t mt_ring_attention_backward(mt_ring_attention_t *ra, float *dq, float *dk, float *dv,
                                       const float *dout, const float *out, const float *lse,
                                       const float *q, const float *k, const float *v,
                                       const int32_t *doc_start, int64_t nh)
{
    const int P = ra->size;
    const int64_t n = ra->kv_numel;
    ra->nposted = 0;
    const size_t bytes = sizeof(float) * (size_t)n;
    const mt_backend_t *be = ra->be;
    const int64_t nqe = ra->B * ra->Tl * nh * ra->hd;
    MT_TRY(storage_ready(ra));
    if (ra->bits && nqe != ra->acc_numel)
        MT_FAIL(MT_ERR_RANGE, "ring attention: %lld query heads, the accumulators hold %lld",
                (long long)nh, (long long)(ra->acc_numel / (ra->B * ra->Tl * ra->hd)));
    float *dq_sum = ra->bits ? ra->dq32 : dq; /* the sum over blocks */
    be->zero(dq_sum, sizeof(float) * (size_t)nqe);
    const int32_t *h_doc = host_doc(ra, doc_start);
    /* rq[0..3] the K/V shift, [4..5] the incoming dK/dV, [6..9] the
     * outgoing dK/dV of the last two steps (buffer ab at 6 + 2 * ab) */
    MPI_Request rq[10];
    for (int i = 0; i < 10; i++)
        rq[i] = MPI_REQUEST_NULL;
    const float *ck = k, *cv = v;
    int nb = 0;
    for (int s = 0; s < P; s++) {
        const int ab = s % 2;
        float *acc_k = ra->dkv[ab][0], *acc_v = ra->dkv[ab][1];
        /* this buffer's send from step s - 2 must be done before it is
         * zeroed; with NCCL the wait is a join on everything posted so far,
         * so it comes before this step's K/V shift, which can then overlap */
        if (ra->nccl)
            MT_TRY(wait_timed(ra, 2, rq + 6 + 2 * ab, -1));
        if (s < P - 1)
            MT_TRY(post_shift(ra, ck, cv, nb, s, rq));
        if (!ra->nccl)
            MT_TRY(wait_timed(ra, 2, rq + 6 + 2 * ab, -1));
        be->zero(acc_k, bytes);
        be->zero(acc_v, bytes);
        compute_shard(ra, (ra->rank - s + P) % P, (float *)out, (float *)lse, dq_sum, acc_k, acc_v,
                      dout, q, ck, cv, doc_start, h_doc, nh, 10, rq);
        if (s > 0) { /* the shard's partial sum from the ranks before */
            MT_TRY(wait_timed(ra, 2, rq + 4, 1));
            finish_pair(ra, ra->h_dkv_in, ra->dkv_in, (int)n);
            be->add_f32(acc_k, ra->dkv_in[0], n);
            be->add_f32(acc_v, ra->dkv_in[1], n);
        }
        const float *const acc[2] = {acc_k, acc_v};
        MT_TRY(post_pair(ra, acc, ra->h_dkv_out[ab], ra->dkv_in, ra->h_dkv_in, (int)n, TAG_DK,
                         rq + 4, rq + 6 + 2 * ab));
        if (s < P - 1) {
            MT_TRY(wait_timed(ra, 4, rq, 0));
            shift_done(ra, nb, &ck, &cv);
            nb ^= 1;
        }
    }
    /* after P steps this rank's own shard has come home, summed over all */
    MT_TRY(wait_timed(ra, 6, rq + 4, 1));
    finish_pair(ra, ra->h_dkv_in, ra->dkv_in, (int)n);
    if (ra->bits) { /* each sum rounded once, as the model rounds them */
        be->to_bf16((uint16_t *)dq, dq_sum, nqe);
        be->to_bf16((uint16_t *)dk, ra->dkv_in[0], n);
        be->to_bf16((uint16_t *)dv, ra->dkv_in[1], n);
        return MT_OK;
    }
    be->copy(dk, ra->dkv_in[0], bytes);
    be->copy(dv, ra->dkv_in[1], bytes);
    return MT_OK;
}

double mt_cp_rank_pairs(const int32_t *doc_start, int64_t T, int r, int cp, int contiguous)
{
    const int64_t Tl = T / cp;
    double n = 0;
    for (int64_t i = 0; i < Tl; i++) {
        const int64_t t = contiguous ? (int64_t)r * Tl + i : mt_cp_global_index(i, Tl, r, cp);
        n += (double)(t - (doc_start ? doc_start[t] : 0) + 1);
    }
    return n;
}
