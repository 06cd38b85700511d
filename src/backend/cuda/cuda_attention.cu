/* cuda_attention.cu: causal grouped-query attention of the CUDA backend,
 * fp32, forward and backward, with the optional doc_start document mask;
 * the contract of kernels_cpu_attention.c (lse [B, nh, T], scale
 * 1/sqrt(hd), query head h reads kv head h / (nh/nkv)).
 *
 * FlashAttention-style: the [T, T] score matrix is never stored.  Keys
 * (or queries) come in tiles of 32 through shared memory; within a warp,
 * lane j owns the score of the tile's j-th key, and the running max/sum
 * (online softmax) are warp reductions.  Three kernels:
 *   forward   a warp per query row; out = P V with the online softmax,
 *             lse = max + log(sum);
 *   backward  D = dout . out per row (a small kernel, into backend
 *             scratch); dq: a warp per query row walking its keys
 *             (P recomputed from lse, dS = P (dP - D), dq = c dS K);
 *             dk/dv: a warp per KEY row walking the queries that see it,
 *             every query head of its group, in order (dv = P^T dout,
 *             dk = dS^T (c q)).
 * Each output row is owned by one warp that adds its terms in a fixed
 * order, so the backward is deterministic without atomics; the price is
 * that dk/dv recompute the scores the dq kernel already formed.  The
 * tile steps (loads, dots, the online-softmax update, the shuffled
 * products) are cuda_attention_tile.cuh's, shared with the ring-attention
 * block kernels (cuda_attention_block.cu), which also reuse the rowdot
 * launcher here.
 *
 * round_in (the bf16 table's fallback for head dims the tensor-core
 * kernels do not serve): q, k, v, dout and out are read as bf16 values
 * (mt_backend_t.reads_bf16).
 *
 * bf16 storage (the _bf16s launchers): the same kernels loading bf16
 * bits and storing out, dq, dk, dv rounded; the fallback of
 * mt_backend_cuda_bf16_storage where the tensor-core kernels do not serve.
 *
 * Limits: head_dim <= 128 (MAX_HD: registers and shared memory as sized
 * here), fp32 arithmetic, CUDA-core FMAs (no tensor cores).  This is the
 * reference-quality GPU path, correct first; the bf16 tensor-core
 * kernel (mma tiles of 64-128 queries, FA2's split of the work) is the
 * performance item left open in doc/gpu.md. */
#include "cuda_attention_tile.cuh"

#define TILE MT_ATT_TILE
#define MAX_HD MT_ATT_MAX_HD
#define MAX_R MT_ATT_MAX_R
#define FWD_WARPS 4              /* query rows per block */
#define KV_WARPS 8               /* key rows per block */

typedef struct {
    int64_t B, T, nh, nkv, hd, group, qstride, kvstride;
    float scale;
    const int32_t *doc_start;
    bool round; /* q, k, v, dout read as bf16 values (the bf16 table's fallback) */
} geom_t;

/* first key visible to token t of batch row b */
__device__ __forceinline__ int64_t first_key(const geom_t &G, int64_t b, int64_t t)
{
    return G.doc_start ? (int64_t)G.doc_start[b * G.T + t] : 0;
}

/* ------------------------------------------------------------------ kernels */

/* The FWD_WARPS query rows of a block, from t0 = blockIdx.x FWD_WARPS:
 * warp w's row t (active when t < T), the block's last row, the first key
 * any of its rows sees (minlo) and the first key row t sees (lo). */
struct block_rows_t {
    int64_t t, tlast, minlo, lo;
    bool active;
};

__device__ __forceinline__ block_rows_t block_rows(const geom_t &G, int64_t b, int w)
{
    block_rows_t R;
    const int64_t t0 = (int64_t)blockIdx.x * FWD_WARPS;
    R.t = t0 + w;
    R.active = R.t < G.T;
    R.tlast = t0 + FWD_WARPS - 1 < G.T - 1 ? t0 + FWD_WARPS - 1 : G.T - 1;
    R.minlo = R.tlast, R.lo = 0;
    for (int64_t r = t0; r <= R.tlast; r++) {
        const int64_t l = first_key(G, b, r);
        R.minlo = l < R.minlo ? l : R.minlo;
        if (r == R.t)
            R.lo = l;
    }
    return R;
}

