/* cuda_attention_block.cu: block attention of the CUDA backend, the
 * compute step of ring attention (context parallelism); the contract of
 * kernels_cpu_attention_block.c and mt_backend.h: nq queries (GLOBAL row
 * indices q0..) against nk keys (k0..) of one row, query i sees key j
 * when lo_i <= j <= q0 + i, lo_i = doc_start[i] (global) or 0; lse at
 * h * lse_stride + i; the forward MERGES into a running (out, lse), the
 * backward ADDS into dq, dk, dv.
 *
 * Same structure as the dense kernels (cuda_attention.cu), whose tile
 * steps it shares (cuda_attention_tile.cuh):
 *   forward   a warp per query row, FWD_WARPS rows of one head per
 *             block; key tiles of 32 over the union of the rows' visible
 *             ranges; online softmax; then the merge
 *               lse' = logaddexp(lse, m + log l),
 *               out' = out exp(lse - lse') + (O / l) exp(m + log l - lse'),
 *             written only for rows that saw a key of the block (a row
 *             whose running lse is -inf gets O / l without reading out);
 *   backward  D = dout . out per (head, query) into backend scratch (the
 *             dense rowdot with B = 1, T = nq); dq: a warp per query row
 *             (dq += c dS K); dk/dv: a warp per KEY row walking the queries
 *             that can see it, every query head of its group, in order
 *             (dv += P^T dout, dk += dS^T (c q)).
 * Every output row is owned by one warp adding in a fixed order: no
 * atomics, deterministic.  Rows and keys that see nothing are left
 * untouched.  Limits as in the dense kernels: head_dim <= 128, fp32
 * arithmetic, CUDA cores.  The inputs are float32, or under bf16 storage
 * bf16 bits (the _bf16s launchers: the same kernels on __nv_bfloat16
 * loads; out in the forward and the gradients stay float32 sums).  Not done: skipping fully masked blocks before launch (the
 * caller, ring_attention.c, already skips them; here a block of rows
 * that sees nothing returns after its range scan). */
#include "cuda_attention_tile.cuh"

#define TILE MT_ATT_TILE
#define MAX_R MT_ATT_MAX_R
#define FWD_WARPS 4 /* query rows per block (forward, dq) */
#define KV_WARPS 8  /* key rows per block (dk/dv) */

typedef struct {
    int64_t nq, nk, q0, k0, nh, nkv, hd, group, qs, kvs, lse_stride;
    float scale;
    const int32_t *doc_start;
} bgeom_t;

/* GLOBAL index of the first key query i may see */
__device__ __forceinline__ int64_t first_key(const bgeom_t &G, int64_t i)
{
    if (!G.doc_start)
        return 0;
    const int64_t l = G.doc_start[i];
    if (l < 0 || l > G.q0 + i) {
        printf("meshtrain cuda attention_block: doc_start[%lld] = %lld, must be in [0, %lld]\n",
               (long long)i, (long long)l, (long long)(G.q0 + i));
        __trap();
    }
    return l;
}

/* The query row of this warp in a forward or dq block (FWD_WARPS rows
 * i0.. of head h = blockIdx.y): its visible keys [lo, hi] as LOCAL key
 * indices (empty when lo > hi), and the union [kmin, kmax] over the
 * block's rows (kmin > kmax when none sees a key of the block). */
typedef struct {
    int64_t h, g, i, qoff, lo, hi, kmin, kmax;
    bool active;
} brow_t;

__device__ __forceinline__ brow_t block_row(const bgeom_t &G)
{
    brow_t R;
    R.h = blockIdx.y, R.g = R.h / G.group;
    const int64_t i0 = (int64_t)blockIdx.x * FWD_WARPS;
    R.i = i0 + threadIdx.x / MT_WARP;
    R.active = R.i < G.nq;
    R.qoff = R.i * G.qs + R.h * G.hd;
    R.kmin = INT64_MAX, R.kmax = -1, R.lo = 0, R.hi = -1;
    for (int64_t i = i0; i < i0 + FWD_WARPS && i < G.nq; i++) {
        const int64_t f = first_key(G, i), t = G.q0 + i;
        const int64_t a = (f > G.k0 ? f : G.k0) - G.k0;
        const int64_t b = (t < G.k0 + G.nk - 1 ? t : G.k0 + G.nk - 1) - G.k0;
        if (i == R.i)
            R.lo = a, R.hi = b;
        if (a <= b) {
            R.kmin = a < R.kmin ? a : R.kmin;
            R.kmax = b > R.kmax ? b : R.kmax;
        }
    }
    return R;
}

