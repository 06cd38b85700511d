/* cuda_moe.cu: the mixture-of-experts kernels of the CUDA backend.
 * Two sets:
 *  - the backend table's entries, with kernels_cpu_moe.c's contract: the
 *    router (softmax, top-k with bias, optional renormalisation) and its
 *    backward, the row gather, the combine (moe_combine, skipping dropped
 *    slots, slot_row -1) and its backward;
 *  - mt_cuda.h's device-side permutation: routing (the expert-sorted
 *    position of every (token, k) assignment), permute, unpermute and its
 *    backward, checked against host loops.  The table's combine and its
 *    backward are the unpermute kernels with a residual and dropped slots.
 *
 * The router runs a warp per token row.  Softmax in double like the CPU
 * (max, sum of exp in double, each probability rounded once to float; the
 * sum is a warp tree instead of the CPU's sequential one, 1e-16 apart
 * before that rounding).  Top-k is k warp arg-max reductions under the
 * strict total order "score descending, then index ascending" (score =
 * prob + bias): pick j is the best candidate strictly after pick j-1 in
 * that order, so no taken-set is kept and ties go to the LOWEST index as
 * on the CPU.  A NaN score sorts as -inf (the CPU's result is then
 * order-dependent; here it is at least k distinct in-range experts).  The
 * renormalisation and the backward's sums over the k picks run in the
 * CPU's order, in double.
 *
 * Routing is a stable counting sort without atomics: one block per expert
 * counts its assignments, one thread turns the counts into offsets, and
 * one block per expert walks the assignments in index order, ranking its
 * own with warp ballots: positions are exact and the same on every run.
 * Each block reads all assignments, so the cost is n_experts * n_assign
 * reads: fine at 8-256 experts, a CUB-style single pass is a later
 * optimisation.  The combine adds the top_k terms in k order. */
#include "cuda_common.cuh"

#define ROUTE_THREADS 1024
#define ROW_THREADS 256 /* router: 8 warps, a token row each */

/* ------------------------------------------------------------------ kernels */

__global__ void mt_k_moe_count(int32_t *offsets, const int32_t *expert, int64_t n, int64_t E)
{
    __shared__ int64_t buf[MT_WARP];
    const int64_t e = blockIdx.x;
    int64_t c = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const int32_t x = expert[i];
        if (e == 0 && (x < 0 || x >= E)) {
            printf("meshtrain cuda moe_route: expert[%lld] = %d, outside [0, %lld)\n",
                   (long long)i, x, (long long)E);
            __trap();
        }
        c += x == e;
    }
    c = mt_block_sum(c, buf);
    if (threadIdx.x == 0)
        offsets[e + 1] = (int32_t)c;
}

__global__ void mt_k_moe_scan(int32_t *offsets, int64_t E)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        offsets[0] = 0;
        for (int64_t e = 0; e < E; e++)
            offsets[e + 1] += offsets[e];
    }
}

__global__ void mt_k_moe_pos(int32_t *pos, const int32_t *expert, const int32_t *offsets,
                             int64_t n)
{
    __shared__ int wc[MT_WARP];
    const int32_t e = (int32_t)blockIdx.x;
    const int lane = threadIdx.x % MT_WARP, w = threadIdx.x / MT_WARP;
    const int nwarps = blockDim.x / MT_WARP;
    const unsigned lt_mask = (1u << lane) - 1u;
    int64_t base = offsets[e];
    for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
        const int64_t i = c0 + threadIdx.x;
        const bool mine = i < n && expert[i] == e;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        __syncthreads(); /* wc of the previous chunk is no longer read */
        if (lane == 0)
            wc[w] = __popc(ballot);
        __syncthreads();
        int64_t before = 0, total = 0;
        for (int x = 0; x < nwarps; x++) {
            before += x < w ? wc[x] : 0;
            total += wc[x];
        }
        if (mine)
            pos[i] = (int32_t)(base + before + __popc(ballot & lt_mask));
        base += total;
    }
}

__global__ void mt_k_moe_permute(float *out, const float *x, const int32_t *pos, int64_t n_assign,
                                 int64_t top_k, int64_t dim)
{
    for (int64_t a = blockIdx.x; a < n_assign; a += gridDim.x) {
        const float *src = x + (a / top_k) * dim;
        float *dst = out + (int64_t)pos[a] * dim;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
            dst[c] = src[c];
    }
}