/* rows: FWD_WARPS queries (b, h, t0 + warp); shared: Qs [FWD_WARPS][hd],
 * K and V tiles [TILE][hd + 1] (the pad keeps lane j's row reads
 * conflict-free). */
template <typename T>
__global__ void mt_k_attention_forward(T *out, float *lse, const T *q, const T *k, const T *v,
                                       geom_t G)
{
    extern __shared__ float sm[];
    const int64_t hd = G.hd, ld = hd + 1;
    float *Qs = sm, *Ks = Qs + FWD_WARPS * hd, *Vs = Ks + TILE * ld;
    const int lane = threadIdx.x % MT_WARP, w = threadIdx.x / MT_WARP;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / G.group;
    const block_rows_t R = block_rows(G, b, w);
    const int64_t t = R.t, tlast = R.tlast, minlo = R.minlo, lo = R.lo;
    const bool active = R.active;
    if (active)
        mt_att_load_row(Qs + w * hd, q + (b * G.T + t) * G.qstride + h * hd, hd, G.scale,
                        G.round);

    float o[MAX_R];
    for (int r = 0; r < MAX_R; r++)
        o[r] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int64_t kvbase = b * G.T * G.kvstride + g * hd;

    for (int64_t j0 = minlo; j0 <= tlast; j0 += TILE) {
        const int64_t nj = tlast + 1 - j0 < TILE ? tlast + 1 - j0 : TILE;
        __syncthreads(); /* the previous tile is no longer read */
        mt_att_load_tiles(Ks, Vs, k, v, kvbase + j0 * G.kvstride, G.kvstride, nj, hd, 1.0f,
                          G.round);
        __syncthreads();
        if (!active)
            continue;
        const int64_t key = j0 + lane;
        mt_att_forward_tile(lane < nj && key >= lo && key <= t, Qs + w * hd, Ks, Vs, (int)nj, hd,
                            m, l, o);
    }
    if (!active)
        return;
    mt_att_store_row(out + (b * G.T + t) * G.qstride + h * hd, o, 1.0f / l, hd, false);
    if (lane == 0)
        lse[(b * G.nh + h) * G.T + t] = m + logf(l);
}

/* D[(b*nh + h)*T + t] = dout . out over the row's head dims (rows of
 * nh*hd floats); a warp per row */
template <typename E>
__global__ void mt_k_attention_rowdot(float *D, const E *dout, const E *out, int64_t B,
                                      int64_t T, int64_t nh, int64_t hd, bool round)
{
    const int lane = threadIdx.x % MT_WARP;
    const int64_t nrows = B * nh * T, wstride = (int64_t)gridDim.x * blockDim.x / MT_WARP;
    for (int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / MT_WARP; row < nrows;
         row += wstride) { /* the whole warp takes the same rows */
        const int64_t t = row % T, h = (row / T) % nh, b = row / (T * nh);
        const int64_t off = (b * T + t) * nh * hd + h * hd;
        float acc = 0.0f;
        for (int64_t d = lane; d < hd; d += MT_WARP)
            acc += mt_bf16_if(mt_ld(dout, off + d), round) * mt_bf16_if(mt_ld(out, off + d), round);
        acc = mt_warp_sum(acc);
        if (lane == 0)
            D[row] = acc;
    }
}