/* ------------------------------------------------------------------ kernels */

/* rows: FWD_WARPS queries (h, i0 + warp); shared: Qs [FWD_WARPS][hd],
 * K and V tiles [TILE][hd + 1]. */
template <typename T>
__global__ void mt_k_attention_block_forward(float *out, float *lse, const T *q, const T *k,
                                             const T *v, bgeom_t G)
{
    extern __shared__ float sm[];
    const int64_t hd = G.hd, ld = hd + 1;
    float *Qs = sm, *Ks = Qs + FWD_WARPS * hd, *Vs = Ks + TILE * ld;
    const int lane = threadIdx.x % MT_WARP, w = threadIdx.x / MT_WARP;
    const brow_t R = block_row(G);
    if (R.kmin > R.kmax)
        return; /* block-uniform: no row here sees this block */
    if (R.active)
        mt_att_load_row(Qs + w * hd, q + R.qoff, hd, G.scale, false);

    float o[MAX_R];
    for (int r = 0; r < MAX_R; r++)
        o[r] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t j0 = R.kmin; j0 <= R.kmax; j0 += TILE) {
        const int64_t nj = R.kmax + 1 - j0 < TILE ? R.kmax + 1 - j0 : TILE;
        __syncthreads(); /* the previous tile is no longer read */
        mt_att_load_tiles(Ks, Vs, k, v, j0 * G.kvs + R.g * hd, G.kvs, nj, hd, 1.0f, false);
        __syncthreads();
        if (!R.active)
            continue;
        const int64_t c = j0 + lane;
        mt_att_forward_tile(lane < nj && c >= R.lo && c <= R.hi, Qs + w * hd, Ks, Vs, (int)nj,
                            hd, m, l, o);
    }
    if (!R.active || m == -INFINITY)
        return; /* this row saw no key of the block: untouched */

    /* merge into the running (out, lse); lane 0 reads lse and writes it last */
    float *orow = out + R.qoff;
    float *lrow = lse + R.h * G.lse_stride + R.i;
    const float old = __shfl_sync(0xffffffffu, lane == 0 ? *lrow : 0.0f, 0);
    const float blse = m + logf(l);
    float nl = blse;
    if (old == -INFINITY) {
        mt_att_store_row(orow, o, 1.0f / l, hd, false);
    } else {
        const float mx = fmaxf(old, blse);
        nl = mx + logf(expf(old - mx) + expf(blse - mx));
        const float a = expf(old - nl), b = expf(blse - nl) / l;
        for (int r = 0; r < MAX_R; r++) {
            const int64_t d = lane + r * MT_WARP;
            if (d < hd)
                orow[d] = orow[d] * a + o[r] * b;
        }
    }
    if (lane == 0)
        *lrow = nl;
}

