/* cuda_moe.cu: mixture-of-experts token permutation of the CUDA backend:
 * routing (the expert-sorted position of every (token, k) assignment),
 * permute (gather token rows into expert order), unpermute (the weighted
 * combine back) and the unpermute's backward.  No CPU counterpart exists
 * in mt_backend.h yet; tests/test_cuda_kernels.c checks these against a
 * plain host loop.
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

__global__ void mt_k_moe_unpermute(float *y, const float *e, const int32_t *pos, const float *w,
                                   int64_t n_tokens, int64_t top_k, int64_t dim)
{
    for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x)
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            float acc = 0.0f;
            for (int64_t kk = 0; kk < top_k; kk++) {
                const int64_t a = t * top_k + kk;
                acc += (w ? w[a] : 1.0f) * e[(int64_t)pos[a] * dim + c];
            }
            y[t * dim + c] = acc;
        }
}

__global__ void mt_k_moe_unpermute_backward(float *de, float *dw, const float *dy, const float *e,
                                            const int32_t *pos, const float *w, int64_t n_assign,
                                            int64_t top_k, int64_t dim)
{
    __shared__ float buf[MT_WARP];
    for (int64_t a = blockIdx.x; a < n_assign; a += gridDim.x) {
        const float *g = dy + (a / top_k) * dim;
        const int64_t row = (int64_t)pos[a] * dim;
        const float wa = w ? w[a] : 1.0f;
        float dot = 0.0f;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            dot += g[c] * e[row + c];
            de[row + c] = wa * g[c];
        }
        if (dw) {
            dot = mt_block_sum(dot, buf);
            if (threadIdx.x == 0)
                dw[a] = dot;
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
    MT_CUDA_REQUIRE(n_tokens >= 0 && top_k > 0 && dim > 0, kernel,                           \
                    "n_tokens=%lld top_k=%lld dim=%lld", (long long)n_tokens, (long long)top_k, \
                    (long long)dim)

extern "C" void mt_cuda_launch_moe_permute(cudaStream_t s, float *out, const float *x,
                                           const int32_t *pos, int64_t n_tokens, int64_t top_k,
                                           int64_t dim)
{
    REQUIRE_MOE("moe_permute");
    if (n_tokens == 0)
        return;
    mt_k_moe_permute<<<row_blocks(n_tokens * top_k), 256, 0, s>>>(out, x, pos, n_tokens * top_k,
                                                                  top_k, dim);
    MT_CUDA_LAUNCH_CHECK("moe_permute");
}

extern "C" void mt_cuda_launch_moe_unpermute(cudaStream_t s, float *y, const float *e,
                                             const int32_t *pos, const float *w,
                                             int64_t n_tokens, int64_t top_k, int64_t dim)
{
    REQUIRE_MOE("moe_unpermute");
    if (n_tokens == 0)
        return;
    mt_k_moe_unpermute<<<row_blocks(n_tokens), 256, 0, s>>>(y, e, pos, w, n_tokens, top_k, dim);
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
    mt_k_moe_unpermute_backward<<<row_blocks(n_tokens * top_k), 256, 0, s>>>(
        de, dw, dy, e, pos, w, n_tokens * top_k, top_k, dim);
    MT_CUDA_LAUNCH_CHECK("moe_unpermute_backward");
}