/* dq of FWD_WARPS query rows; the forward's layout plus dO [FWD_WARPS][hd] */
template <typename T>
__global__ void mt_k_attention_dq(T *dq, const T *dout, const float *lse, const float *D,
                                  const T *q, const T *k, const T *v, geom_t G)
{
    extern __shared__ float sm[];
    const int64_t hd = G.hd, ld = hd + 1;
    float *Qs = sm, *dO = Qs + FWD_WARPS * hd, *Ks = dO + FWD_WARPS * hd, *Vs = Ks + TILE * ld;
    const int lane = threadIdx.x % MT_WARP, w = threadIdx.x / MT_WARP;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / G.group;
    const block_rows_t R = block_rows(G, b, w);
    const int64_t t = R.t, tlast = R.tlast, minlo = R.minlo, lo = R.lo;
    const bool active = R.active;
    const int64_t qoff = (b * G.T + t) * G.qstride + h * hd;
    float L = 0.0f, Dr = 0.0f;
    if (active) {
        mt_att_load_row(Qs + w * hd, q + qoff, hd, G.scale, G.round);
        mt_att_load_row(dO + w * hd, dout + qoff, hd, 1.0f, G.round);
        L = lse[(b * G.nh + h) * G.T + t];
        Dr = D[(b * G.nh + h) * G.T + t];
    }
    float acc[MAX_R];
    for (int r = 0; r < MAX_R; r++)
        acc[r] = 0.0f;
    const int64_t kvbase = b * G.T * G.kvstride + g * hd;

    for (int64_t j0 = minlo; j0 <= tlast; j0 += TILE) {
        const int64_t nj = tlast + 1 - j0 < TILE ? tlast + 1 - j0 : TILE;
        __syncthreads();
        mt_att_load_tiles(Ks, Vs, k, v, kvbase + j0 * G.kvstride, G.kvstride, nj, hd, 1.0f,
                          G.round);
        __syncthreads();
        if (!active)
            continue;
        const int64_t key = j0 + lane;
        mt_att_dq_tile(lane < nj && key >= lo && key <= t, Qs + w * hd, dO + w * hd, Ks, Vs,
                       (int)nj, hd, L, Dr, acc);
    }
    if (!active)
        return;
    mt_att_store_row(dq + qoff, acc, G.scale, hd, false);
}

/* dk, dv of KV_WARPS key rows (b, g, j0 + warp).  Shared: own K and V
 * rows [KV_WARPS][hd]; query tiles Qs (scaled) and dO [TILE][hd + 1];
 * per query L, D and first visible key. */
template <typename T>
__global__ void mt_k_attention_dkdv(T *dk, T *dv, const T *dout, const float *lse,
                                    const float *D, const T *q, const T *k, const T *v,
                                    geom_t G)
{
    extern __shared__ float sm[];
    __shared__ float sL[TILE], sD[TILE];
    __shared__ int64_t sLo[TILE];
    const int64_t hd = G.hd, ld = hd + 1;
    float *Kr = sm, *Vr = Kr + KV_WARPS * hd, *Qs = Vr + KV_WARPS * hd, *dO = Qs + TILE * ld;
    const int lane = threadIdx.x % MT_WARP, w = threadIdx.x / MT_WARP;
    const int64_t b = blockIdx.z, g = blockIdx.y;
    const int64_t j0 = (int64_t)blockIdx.x * KV_WARPS, key = j0 + w;
    const bool active = key < G.T;
    const int64_t kvoff = (b * G.T + key) * G.kvstride + g * hd;
    float adk[MAX_R], adv[MAX_R];
    mt_att_key_row_init(Kr + w * hd, Vr + w * hd, k + kvoff, v + kvoff, hd, active, adk, adv,
                        G.round);

    for (int64_t hh = 0; hh < G.group; hh++) {
        const int64_t h = g * G.group + hh;
        for (int64_t q0 = j0; q0 < G.T; q0 += TILE) { /* queries before j0 see none of these keys */
            const int64_t nq = G.T - q0 < TILE ? G.T - q0 : TILE;
            __syncthreads(); /* the previous tile (and, first time, Kr/Vr) */
            mt_att_load_tiles(Qs, dO, q, dout, (b * G.T + q0) * G.qstride + h * hd, G.qstride, nq,
                              hd, G.scale, G.round);
            for (int64_t i = threadIdx.x; i < nq; i += blockDim.x) {
                sL[i] = lse[(b * G.nh + h) * G.T + q0 + i];
                sD[i] = D[(b * G.nh + h) * G.T + q0 + i];
                sLo[i] = first_key(G, b, q0 + i);
            }
            __syncthreads();
            if (!active)
                continue;
            const int64_t tq = q0 + lane;
            const bool vis = lane < nq && tq >= key && sLo[lane] <= key;
            mt_att_dkdv_tile(vis, Kr + w * hd, Vr + w * hd, Qs, dO, (int)nq, hd,
                             vis ? sL[lane] : 0.0f, vis ? sD[lane] : 0.0f, adk, adv);
        }
    }
    if (!active)
        return;
    mt_att_store_row(dk + kvoff, adk, 1.0f, hd, false);
    mt_att_store_row(dv + kvoff, adv, 1.0f, hd, false);
}