/* dq of FWD_WARPS query rows; the forward's layout plus dO [FWD_WARPS][hd] */
template <typename T>
__global__ void mt_k_attention_block_dq(float *dq, const T *dout, const float *lse,
                                        const float *D, const T *q, const T *k, const T *v,
                                        bgeom_t G)
{
    extern __shared__ float sm[];
    const int64_t hd = G.hd, ld = hd + 1;
    float *Qs = sm, *dO = Qs + FWD_WARPS * hd, *Ks = dO + FWD_WARPS * hd, *Vs = Ks + TILE * ld;
    const int lane = threadIdx.x % MT_WARP, w = threadIdx.x / MT_WARP;
    const brow_t R = block_row(G);
    if (R.kmin > R.kmax)
        return;
    float L = 0.0f, Dr = 0.0f;
    if (R.active) {
        mt_att_load_row(Qs + w * hd, q + R.qoff, hd, G.scale, false);
        mt_att_load_row(dO + w * hd, dout + R.qoff, hd, 1.0f, false);
        L = lse[R.h * G.lse_stride + R.i];
        Dr = D[R.h * G.nq + R.i];
    }
    float acc[MAX_R];
    for (int r = 0; r < MAX_R; r++)
        acc[r] = 0.0f;
    for (int64_t j0 = R.kmin; j0 <= R.kmax; j0 += TILE) {
        const int64_t nj = R.kmax + 1 - j0 < TILE ? R.kmax + 1 - j0 : TILE;
        __syncthreads();
        mt_att_load_tiles(Ks, Vs, k, v, j0 * G.kvs + R.g * hd, G.kvs, nj, hd, 1.0f, false);
        __syncthreads();
        if (!R.active)
            continue;
        const int64_t c = j0 + lane;
        mt_att_dq_tile(lane < nj && c >= R.lo && c <= R.hi, Qs + w * hd, dO + w * hd, Ks, Vs,
                       (int)nj, hd, L, Dr, acc);
    }
    if (!R.active || R.lo > R.hi)
        return; /* nothing to add */
    mt_att_store_row(dq + R.qoff, acc, G.scale, hd, true);
}

/* dk, dv of KV_WARPS key rows (g, c0 + warp).  Shared: own K and V rows
 * [KV_WARPS][hd]; query tiles Qs (scaled) and dO [TILE][hd + 1]; per
 * query L, D and first visible (global) key. */
template <typename T>
__global__ void mt_k_attention_block_dkdv(float *dk, float *dv, const T *dout,
                                          const float *lse, const float *D, const T *q,
                                          const T *k, const T *v, bgeom_t G)
{
    extern __shared__ float sm[];
    __shared__ float sL[TILE], sD[TILE];
    __shared__ int64_t sLo[TILE];
    const int64_t hd = G.hd, ld = hd + 1;
    float *Kr = sm, *Vr = Kr + KV_WARPS * hd, *Qs = Vr + KV_WARPS * hd, *dO = Qs + TILE * ld;
    const int lane = threadIdx.x % MT_WARP, w = threadIdx.x / MT_WARP;
    const int64_t g = blockIdx.y;
    const int64_t c0 = (int64_t)blockIdx.x * KV_WARPS, c = c0 + w, key = G.k0 + c;
    const bool active = c < G.nk;
    const int64_t kvoff = c * G.kvs + g * hd;
    float adk[MAX_R], adv[MAX_R];
    mt_att_key_row_init(Kr + w * hd, Vr + w * hd, k + kvoff, v + kvoff, hd, active, adk, adv,
                        false);
    bool seen = false;
    /* queries before the block's first key see none of its keys */
    const int64_t ifirst = G.k0 + c0 - G.q0 > 0 ? G.k0 + c0 - G.q0 : 0;

    for (int64_t hh = 0; hh < G.group; hh++) {
        const int64_t h = g * G.group + hh;
        for (int64_t qi0 = ifirst; qi0 < G.nq; qi0 += TILE) {
            const int64_t nqt = G.nq - qi0 < TILE ? G.nq - qi0 : TILE;
            __syncthreads(); /* the previous tile (and, first time, Kr/Vr) */
            mt_att_load_tiles(Qs, dO, q, dout, qi0 * G.qs + h * hd, G.qs, nqt, hd, G.scale, false);
            for (int64_t i = threadIdx.x; i < nqt; i += blockDim.x) {
                sL[i] = lse[h * G.lse_stride + qi0 + i];
                sD[i] = D[h * G.nq + qi0 + i];
                sLo[i] = first_key(G, qi0 + i);
            }
            __syncthreads();
            if (!active)
                continue;
            const bool vis = lane < nqt && G.q0 + qi0 + lane >= key && sLo[lane] <= key;
            seen |= mt_att_dkdv_tile(vis, Kr + w * hd, Vr + w * hd, Qs, dO, (int)nqt, hd,
                                     vis ? sL[lane] : 0.0f, vis ? sD[lane] : 0.0f, adk, adv);
        }
    }
    if (!__any_sync(0xffffffffu, seen) || !active)
        return; /* no query sees this key: nothing to add */
    mt_att_store_row(dk + kvoff, adk, 1.0f, hd, true);
    mt_att_store_row(dv + kvoff, adv, 1.0f, hd, true);
}

