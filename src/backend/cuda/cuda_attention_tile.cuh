/* cuda_attention_tile.cuh: the tile steps the CUDA attention kernels
 * share, the dense ones (cuda_attention.cu) and the ring-attention block
 * ones (cuda_attention_block.cu); the CUDA counterpart of
 * kernels_cpu_tile.h.  C++ only, not installed.
 *
 * The layout they assume: a warp owns one row (a query, or a key in the
 * dk/dv kernels); lane j owns the score of row j of a shared tile of
 * MT_ATT_TILE rows stored [n][hd + 1] (the pad keeps lane j's row reads
 * conflict-free); a row's head dims d = lane + 32 r live in registers
 * acc[r], r < MT_ATT_MAX_R.  Callers run these on every lane of the
 * warp (they shuffle with the full mask).  What differs between the
 * kernels (geometry, masks, where results go) stays in their files. */
#ifndef MT_CUDA_ATTENTION_TILE_CUH
#define MT_CUDA_ATTENTION_TILE_CUH

#include "cuda_common.cuh"

#define MT_ATT_TILE 32   /* keys (forward, dq) or queries (dk/dv) per shared tile */
#define MT_ATT_MAX_HD 128
#define MT_ATT_MAX_R (MT_ATT_MAX_HD / MT_WARP) /* head dims per lane */

/* The loaders read their global tensors as T: float (as they are, or as
 * bf16 values with rnd) or __nv_bfloat16 (bf16 storage: exact). */

/* Block-cooperative: rows 0..n of a and b (element offsets base + j *
 * stride) into the padded shared tiles A and B; A's values times sa.
 * With rnd every value is read as its bf16 value (before the scaling):
 * mt_backend_t.reads_bf16. */
template <typename T>
__device__ __forceinline__ void mt_att_load_tiles(float *A, float *B, const T *a, const T *b,
                                                  int64_t base, int64_t stride, int64_t n,
                                                  int64_t hd, float sa, bool rnd)
{
    const int64_t ld = hd + 1;
    for (int64_t e = threadIdx.x; e < n * hd; e += blockDim.x) {
        const int64_t j = e / hd, d = e % hd;
        A[j * ld + d] = mt_bf16_if(mt_ld(a, base + j * stride + d), rnd) * sa;
        B[j * ld + d] = mt_bf16_if(mt_ld(b, base + j * stride + d), rnd);
    }
}

/* Warp-cooperative: one row of hd values (times s) into shared memory,
 * read as bf16 values with rnd. */
template <typename T>
__device__ __forceinline__ void mt_att_load_row(float *dst, const T *src, int64_t hd, float s,
                                                bool rnd)
{
    for (int64_t d = threadIdx.x % MT_WARP; d < hd; d += MT_WARP)
        dst[d] = mt_bf16_if(mt_ld(src, d), rnd) * s;
}

/* dk/dv kernels: the warp's own key and value rows into shared memory
 * (when active) and its accumulators to 0 */
template <typename T>
__device__ __forceinline__ void mt_att_key_row_init(float *Kr, float *Vr, const T *krow,
                                                    const T *vrow, int64_t hd, bool active,
                                                    float *adk, float *adv, bool rnd)
{
    if (active) {
        mt_att_load_row(Kr, krow, hd, 1.0f, rnd);
        mt_att_load_row(Vr, vrow, hd, 1.0f, rnd);
    }
    for (int r = 0; r < MT_ATT_MAX_R; r++)
        adk[r] = adv[r] = 0.0f;
}

/* x . y over hd values, in order (one lane, shared memory) */
__device__ __forceinline__ float mt_att_dot(const float *x, const float *y, int64_t hd)
{
    float s = 0.0f;
    for (int64_t d = 0; d < hd; d++)
        s += x[d] * y[d];
    return s;
}

/* acc += sum over tile rows j < n, in order, of (lane j's x) * X[j]: the
 * P V, dS K, P^T dO and dS^T Q products of a tile. */