/* ------------------------------------------------------------------ launchers */

static geom_t make_geom(const char *kernel, const int32_t *doc_start, int64_t B, int64_t T,
                        int64_t nh, int64_t nkv, int64_t hd, bool round)
{
    MT_CUDA_REQUIRE(B > 0 && T > 0 && nh > 0 && nkv > 0 && nh % nkv == 0, kernel,
                    "B=%lld T=%lld nh=%lld nkv=%lld (nh must be a multiple of nkv)",
                    (long long)B, (long long)T, (long long)nh, (long long)nkv);
    MT_CUDA_REQUIRE(hd > 0 && hd <= MAX_HD, kernel, "head_dim=%lld, this kernel serves 1..%d",
                    (long long)hd, MAX_HD);
    MT_CUDA_REQUIRE(B <= 65535 && nh <= 65535, kernel, "grid: B=%lld nh=%lld", (long long)B,
                    (long long)nh);
    geom_t G;
    G.B = B, G.T = T, G.nh = nh, G.nkv = nkv, G.hd = hd, G.group = nh / nkv;
    G.qstride = nh * hd, G.kvstride = nkv * hd;
    G.scale = (float)(1.0 / sqrt((double)hd));
    G.doc_start = doc_start;
    G.round = round;
    return G;
}

extern "C" void mt_cuda_launch_attention_rowdot(cudaStream_t s, float *D, const float *dout,
                                                const float *out, int64_t B, int64_t T,
                                                int64_t nh, int64_t hd, bool round)
{
    const int64_t rows = B * nh * T;
    if (rows == 0)
        return;
    mt_k_attention_rowdot<float><<<mt_cuda_blocks(rows * MT_WARP, 256), 256, 0, s>>>(
        D, dout, out, B, T, nh, hd, round);
    MT_CUDA_LAUNCH_CHECK("attention_rowdot");
}

/* bf16 storage: dout and out bf16 bits (exact loads) */
extern "C" void mt_cuda_launch_attention_rowdot_bf16s(cudaStream_t s, float *D,
                                                      const uint16_t *dout, const uint16_t *out,
                                                      int64_t B, int64_t T, int64_t nh,
                                                      int64_t hd)
{
    const int64_t rows = B * nh * T;
    if (rows == 0)
        return;
    mt_k_attention_rowdot<__nv_bfloat16><<<mt_cuda_blocks(rows * MT_WARP, 256), 256, 0, s>>>(
        D, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)out, B, T, nh, hd, true);
    MT_CUDA_LAUNCH_CHECK("attention_rowdot");
}

template <typename T>
static void forward(cudaStream_t s, T *out, float *lse, const T *q, const T *k, const T *v,
                    const int32_t *doc_start, int64_t B, int64_t Tn, int64_t nh, int64_t nkv,
                    int64_t hd, bool round_in)
{
    const geom_t G = make_geom("attention_forward", doc_start, B, Tn, nh, nkv, hd, round_in);
    const size_t smem = (size_t)(FWD_WARPS * hd + 2 * TILE * (hd + 1)) * sizeof(float);
    dim3 grid((unsigned)((Tn + FWD_WARPS - 1) / FWD_WARPS), (unsigned)nh, (unsigned)B);
    mt_k_attention_forward<T><<<grid, FWD_WARPS * MT_WARP, smem, s>>>(out, lse, q, k, v, G);
    MT_CUDA_LAUNCH_CHECK("attention_forward");
}

extern "C" void mt_cuda_launch_attention_forward(cudaStream_t s, float *out, float *lse,
                                                 const float *q, const float *k, const float *v,
                                                 const int32_t *doc_start, int64_t B, int64_t T,
                                                 int64_t nh, int64_t nkv, int64_t hd,
                                                 bool round_in)
{
    forward<float>(s, out, lse, q, k, v, doc_start, B, T, nh, nkv, hd, round_in);
}

/* bf16 storage: the same kernel on bf16 bits (exact loads, out rounded as
 * stored): the bf16 table's fallback bits (its round_in, then a rounding
 * pass over out) */
