/* cuda_embedding.cu: token embedding of the CUDA backend, forward and
 * backward.
 *
 * The backward is deterministic without atomics and without knowing the
 * vocabulary size: the (token, position) pairs are sorted by token with
 * CUB's radix sort, which is stable, so each token's positions stay in
 * order; then one block per distinct token walks its positions in order
 * and adds the gradient rows to its dtable row column by column.  Each
 * dtable element therefore receives dtable + dout[i0] + dout[i1] + ... in
 * token order: exactly the CPU backend's additions, the same bits.
 * Scratch (device, from the backend): 4 int32 per token plus CUB's
 * temporary storage.  Token -1 (another vocabulary shard's) gives a zero
 * row forward and is skipped backward; a token below -1 traps the kernel.
 * The _bf16s launchers (bf16 storage) take the table, out and dout as bf16
 * bits: rows copied, gradients widened exactly, dtable float32. */
#include <cub/device/device_radix_sort.cuh>
#include <limits.h>

#include "cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

/* T: float, or __nv_bfloat16 (bf16 storage: the rows' bits copied) */
template <typename T>
__global__ void mt_k_embedding_forward(T *out, const int32_t *tokens, const T *table,
                                       int64_t n_tokens, int64_t dim)
{
    for (int64_t i = blockIdx.x; i < n_tokens; i += gridDim.x) {
        const int32_t tok = tokens[i];
        if (tok < -1) {
            if (threadIdx.x == 0)
                printf("meshtrain cuda embedding_forward: tokens[%lld] = %d\n", (long long)i, tok);
            __trap();
        }
        T *o = out + i * dim;
        if (tok == -1) /* another vocabulary shard's token */
            for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
                mt_st(o, c, 0.0f);
        else
            for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
                o[c] = table[(int64_t)tok * dim + c];
    }
}

__global__ void mt_k_iota(int32_t *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = (int32_t)i;
}

/* one block per sorted position; the first position of each token's run
 * owns that token's dtable row */
template <typename T>
__global__ void mt_k_embedding_backward(float *dtable, const T *dout, const int32_t *key,
                                        const int32_t *idx, int64_t n_tokens, int64_t dim)
{
    for (int64_t p = blockIdx.x; p < n_tokens; p += gridDim.x) {
        const int32_t tok = key[p];
        if (tok < 0 || (p > 0 && key[p - 1] == tok))
            continue;
        float *dst = dtable + (int64_t)tok * dim;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            float acc = dst[c];
            for (int64_t q = p; q < n_tokens && key[q] == tok; q++)
                acc += mt_ld(dout, (int64_t)idx[q] * dim + c);
            dst[c] = acc;
        }
    }
}

/* ------------------------------------------------------------------ launchers */

template <typename T>
static void embedding_forward(cudaStream_t s, T *out, const int32_t *tokens, const T *table,
                              int64_t n_tokens, int64_t dim)
{
    MT_CUDA_REQUIRE(n_tokens >= 0 && dim > 0, "embedding_forward", "n_tokens=%lld dim=%lld",
                    (long long)n_tokens, (long long)dim);
    if (n_tokens == 0)
        return;
    const unsigned blocks = n_tokens < 65535 * 8 ? (unsigned)n_tokens : 65535 * 8;
    mt_k_embedding_forward<T><<<blocks, dim >= 256 ? 256 : 64, 0, s>>>(out, tokens, table,
                                                                      n_tokens, dim);
    MT_CUDA_LAUNCH_CHECK("embedding_forward");
}

template <typename T>
static void embedding_backward(cudaStream_t s, float *dtable, const T *dout,
                               const int32_t *tokens, int64_t n_tokens, int64_t dim)
{
    MT_CUDA_REQUIRE(n_tokens >= 0 && n_tokens <= INT_MAX && dim > 0, "embedding_backward",
                    "n_tokens=%lld dim=%lld", (long long)n_tokens, (long long)dim);
    if (n_tokens == 0)
        return;
    const int n = (int)n_tokens;
    size_t temp_bytes = 0;
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, (const int32_t *)nullptr,
                                                  (int32_t *)nullptr, (const int32_t *)nullptr,
                                                  (int32_t *)nullptr, n, 0, 32, s));
    const size_t ints = ((size_t)n * 3 + 63) / 64 * 64; /* 256-byte aligned temp after them */
    char *scratch = (char *)mt_cuda_scratch("embedding_backward",
                                            ints * sizeof(int32_t) + temp_bytes);
    int32_t *key = (int32_t *)scratch, *idx_in = key + n, *idx = idx_in + n;
    void *temp = scratch + ints * sizeof(int32_t);
    mt_k_iota<<<mt_cuda_blocks(n, 256), 256, 0, s>>>(idx_in, n);
    MT_CUDA_LAUNCH_CHECK("iota");
    /* signed keys: CUB orders them numerically, -1 first */
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, key, idx_in, idx, n, 0,
                                                  32, s));
    const unsigned blocks = n < 65535 * 8 ? (unsigned)n : 65535 * 8;
    mt_k_embedding_backward<T><<<blocks, dim >= 256 ? 256 : 64, 0, s>>>(dtable, dout, key, idx,
                                                                       n_tokens, dim);
    MT_CUDA_LAUNCH_CHECK("embedding_backward");
}

extern "C" void mt_cuda_launch_embedding_forward(cudaStream_t s, float *out,
                                                 const int32_t *tokens, const float *table,
                                                 int64_t n_tokens, int64_t dim)
{
    embedding_forward(s, out, tokens, table, n_tokens, dim);
}

extern "C" void mt_cuda_launch_embedding_backward(cudaStream_t s, float *dtable,
                                                  const float *dout, const int32_t *tokens,
                                                  int64_t n_tokens, int64_t dim)
{
    embedding_backward(s, dtable, dout, tokens, n_tokens, dim);
}

/* bf16 storage: table, out and dout bf16 bits; dtable float32 */
extern "C" void mt_cuda_launch_embedding_forward_bf16s(cudaStream_t s, uint16_t *out,
                                                       const int32_t *tokens,
                                                       const uint16_t *table, int64_t n_tokens,
                                                       int64_t dim)
{
    embedding_forward(s, (__nv_bfloat16 *)out, tokens, (const __nv_bfloat16 *)table, n_tokens,
                      dim);
}

extern "C" void mt_cuda_launch_embedding_backward_bf16s(cudaStream_t s, float *dtable,
                                                        const uint16_t *dout,
                                                        const int32_t *tokens, int64_t n_tokens,
                                                        int64_t dim)
{
    embedding_backward(s, dtable, (const __nv_bfloat16 *)dout, tokens, n_tokens, dim);
}