/* y[t] = res[t] (0 if NULL) + sum over kk in order of w * e[pos]; pos -1
 * (a dropped slot) adds nothing.  y may alias res.  A block per token.
 * y is float32; res and e are T (bf16 bits under bf16 storage). */
template <typename T>
__global__ void mt_k_moe_unpermute(float *y, const T *res, const T *e, const int32_t *pos,
                                   const float *w, int64_t n_tokens, int64_t top_k, int64_t dim)
{
    for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x)
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            float acc = res ? mt_ld(res, t * dim + c) : 0.0f;
            for (int64_t kk = 0; kk < top_k; kk++) {
                const int64_t a = t * top_k + kk;
                if (pos[a] >= 0)
                    acc += (w ? w[a] : 1.0f) * mt_ld(e, (int64_t)pos[a] * dim + c);
            }
            y[t * dim + c] = acc;
        }
}

/* de[pos[a]] = w[a] dy[token]; dw[a] = dy[token] . e[pos[a]] (double sum,
 * one rounding); pos -1: dw 0, no row.  A block per assignment.  de, dy
 * and e are T (bf16 storage: de rounded as stored), dw float32. */
template <typename T>
__global__ void mt_k_moe_unpermute_backward(T *de, float *dw, const T *dy, const T *e,
                                            const int32_t *pos, const float *w, int64_t n_assign,
                                            int64_t top_k, int64_t dim)
{
    __shared__ double buf[MT_WARP];
    for (int64_t a = blockIdx.x; a < n_assign; a += gridDim.x) {
        if (pos[a] < 0) { /* block-uniform */
            if (dw && threadIdx.x == 0)
                dw[a] = 0.0f;
            continue;
        }
        const int64_t grow = (a / top_k) * dim;
        const int64_t row = (int64_t)pos[a] * dim;
        const float wa = w ? w[a] : 1.0f;
        double dot = 0.0;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            const float gc = mt_ld(dy, grow + c);
            dot += (double)gc * (double)mt_ld(e, row + c);
            mt_st(de, row + c, wa * gc);
        }
        if (dw) {
            dot = mt_block_sum(dot, buf);
            if (threadIdx.x == 0)
                dw[a] = (float)dot;
        }
    }
}

/* dst[i] = src[rows[i]]; a block per row; rows of T */
template <typename T>
__global__ void mt_k_moe_gather_rows(T *dst, const T *src, const int32_t *rows, int64_t n,
                                     int64_t width)
{
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const T *s = src + (int64_t)rows[i] * width;
        for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
            dst[i * width + c] = s[c];
    }
}

/* (s, e) before (bs, be) in the top-k order: score descending, index ascending */
__device__ __forceinline__ bool topk_before(float s, int32_t e, float bs, int32_t be)
{
    return s > bs || (s == bs && e < be);
}

/* A warp per token row: softmax in place, then k arg-max reductions. */
__global__ void mt_k_moe_router_forward(float *probs, int32_t *idx, float *w, const float *bias,
                                        int64_t n, int64_t E, int64_t k, bool norm_topk)
{
    const int lane = threadIdx.x % MT_WARP;
    const int64_t wstride = (int64_t)gridDim.x * blockDim.x / MT_WARP;
    for (int64_t t = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / MT_WARP; t < n;
         t += wstride) {
        float *p = probs + t * E;
        float mx = -INFINITY;
        for (int64_t e = lane; e < E; e += MT_WARP)
            mx = fmaxf(mx, p[e]);
        mx = mt_warp_max(mx);
        double z = 0.0;
        for (int64_t e = lane; e < E; e += MT_WARP)
            z += exp((double)p[e] - (double)mx);
        z = mt_warp_sum(z);
        for (int64_t e = lane; e < E; e += MT_WARP) /* each lane rewrites only its own */
            p[e] = (float)(exp((double)p[e] - (double)mx) / z);
        __syncwarp(); /* every lane reads every probability below */

        float prev_s = 0.0f;
        int32_t prev = -1;
        double sum = 0.0;
        for (int64_t j = 0; j < k; j++) {
            float bs = -INFINITY;
            int32_t be = INT32_MAX; /* none: after every real candidate */
            for (int64_t e = lane; e < E; e += MT_WARP) {
                float s = bias ? p[e] + bias[e] : p[e];
                s = s != s ? -INFINITY : s;
                const bool after = prev < 0 || topk_before(prev_s, prev, s, (int32_t)e);
                if (after && topk_before(s, (int32_t)e, bs, be))
                    bs = s, be = (int32_t)e;
            }
            for (int o = MT_WARP / 2; o > 0; o >>= 1) {
                const float os = __shfl_xor_sync(0xffffffffu, bs, o);
                const int32_t oe = __shfl_xor_sync(0xffffffffu, be, o);
                if (topk_before(os, oe, bs, be))
                    bs = os, be = oe;
            }
            prev_s = bs, prev = be;
            sum += p[be];
            if (lane == 0) {
                idx[t * k + j] = be;
                w[t * k + j] = p[be];
            }
        }
        if (norm_topk && lane == 0)
            for (int64_t j = 0; j < k; j++)
                w[t * k + j] = (float)((double)w[t * k + j] / sum);
    }
}