__device__ __forceinline__ void mt_att_accum(float *acc, float x, const float *X, int n,
                                             int64_t hd)
{
    const int lane = threadIdx.x % MT_WARP;
    const int64_t ld = hd + 1;
    for (int j = 0; j < n; j++) {
        const float xj = __shfl_sync(0xffffffffu, x, j);
        for (int r = 0; r < MT_ATT_MAX_R; r++) {
            const int64_t d = lane + r * MT_WARP;
            if (d < hd)
                acc[r] += xj * X[j * ld + d];
        }
    }
}

/* The three tile steps.  Qr, dOr: the warp's own query row (Q scaled);
 * K, V: the shared key tile, lane j's key visible when vis.  Forward:
 * the online softmax, updating the running max m, sum l and
 * unnormalised output o with the tile's P V (a tile with no visible key
 * changes nothing). */
__device__ __forceinline__ void mt_att_forward_tile(bool vis, const float *Qr, const float *K,
                                                    const float *V, int n, int64_t hd, float &m,
                                                    float &l, float *o)
{
    const int lane = threadIdx.x % MT_WARP;
    const float s = vis ? mt_att_dot(Qr, K + lane * (hd + 1), hd) : -INFINITY;
    const float tmax = mt_warp_max(s);
    if (tmax == -INFINITY)
        return; /* warp-uniform */
    const float mnew = fmaxf(m, tmax);
    const float corr = expf(m - mnew); /* 0 on the row's first visible tile */
    const float p = vis ? expf(s - mnew) : 0.0f;
    l = l * corr + mt_warp_sum(p);
    m = mnew;
    for (int r = 0; r < MT_ATT_MAX_R; r++)
        o[r] *= corr;
    mt_att_accum(o, p, V, n, hd);
}

/* dq: acc += dS K over the tile, P = exp(S - L), dS = P (dO . V - D),
 * with L and D the row's lse and dout . out. */
__device__ __forceinline__ void mt_att_dq_tile(bool vis, const float *Qr, const float *dOr,
                                               const float *K, const float *V, int n, int64_t hd,
                                               float L, float D, float *acc)
{
    const int lane = threadIdx.x % MT_WARP;
    float ds = 0.0f;
    if (vis) {
        const float p = expf(mt_att_dot(Qr, K + lane * (hd + 1), hd) - L);
        ds = p * (mt_att_dot(dOr, V + lane * (hd + 1), hd) - D);
    }
    mt_att_accum(acc, ds, K, n, hd);
}

/* dk/dv, the transposed step: the warp owns key row Kr, Vr; Q (scaled)
 * and dO are a shared tile of queries, lane i's visible when vis, with
 * lse L and row dot D.  adv += P^T dO, adk += dS^T Q.  Returns vis. */
__device__ __forceinline__ bool mt_att_dkdv_tile(bool vis, const float *Kr, const float *Vr,
                                                 const float *Q, const float *dO, int n,
                                                 int64_t hd, float L, float D, float *adk,
                                                 float *adv)
{
    const int lane = threadIdx.x % MT_WARP;
    float p = 0.0f, ds = 0.0f;
    if (vis) {
        p = expf(mt_att_dot(Q + lane * (hd + 1), Kr, hd) - L);
        ds = p * (mt_att_dot(dO + lane * (hd + 1), Vr, hd) - D);
    }
    mt_att_accum(adv, p, dO, n, hd);
    mt_att_accum(adk, ds, Q, n, hd);
    return vis;
}

/* row[d] = acc * s, or row[d] += acc * s when add, for the lane's dims;
 * a row of T (bf16 storage: rounded as stored) */
template <typename T>
__device__ __forceinline__ void mt_att_store_row(T *row, const float *acc, float s, int64_t hd,
                                                 bool add)
{
    const int lane = threadIdx.x % MT_WARP;
    for (int r = 0; r < MT_ATT_MAX_R; r++) {
        const int64_t d = lane + r * MT_WARP;
        if (d < hd)
            mt_st(row, d, add ? mt_ld(row, d) + acc[r] * s : acc[r] * s);
    }
}

#endif