/* ------------------------------------------------------------------ launchers */

static bgeom_t make_bgeom(const char *kernel, const int32_t *doc_start, int64_t nq, int64_t nk,
                          int64_t q0, int64_t k0, int64_t nh, int64_t nkv, int64_t hd,
                          int64_t lse_stride)
{
    MT_CUDA_REQUIRE(nq >= 0 && nk >= 0 && q0 >= 0 && k0 >= 0 && nkv >= 1 && nh >= nkv &&
                        nh % nkv == 0 && lse_stride >= nq,
                    kernel, "nq=%lld nk=%lld q0=%lld k0=%lld nh=%lld nkv=%lld lse_stride=%lld",
                    (long long)nq, (long long)nk, (long long)q0, (long long)k0, (long long)nh,
                    (long long)nkv, (long long)lse_stride);
    MT_CUDA_REQUIRE(hd > 0 && hd <= MT_ATT_MAX_HD, kernel,
                    "head_dim=%lld, this kernel serves 1..%d", (long long)hd, MT_ATT_MAX_HD);
    MT_CUDA_REQUIRE(nh <= 65535 && (nq + FWD_WARPS - 1) / FWD_WARPS <= INT32_MAX &&
                        (nk + KV_WARPS - 1) / KV_WARPS <= INT32_MAX,
                    kernel, "grid: nh=%lld nq=%lld nk=%lld", (long long)nh, (long long)nq,
                    (long long)nk);
    bgeom_t G;
    G.nq = nq, G.nk = nk, G.q0 = q0, G.k0 = k0, G.nh = nh, G.nkv = nkv, G.hd = hd;
    G.group = nh / nkv, G.qs = nh * hd, G.kvs = nkv * hd, G.lse_stride = lse_stride;
    G.scale = (float)(1.0 / sqrt((double)hd));
    G.doc_start = doc_start;
    return G;
}

template <typename T>
static void block_forward(cudaStream_t s, float *out, float *lse, int64_t lse_stride, const T *q,
                          const T *k, const T *v, const int32_t *doc_start, int64_t nq,
                          int64_t nk, int64_t q0, int64_t k0, int64_t nh, int64_t nkv, int64_t hd)
{
    const bgeom_t G = make_bgeom("attention_block_forward", doc_start, nq, nk, q0, k0, nh, nkv,
                                 hd, lse_stride);
    if (nq == 0 || nk == 0)
        return;
    const size_t smem = (size_t)(FWD_WARPS * hd + 2 * TILE * (hd + 1)) * sizeof(float);
    dim3 grid((unsigned)((nq + FWD_WARPS - 1) / FWD_WARPS), (unsigned)nh);
    mt_k_attention_block_forward<T><<<grid, FWD_WARPS * MT_WARP, smem, s>>>(out, lse, q, k, v, G);
    MT_CUDA_LAUNCH_CHECK("attention_block_forward");
}

extern "C" void mt_cuda_launch_attention_block_forward(cudaStream_t s, float *out, float *lse,
                                                       int64_t lse_stride, const float *q,
                                                       const float *k, const float *v,
                                                       const int32_t *doc_start, int64_t nq,
                                                       int64_t nk, int64_t q0, int64_t k0,
                                                       int64_t nh, int64_t nkv, int64_t hd)
{
    block_forward<float>(s, out, lse, lse_stride, q, k, v, doc_start, nq, nk, q0, k0, nh, nkv, hd);
}