/* dl of expert e: dp_all + the routing-weight terms of the selected
 * experts (c, s: the norm_topk sums) */
__device__ __forceinline__ float router_dl(int64_t e, const float *dp_all, const int32_t *it,
                                           const float *dwt, int64_t k, bool norm_topk, double c,
                                           double s)
{
    float d = dp_all ? dp_all[e] : 0.0f;
    for (int64_t j = 0; j < k; j++)
        if (it[j] == e)
            d += norm_topk ? (float)(((double)dwt[j] - c) / s) : dwt[j];
    return d;
}

/* A warp per token row: dl = dp_all + the routing-weight terms of the
 * selected experts, then the softmax backward p (dl - p . dl).  dlogits
 * is T (bf16 storage: rounded as stored; dl is formed again for the
 * second pass, never read back). */
template <typename T>
__global__ void mt_k_moe_router_backward(T *dlogits, const float *dw, const float *probs,
                                         const int32_t *idx, const float *w, const float *dp_all,
                                         int64_t n, int64_t E, int64_t k, bool norm_topk)
{
    const int lane = threadIdx.x % MT_WARP;
    const int64_t wstride = (int64_t)gridDim.x * blockDim.x / MT_WARP;
    for (int64_t t = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / MT_WARP; t < n;
         t += wstride) {
        const float *p = probs + t * E, *dwt = dw + t * k;
        const int32_t *it = idx + t * k;
        T *dl = dlogits + t * E;
        double s = 0.0, c = 0.0; /* every lane, in the CPU's order */
        for (int64_t j = 0; j < k; j++) {
            if (it[j] < 0 || it[j] >= E) {
                printf("meshtrain cuda moe_router_backward: idx[%lld] = %d, outside [0, %lld)\n",
                       (long long)(t * k + j), it[j], (long long)E);
                __trap();
            }
            if (norm_topk) {
                s += p[it[j]];
                c += (double)dwt[j] * (double)w[t * k + j];
            }
        }
        double dot = 0.0;
        for (int64_t e = lane; e < E; e += MT_WARP)
            dot += (double)p[e] * (double)router_dl(e, dp_all, it, dwt, k, norm_topk, c, s);
        dot = mt_warp_sum(dot);
        for (int64_t e = lane; e < E; e += MT_WARP) {
            const float d = router_dl(e, dp_all, it, dwt, k, norm_topk, c, s);
            mt_st(dl, e, (float)((double)p[e] * ((double)d - dot)));
        }
    }
}

/* ------------------------------------------------------------------ launchers */

static unsigned row_blocks(int64_t n) { return n < 65535 * 16 ? (unsigned)n : 65535 * 16; }

extern "C" void mt_cuda_launch_moe_route(cudaStream_t s, int32_t *pos, int32_t *offsets,
                                         const int32_t *expert, int64_t n_assign,
                                         int64_t n_experts)
{
    MT_CUDA_REQUIRE(n_assign >= 0 && n_assign <= INT32_MAX && n_experts > 0 &&
                        n_experts <= 65535,
                    "moe_route", "n_assign=%lld n_experts=%lld", (long long)n_assign,
                    (long long)n_experts);
    mt_k_moe_count<<<(unsigned)n_experts, ROUTE_THREADS, 0, s>>>(offsets, expert, n_assign,
                                                                  n_experts);
    MT_CUDA_LAUNCH_CHECK("moe_count");
    mt_k_moe_scan<<<1, 32, 0, s>>>(offsets, n_experts);
    MT_CUDA_LAUNCH_CHECK("moe_scan");
    if (n_assign == 0)
        return;
    mt_k_moe_pos<<<(unsigned)n_experts, ROUTE_THREADS, 0, s>>>(pos, expert, offsets, n_assign);
    MT_CUDA_LAUNCH_CHECK("moe_pos");
}

