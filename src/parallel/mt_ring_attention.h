/* mt_ring_attention.h: ring attention over a context-parallel group, with
 * load-balanced causal sharding (context parallelism, doc/context-parallel.md).
 *
 * A row of T tokens is cut into 2*cp chunks of C = T / (2*cp); CP rank r
 * holds chunks r and 2*cp-1-r, local token i < C being global token r*C + i
 * and local token C + i global token (2*cp-1-r)*C + i.  Every rank then
 * has the same share of the causal triangle.  Forward passes K/V around
 * the ring (non-blocking, the next block in flight while the current one
 * is computed) and merges the blocks with an online softmax; backward
 * passes K/V the same way and the dK/dV accumulators one step behind.
 * Block pairs that causality or the document mask (narrowed by a
 * sliding window, which the model folds into doc_start) hide completely
 * are skipped.
 *
 * The functions take the communicator (never MPI_COMM_WORLD) and use the
 * backend's attention_block_* kernels on its memory; they allocate nothing
 * after init (but one host buffer at the first forward, when staged).
 * Not done here: zig-zag variants with more than two chunks per rank,
 * all-gather (non-ring) CP. */
#ifndef MT_RING_ATTENTION_H
#define MT_RING_ATTENTION_H

#include <mpi.h>
#include <stdint.h>

#include "mt_backend.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    MPI_Comm comm;       /* the CP group (not owned) */
    int rank, size;
    const mt_backend_t *be;
    int64_t B, Tl, nkv, hd; /* local shape: B rows of Tl = 2C tokens */
    int64_t kv_numel;    /* B * Tl * nkv * hd: one K (or V) shard */
    float *kv[2][2];     /* [buffer][k or v]: blocks travelling around the ring */
    float *dkv[2][2];    /* [buffer][dk or dv]: travelling gradient accumulators */
    float *dkv_in[2];    /* the accumulators arriving from the previous rank */
    /* The buffers above are the backend's memory (be->device_alloc), as are
     * the tensor arguments.  A backend MPI may not be handed directly
     * (mt_stage.h: every one but the plain CPU backend) has its transfers
     * run on host buffers, else these are NULL: [k or v] outgoing and
     * incoming K/V, [buffer][dk or dv] outgoing and [dk or dv] incoming
     * accumulators; and host copies of doc_start [B*Tl] (the block
     * skipping reads it) and of lse's starting value [B*nh*Tl]. */
    float *h_kv_out[2], *h_kv_in[2], *h_dkv_out[2][2], *h_dkv_in[2];
    int32_t *h_doc;
    void *nccl;          /* the CP group's mt_nccl_group_t when its transfers go through
                          * NCCL on device memory (grouped send/recv), else NULL */
    struct {
        const void *key; /* the request array a post filled (its MPI requests stay null) */
        void *event;     /* the post's collective (mt_nccl_last_event) */
    } posted[8];
    int nposted;         /* cleared at the start of each pass */
    float *h_lse;
    int64_t h_lse_numel;
    /* K/V as bf16 bits (mt_ring_attention_bf16): kv16[buffer][k or v] of
     * kv_numel each, the backend's memory; NULL otherwise. */
    uint16_t *kv16[2][2];
    /* bf16 storage (the backend's stores_bf16, mt_ring_attention_bf16):
     * q, k, v, out and dout are bf16 bits, the K/V shards travel and are
     * computed on as they are (kv NULL from init), and the block sums run in
     * float32 accumulators of acc_numel (B * Tl * nh * hd) each, out32 and
     * dq32, rounded once into out and dq, as dk and dv are from theirs. */
    bool bits;
    float *out32, *dq32;
    int64_t acc_numel;
    int64_t bytes_sent;  /* K/V and dK/dV bytes this rank sent, since init */
    /* Counters since init (or mt_ring_attention_reset_stats), for the
     * benchmark and the tests: block pairs computed and skipped, visible
     * (query, key) pairs computed per head (forward and backward each
     * count), seconds in the compute kernels and blocked in waits, and how
     * many transfers were already complete when compute was done. */
    int64_t blocks_done, blocks_skipped;
    double pairs, t_compute, t_wait;
    int64_t waits[2], waits_hidden[2]; /* waits on [0] K/V, [1] dK/dV transfers;
                                        * those already complete */
    int no_compute;      /* benchmark only: move the data, skip the kernels */
} mt_ring_attention_t;

/* For rows of Tl = 2C local tokens (T = Tl * size), local batch B and
 * nkv kv heads of head_dim hd. */
mt_status_t mt_ring_attention_init(mt_ring_attention_t *ra, MPI_Comm comm, const mt_backend_t *be,
                                   int64_t B, int64_t Tl, int64_t nkv, int64_t hd);
void mt_ring_attention_free(mt_ring_attention_t *ra);
/* K and V hold bf16 values (mixed precision: q, k after RoPE and v are
 * rounded): from now on the K/V shifts send them as bf16 bits, half the
 * bytes, exactly (the dK/dV partial sums stay float32).  nh query heads:
 * on a bf16-storage backend (bits above) the accumulators' size. */
mt_status_t mt_ring_attention_bf16(mt_ring_attention_t *ra, int64_t nh);
/* The backend memory the ring holds: 10 float32 shards of kv_numel (K/V
 * and dK/dV in flight), and 4 of bf16 bits after mt_ring_attention_bf16;
 * under bf16 storage 6 float32 and 4 bf16 shards and the two accumulators
 * (meshtrain-plan counts the same). */
double mt_ring_attention_bytes(const mt_ring_attention_t *ra);
void mt_ring_attention_reset_stats(mt_ring_attention_t *ra);

/* Global row index of local token i (0 <= i < Tl) on CP rank r of cp. */
static inline int64_t mt_cp_global_index(int64_t i, int64_t Tl, int r, int cp)
{
    const int64_t C = Tl / 2;
    return i < C ? (int64_t)r * C + i : (int64_t)(2 * cp - 1 - r) * C + (i - C);
}

/* The dense kernels' arguments for this rank's local tokens: q, out, dq
 * [B*Tl, nh*hd], k, v, dk, dv [B*Tl, nkv*hd], lse [B, nh, Tl]; doc_start
 * NULL or [B*Tl] GLOBAL row indices of each local token's first visible
 * key (its document's first token, or its sliding window's).  Collective
 * over the CP group.  Backward overwrites dq, dk, dv. */
mt_status_t mt_ring_attention_forward(mt_ring_attention_t *ra, float *out, float *lse,
                                      const float *q, const float *k, const float *v,
                                      const int32_t *doc_start, int64_t nh);
mt_status_t mt_ring_attention_backward(mt_ring_attention_t *ra, float *dq, float *dk, float *dv,
                                       const float *dout, const float *out, const float *lse,
                                       const float *q, const float *k, const float *v,
                                       const int32_t *doc_start, int64_t nh);

/* Visible (query, key) pairs of the whole causal/document-masked row that
 * CP rank r's queries attend to (per head): the per-rank attention work,
 * for the benchmark.  contiguous: the naive layout (rank r holds tokens
 * [r*T/cp, (r+1)*T/cp)) instead of the load-balanced one.  doc_start NULL
 * or [T] global. */
double mt_cp_rank_pairs(const int32_t *doc_start, int64_t T, int r, int cp, int contiguous);

#ifdef __cplusplus
}
#endif
#endif