extern "C" void mt_cuda_launch_attention_forward_bf16s(cudaStream_t s, uint16_t *out,
                                                      float *lse, const uint16_t *q,
                                                      const uint16_t *k, const uint16_t *v,
                                                      const int32_t *doc_start, int64_t B,
                                                      int64_t T, int64_t nh, int64_t nkv,
                                                      int64_t hd)
{
    typedef __nv_bfloat16 bf;
    forward<bf>(s, (bf *)out, lse, (const bf *)q, (const bf *)k, (const bf *)v, doc_start, B, T,
                nh, nkv, hd, false);
}

static void rowdot(cudaStream_t s, float *D, const float *dout, const float *out, int64_t B,
                   int64_t Tn, int64_t nh, int64_t hd, bool round_in)
{
    mt_cuda_launch_attention_rowdot(s, D, dout, out, B, Tn, nh, hd, round_in);
}
static void rowdot(cudaStream_t s, float *D, const __nv_bfloat16 *dout, const __nv_bfloat16 *out,
                   int64_t B, int64_t Tn, int64_t nh, int64_t hd, bool)
{
    mt_cuda_launch_attention_rowdot_bf16s(s, D, (const uint16_t *)dout, (const uint16_t *)out, B,
                                          Tn, nh, hd);
}

template <typename T>
static void backward(cudaStream_t s, T *dq, T *dk, T *dv, const T *dout, const T *out,
                     const float *lse, const T *q, const T *k, const T *v,
                     const int32_t *doc_start, int64_t B, int64_t Tn, int64_t nh, int64_t nkv,
                     int64_t hd, bool round_in)
{
    const int64_t T_ = Tn;
    const geom_t G = make_geom("attention_backward", doc_start, B, T_, nh, nkv, hd, round_in);
    float *D = (float *)mt_cuda_scratch("attention_backward",
                                        (size_t)(B * nh * T_) * sizeof(float));
    rowdot(s, D, dout, out, B, T_, nh, hd, round_in);

    const size_t smem_dq = (size_t)(2 * FWD_WARPS * hd + 2 * TILE * (hd + 1)) * sizeof(float);
    dim3 gq((unsigned)((T_ + FWD_WARPS - 1) / FWD_WARPS), (unsigned)nh, (unsigned)B);
    mt_k_attention_dq<T><<<gq, FWD_WARPS * MT_WARP, smem_dq, s>>>(dq, dout, lse, D, q, k, v, G);
    MT_CUDA_LAUNCH_CHECK("attention_dq");

    const size_t smem_kv = (size_t)(2 * KV_WARPS * hd + 2 * TILE * (hd + 1)) * sizeof(float);
    dim3 gk((unsigned)((T_ + KV_WARPS - 1) / KV_WARPS), (unsigned)nkv, (unsigned)B);
    mt_k_attention_dkdv<T><<<gk, KV_WARPS * MT_WARP, smem_kv, s>>>(dk, dv, dout, lse, D, q, k, v,
                                                                    G);
    MT_CUDA_LAUNCH_CHECK("attention_dkdv");
}

extern "C" void mt_cuda_launch_attention_backward(cudaStream_t s, float *dq, float *dk, float *dv,
                                                  const float *dout, const float *out,
                                                  const float *lse, const float *q,
                                                  const float *k, const float *v,
                                                  const int32_t *doc_start, int64_t B, int64_t T,
                                                  int64_t nh, int64_t nkv, int64_t hd,
                                                  bool round_in)
{
    backward<float>(s, dq, dk, dv, dout, out, lse, q, k, v, doc_start, B, T, nh, nkv, hd,
                    round_in);
}

/* bf16 storage: dq, dk, dv rounded as stored (the bf16 table's fallback
 * bits: its round_in, then rounding passes) */
extern "C" void mt_cuda_launch_attention_backward_bf16s(
    cudaStream_t s, uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout,
    const uint16_t *out, const float *lse, const uint16_t *q, const uint16_t *k,
    const uint16_t *v, const int32_t *doc_start, int64_t B, int64_t T, int64_t nh, int64_t nkv,
    int64_t hd)
{
    typedef __nv_bfloat16 bf;
    typedef const __nv_bfloat16 *P;
    backward<bf>(s, (bf *)dq, (bf *)dk, (bf *)dv, (P)dout, (P)out, lse, (P)q, (P)k, (P)v,
                 doc_start, B, T, nh, nkv, hd, false);
}