#define REQUIRE_MOE(kernel)                                                                  \
    MT_CUDA_REQUIRE(n_tokens >= 0 && top_k > 0 && dim >= 0, kernel,                          \
                    "n_tokens=%lld top_k=%lld dim=%lld", (long long)n_tokens, (long long)top_k, \
                    (long long)dim)

extern "C" void mt_cuda_launch_moe_permute(cudaStream_t s, float *out, const float *x,
                                           const int32_t *pos, int64_t n_tokens, int64_t top_k,
                                           int64_t dim)
{
    REQUIRE_MOE("moe_permute");
    if (n_tokens == 0 || dim == 0)
        return;
    mt_k_moe_permute<<<row_blocks(n_tokens * top_k), 256, 0, s>>>(out, x, pos, n_tokens * top_k,
                                                                  top_k, dim);
    MT_CUDA_LAUNCH_CHECK("moe_permute");
}

extern "C" void mt_cuda_launch_moe_unpermute(cudaStream_t s, float *y, const float *res,
                                             const float *e, const int32_t *pos, const float *w,
                                             int64_t n_tokens, int64_t top_k, int64_t dim)
{
    REQUIRE_MOE("moe_unpermute");
    if (n_tokens == 0 || dim == 0)
        return;
    mt_k_moe_unpermute<float><<<row_blocks(n_tokens), 256, 0, s>>>(y, res, e, pos, w, n_tokens,
                                                                   top_k, dim);
    MT_CUDA_LAUNCH_CHECK("moe_unpermute");
}

extern "C" void mt_cuda_launch_moe_unpermute_backward(cudaStream_t s, float *de, float *dw,
                                                      const float *dy, const float *e,
                                                      const int32_t *pos, const float *w,
                                                      int64_t n_tokens, int64_t top_k,
                                                      int64_t dim)
{
    REQUIRE_MOE("moe_unpermute_backward");
    if (n_tokens == 0)
        return;
    mt_k_moe_unpermute_backward<float><<<row_blocks(n_tokens * top_k), 256, 0, s>>>(
        de, dw, dy, e, pos, w, n_tokens * top_k, top_k, dim);
    MT_CUDA_LAUNCH_CHECK("moe_unpermute_backward");
}

extern "C" void mt_cuda_launch_moe_gather_rows(cudaStream_t s, float *dst, const float *src,
                                               const int32_t *rows, int64_t n, int64_t width)
{
    MT_CUDA_REQUIRE(n >= 0 && width >= 0, "moe_gather_rows", "n=%lld width=%lld", (long long)n,
                    (long long)width);
    if (n == 0 || width == 0)
        return;
    mt_k_moe_gather_rows<float><<<row_blocks(n), 256, 0, s>>>(dst, src, rows, n, width);
    MT_CUDA_LAUNCH_CHECK("moe_gather_rows");
}

/* a thread per expert, its column's rows in order onto its running total:
 * the CPU's sum, bit for bit (E threads of n dependent double adds: tens of microseconds at
 * 8192 tokens, against copying [n, E] floats to the host) */
__global__ void mt_k_moe_prob_sums(double *sums, const float *probs, int64_t n, int64_t E)
{
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E)
        return;
    double s = sums[e];
    for (int64_t t = 0; t < n; t++)
        s += (double)probs[t * E + e];
    sums[e] = s;
}

extern "C" void mt_cuda_launch_moe_prob_sums(cudaStream_t s, double *sums, const float *probs,
                                             int64_t n, int64_t E)
{
    MT_CUDA_REQUIRE(n >= 0 && E >= 1, "moe_prob_sums", "n=%lld E=%lld", (long long)n,
                    (long long)E);
    mt_k_moe_prob_sums<<<mt_cuda_blocks(E, 128), 128, 0, s>>>(sums, probs, n, E);
    MT_CUDA_LAUNCH_CHECK("moe_prob_sums");
}

#define REQUIRE_ROUTER(kernel)                                                                \
    MT_CUDA_REQUIRE(n >= 0 && k >= 1 && k <= E && E <= INT32_MAX, kernel,                     \
                    "n=%lld E=%lld k=%lld (1 <= k <= E)", (long long)n, (long long)E,          \
                    (long long)k)