/* bf16 storage: q, k, v bf16 bits (exact loads), out float32 (the merge) */
extern "C" void mt_cuda_launch_attention_block_forward_bf16s(
    cudaStream_t s, float *out, float *lse, int64_t lse_stride, const uint16_t *q,
    const uint16_t *k, const uint16_t *v, const int32_t *doc_start, int64_t nq, int64_t nk,
    int64_t q0, int64_t k0, int64_t nh, int64_t nkv, int64_t hd)
{
    block_forward<__nv_bfloat16>(s, out, lse, lse_stride, (const __nv_bfloat16 *)q,
                                 (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, doc_start, nq,
                                 nk, q0, k0, nh, nkv, hd);
}

/* D = dout . out per (head, query) of the block: the dense rowdot with
 * B = 1, T = nq, on float32 or bf16 bits */
static void block_rowdot(cudaStream_t s, float *D, const float *dout, const float *out,
                         int64_t nq, int64_t nh, int64_t hd)
{
    mt_cuda_launch_attention_rowdot(s, D, dout, out, 1, nq, nh, hd, false);
}
static void block_rowdot(cudaStream_t s, float *D, const __nv_bfloat16 *dout,
                         const __nv_bfloat16 *out, int64_t nq, int64_t nh, int64_t hd)
{
    mt_cuda_launch_attention_rowdot_bf16s(s, D, (const uint16_t *)dout, (const uint16_t *)out, 1,
                                          nq, nh, hd);
}

template <typename T>
static void block_backward(cudaStream_t s, float *dq, float *dk, float *dv, const T *dout,
                           const T *out, const float *lse, int64_t lse_stride, const T *q,
                           const T *k, const T *v, const int32_t *doc_start, int64_t nq,
                           int64_t nk, int64_t q0, int64_t k0, int64_t nh, int64_t nkv,
                           int64_t hd)
{
    const bgeom_t G = make_bgeom("attention_block_backward", doc_start, nq, nk, q0, k0, nh, nkv,
                                 hd, lse_stride);
    if (nq == 0 || nk == 0)
        return;
    float *D = (float *)mt_cuda_scratch("attention_block_backward",
                                        (size_t)(nh * nq) * sizeof(float));
    block_rowdot(s, D, dout, out, nq, nh, hd); /* D[h * nq + i] */

    const size_t smem_dq = (size_t)(2 * FWD_WARPS * hd + 2 * TILE * (hd + 1)) * sizeof(float);
    dim3 gq((unsigned)((nq + FWD_WARPS - 1) / FWD_WARPS), (unsigned)nh);
    mt_k_attention_block_dq<T><<<gq, FWD_WARPS * MT_WARP, smem_dq, s>>>(dq, dout, lse, D, q, k,
                                                                         v, G);
    MT_CUDA_LAUNCH_CHECK("attention_block_dq");

    const size_t smem_kv = (size_t)(2 * KV_WARPS * hd + 2 * TILE * (hd + 1)) * sizeof(float);
    dim3 gk((unsigned)((nk + KV_WARPS - 1) / KV_WARPS), (unsigned)nkv);
    mt_k_attention_block_dkdv<T><<<gk, KV_WARPS * MT_WARP, smem_kv, s>>>(dk, dv, dout, lse, D, q,
                                                                          k, v, G);
    MT_CUDA_LAUNCH_CHECK("attention_block_dkdv");
}

extern "C" void mt_cuda_launch_attention_block_backward(
    cudaStream_t s, float *dq, float *dk, float *dv, const float *dout, const float *out,
    const float *lse, int64_t lse_stride, const float *q, const float *k, const float *v,
    const int32_t *doc_start, int64_t nq, int64_t nk, int64_t q0, int64_t k0, int64_t nh,
    int64_t nkv, int64_t hd)
{
    block_backward<float>(s, dq, dk, dv, dout, out, lse, lse_stride, q, k, v, doc_start, nq, nk,
                          q0, k0, nh, nkv, hd);
}

/* bf16 storage: dout, out, q, k, v bf16 bits; dq, dk, dv float32 (sums) */
extern "C" void mt_cuda_launch_attention_block_backward_bf16s(
    cudaStream_t s, float *dq, float *dk, float *dv, const uint16_t *dout, const uint16_t *out,
    const float *lse, int64_t lse_stride, const uint16_t *q, const uint16_t *k, const uint16_t *v,
    const int32_t *doc_start, int64_t nq, int64_t nk, int64_t q0, int64_t k0, int64_t nh,
    int64_t nkv, int64_t hd)
{
    typedef const __nv_bfloat16 *P;
    block_backward<__nv_bfloat16>(s, dq, dk, dv, (P)dout, (P)out, lse, lse_stride, (P)q, (P)k,
                                  (P)v, doc_start, nq, nk, q0, k0, nh, nkv, hd);
}