extern "C" void mt_cuda_launch_moe_router_forward(cudaStream_t s, float *probs, int32_t *idx,
                                                  float *w, const float *bias, int64_t n,
                                                  int64_t E, int64_t k, bool norm_topk)
{
    REQUIRE_ROUTER("moe_router_forward");
    if (n == 0)
        return;
    mt_k_moe_router_forward<<<mt_cuda_blocks(n * MT_WARP, ROW_THREADS), ROW_THREADS, 0, s>>>(
        probs, idx, w, bias, n, E, k, norm_topk);
    MT_CUDA_LAUNCH_CHECK("moe_router_forward");
}

extern "C" void mt_cuda_launch_moe_router_backward(cudaStream_t s, float *dlogits,
                                                   const float *dw, const float *probs,
                                                   const int32_t *idx, const float *w,
                                                   const float *dp_all, int64_t n, int64_t E,
                                                   int64_t k, bool norm_topk)
{
    REQUIRE_ROUTER("moe_router_backward");
    if (n == 0)
        return;
    mt_k_moe_router_backward<float><<<mt_cuda_blocks(n * MT_WARP, ROW_THREADS), ROW_THREADS, 0,
                                       s>>>(dlogits, dw, probs, idx, w, dp_all, n, E, k,
                                            norm_topk);
    MT_CUDA_LAUNCH_CHECK("moe_router_backward");
}

/* ------------------------------------------------ bf16 storage (_bf16s) */

typedef __nv_bfloat16 bf16_t;

/* dlogits as bf16 bits (rounded as stored) */
extern "C" void mt_cuda_launch_moe_router_backward_bf16s(cudaStream_t s, uint16_t *dlogits,
                                                         const float *dw, const float *probs,
                                                         const int32_t *idx, const float *w,
                                                         const float *dp_all, int64_t n,
                                                         int64_t E, int64_t k, bool norm_topk)
{
    REQUIRE_ROUTER("moe_router_backward");
    if (n == 0)
        return;
    mt_k_moe_router_backward<bf16_t><<<mt_cuda_blocks(n * MT_WARP, ROW_THREADS), ROW_THREADS, 0,
                                        s>>>((bf16_t *)dlogits, dw, probs, idx, w, dp_all, n, E,
                                             k, norm_topk);
    MT_CUDA_LAUNCH_CHECK("moe_router_backward");
}

/* rows of bf16 bits */
extern "C" void mt_cuda_launch_moe_gather_rows_bf16s(cudaStream_t s, uint16_t *dst,
                                                     const uint16_t *src, const int32_t *rows,
                                                     int64_t n, int64_t width)
{
    MT_CUDA_REQUIRE(n >= 0 && width >= 0, "moe_gather_rows", "n=%lld width=%lld", (long long)n,
                    (long long)width);
    if (n == 0 || width == 0)
        return;
    mt_k_moe_gather_rows<bf16_t><<<row_blocks(n), 256, 0, s>>>((bf16_t *)dst, (const bf16_t *)src,
                                                               rows, n, width);
    MT_CUDA_LAUNCH_CHECK("moe_gather_rows");
}

/* res and e bf16 bits, y float32 (the sum the shared experts add to) */
extern "C" void mt_cuda_launch_moe_unpermute_bf16s(cudaStream_t s, float *y, const uint16_t *res,
                                                   const uint16_t *e, const int32_t *pos,
                                                   const float *w, int64_t n_tokens,
                                                   int64_t top_k, int64_t dim)
{
    REQUIRE_MOE("moe_unpermute");
    if (n_tokens == 0 || dim == 0)
        return;
    mt_k_moe_unpermute<bf16_t><<<row_blocks(n_tokens), 256, 0, s>>>(
        y, (const bf16_t *)res, (const bf16_t *)e, pos, w, n_tokens, top_k, dim);
    MT_CUDA_LAUNCH_CHECK("moe_unpermute");
}

/* de, dy, e bf16 bits; dw float32 */
extern "C" void mt_cuda_launch_moe_unpermute_backward_bf16s(cudaStream_t s, uint16_t *de,
                                                            float *dw, const uint16_t *dy,
                                                            const uint16_t *e, const int32_t *pos,
                                                            const float *w, int64_t n_tokens,
                                                            int64_t top_k, int64_t dim)
{
    REQUIRE_MOE("moe_unpermute_backward");
    if (n_tokens == 0)
        return;
    mt_k_moe_unpermute_backward<bf16_t><<<row_blocks(n_tokens * top_k), 256, 0, s>>>(
        (bf16_t *)de, dw, (const bf16_t *)dy, (const bf16_t *)e, pos, w, n_tokens * top_k, top_k,
        dim);
    MT_CUDA_LAUNCH_CHECK("moe_unpermute_backward");
}
