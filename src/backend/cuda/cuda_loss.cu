/* cuda_loss.cu: softmax cross-entropy of the CUDA backend: the fused loss
 * and gradient (fp32 or bf16 logits) and the vocabulary-parallel passes
 * (ce_shard_max / _sum / _finish), same contract as kernels_cpu_loss.c.
 *
 * One block per row: the max over the valid columns and Z = sum exp(l -
 * max) in double in one pass (a running max per thread, fixed block
 * trees), then the gradient written in place
 * (dlogits may alias logits: every read of the row is done before the
 * block's first write, and each thread writes only what it just read).
 * The row losses go to a device array and the caller adds them in row
 * order, as the CPU does.  The bf16 variant reads bf16 logits and writes
 * bf16 gradients: the fp32 logits exist only in registers, never as a
 * [n, V] fp32 tensor, so the loss costs no memory beyond the bf16 logits.  The rounding
 * table's (mt_f32_as_bf16) reads float32 logits as their bf16 values and
 * writes bf16-valued float32 gradients, so the model needs no rounding
 * pass over the logits before or after; the shard passes likewise.  It does not fuse
 * the LM-head GEMM itself: the caller chunks rows (doc/gpu.md).
 * A target outside [0, v_valid) that is not -100 traps the kernel. */
#include "cuda_common.cuh"

#define IGNORE_INDEX (-100)
#define CE_THREADS 512
#define CE_PACK 8 /* a row's elements a thread takes together (mt_k_cross_entropy) */

/* ------------------------------------------------------------------ kernels */

/* The fused loss and gradient of a row in two passes over the logits:
 * one for the max and Z at once (each thread's running max and its sum of
 * exp(l - max), rescaled when the max grows; the block then brings every
 * thread's sum to the row's max), one for the gradient.  A thread takes
 * the row in packs of CE_PACK whatever T, so its sums are the same on the
 * rounding table and bf16 storage; VEC (rows and pointers 16-byte
 * aligned) moves them in 16-byte accesses (cuda_common.cuh). */
template <typename T, bool VEC>
__global__ void mt_k_cross_entropy(T *dlogits, const T *logits, const int32_t *targets, int64_t n,
                                   int64_t V, int64_t v_valid, float grad_scale,
                                   double *row_loss)
{
    __shared__ float fbuf[MT_WARP];
    __shared__ double dbuf[MT_WARP];
    __shared__ float s_ly;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int32_t y = targets[i];
        const T *lr = logits + i * V;
        T *dr = dlogits ? dlogits + i * V : nullptr;
        if (y == IGNORE_INDEX) {
            if (dr)
                mt_row_packs<CE_PACK>(V, [&](int64_t j, auto wd) {
                    constexpr int W = decltype(wd)::value;
                    mt_pack_t<T, W> d;
#pragma unroll
                    for (int k = 0; k < W; k++)
                        mt_st(d.e, k, 0.0f);
                    mt_st_pack<W, VEC>(dr + j, d);
                });
            if (threadIdx.x == 0)
                row_loss[i] = 0.0;
            continue;
        }
        if (y < 0 || y >= v_valid) {
            if (threadIdx.x == 0)
                printf("meshtrain cuda cross_entropy: targets[%lld] = %d, outside [0, %lld) and "
                       "not -100\n",
                       (long long)i, y, (long long)v_valid);
            __trap();
        }
        __syncthreads(); /* s_ly of the previous row is no longer read */
        if (threadIdx.x == 0)
            s_ly = mt_ld(lr, y);
        float m = -INFINITY;
        double z = 0.0;
        mt_row_packs<CE_PACK>(v_valid, [&](int64_t j, auto wd) {
            constexpr int W = decltype(wd)::value;
            const mt_pack_t<T, W> p = mt_ld_pack<W, VEC>(lr + j);
            float x[W], pm = m;
#pragma unroll
            for (int k = 0; k < W; k++)
                pm = fmaxf(pm, x[k] = mt_ld(p.e, k));
            if (pm > m) { /* the running max grows: rescale the sum to it */
                if (m != -INFINITY) /* (else z is 0, or NaN from a NaN logit: kept) */
                    z *= exp((double)m - (double)pm);
                m = pm;
            }
#pragma unroll
            for (int k = 0; k < W; k++) /* exp(-inf) is 0 even while m is -inf */
                z += x[k] == -INFINITY ? 0.0 : (double)expf(x[k] - m);
        });
        const float mx = mt_block_max(m, fbuf); /* its barriers also publish s_ly */
        z = mt_block_sum(m == -INFINITY ? z : z * exp((double)m - (double)mx), dbuf);
        /* after the sum, every thread has read the row */
        const float ly = s_ly;
        if (threadIdx.x == 0)
            row_loss[i] = ((double)mx - (double)ly) + log(z);
        if (dr) {
            const float f = (float)((double)grad_scale / z);
            const float dy = (float)(((double)expf(ly - mx) / z - 1.0) * (double)grad_scale);
            mt_row_packs<CE_PACK>(V, [&](int64_t j, auto wd) {
                constexpr int W = decltype(wd)::value;
                const mt_pack_t<T, W> p = mt_ld_pack<W, VEC>(lr + j);
                mt_pack_t<T, W> d;
#pragma unroll
                for (int k = 0; k < W; k++) {
                    const int64_t c = j + k;
                    mt_st(d.e, k, c >= v_valid ? 0.0f : c == y ? dy : expf(mt_ld(p.e, k) - mx) * f);
                }
                mt_st_pack<W, VEC>(dr + j, d);
            });
        }
    }
}

template <typename T>
__global__ void mt_k_ce_shard_max(float *mxo, const T *logits, int64_t n, int64_t V,
                                  int64_t v_valid)
{
    __shared__ float fbuf[MT_WARP];
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < v_valid; j += blockDim.x)
            mx = fmaxf(mx, mt_ld(logits, i * V + j));
        mx = mt_block_max(mx, fbuf);
        if (threadIdx.x == 0)
            mxo[i] = mx;
    }
}

template <typename T>
__global__ void mt_k_ce_shard_sum(double *z, double *ly, const T *logits,
                                  const int32_t *targets, const float *mx, int64_t n, int64_t V,
                                  int64_t v_lo, int64_t v_valid)
{
    __shared__ double dbuf[MT_WARP];
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const T *lr = logits + i * V;
        const float m = mx[i];
        double acc = 0.0;
        for (int64_t j = threadIdx.x; j < v_valid; j += blockDim.x)
            acc += (double)expf(mt_ld(lr, j) - m);
        acc = mt_block_sum(acc, dbuf);
        if (threadIdx.x == 0) {
            z[i] = acc;
            const int64_t y = (int64_t)targets[i] - v_lo;
            ly[i] = targets[i] != IGNORE_INDEX && y >= 0 && y < v_valid ? (double)mt_ld(lr, y)
                                                                         : 0.0;
        }
    }
}

template <typename T>
__global__ void mt_k_ce_shard_finish(T *dlogits, const T *logits, const int32_t *targets,
                                     const float *mx, const double *z, const double *ly,
                                     int64_t n, int64_t V, int64_t v_lo, int64_t v_valid,
                                     float grad_scale, double *row_loss)
{
    __shared__ float s_ey;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const bool ignored = targets[i] == IGNORE_INDEX;
        if (threadIdx.x == 0)
            row_loss[i] = ignored ? 0.0 : ((double)mx[i] - ly[i]) + log(z[i]);
        if (!dlogits)
            continue;
        const T *lr = logits + i * V;
        T *dr = dlogits + i * V;
        if (ignored) {
            for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
                mt_st(dr, j, 0.0f);
            continue;
        }
        const int64_t y = (int64_t)targets[i] - v_lo;
        const bool here = y >= 0 && y < v_valid;
        __syncthreads(); /* s_ey of the previous row is no longer read */
        if (threadIdx.x == 0)
            s_ey = here ? expf(mt_ld(lr, y) - mx[i]) : 0.0f;
        __syncthreads(); /* lr[y] is read before anyone overwrites it */
        const float f = (float)((double)grad_scale / z[i]);
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            float d;
            if (j >= v_valid)
                d = 0.0f;
            else if (here && j == y)
                d = (float)(((double)s_ey / z[i] - 1.0) * (double)grad_scale);
            else
                d = expf(mt_ld(lr, j) - mx[i]) * f;
            mt_st(dr, j, d);
        }
    }
}

/* ------------------------------------------------------------------ launchers */

static unsigned row_blocks(int64_t n) { return n < 65535 * 16 ? (unsigned)n : 65535 * 16; }

template <typename T>
static void ce_launch(cudaStream_t s, void *dlogits, const void *logits, const int32_t *targets,
                      int64_t n, int64_t V, int64_t v_valid, float grad_scale, double *row_loss)
{
    if (V % CE_PACK == 0 && mt_aligned16(dlogits, logits))
        mt_k_cross_entropy<T, true><<<row_blocks(n), CE_THREADS, 0, s>>>(
            (T *)dlogits, (const T *)logits, targets, n, V, v_valid, grad_scale, row_loss);
    else
        mt_k_cross_entropy<T, false><<<row_blocks(n), CE_THREADS, 0, s>>>(
            (T *)dlogits, (const T *)logits, targets, n, V, v_valid, grad_scale, row_loss);
}

extern "C" void mt_cuda_launch_cross_entropy(cudaStream_t s, void *dlogits, const void *logits,
                                             mt_cuda_ce_elem_t elem, const int32_t *targets,
                                             int64_t n, int64_t V, int64_t v_valid,
                                             float grad_scale, double *row_loss)
{
    MT_CUDA_REQUIRE(n >= 0 && v_valid >= 1 && v_valid <= V, "cross_entropy",
                    "n=%lld V=%lld v_valid=%lld", (long long)n, (long long)V, (long long)v_valid);
    if (n == 0)
        return;
    if (elem == MT_CUDA_CE_BF16)
        ce_launch<__nv_bfloat16>(s, dlogits, logits, targets, n, V, v_valid, grad_scale,
                                 row_loss);
    else if (elem == MT_CUDA_CE_F32_AS_BF16)
        ce_launch<mt_f32_as_bf16>(s, dlogits, logits, targets, n, V, v_valid, grad_scale,
                                  row_loss);
    else
        ce_launch<float>(s, dlogits, logits, targets, n, V, v_valid, grad_scale, row_loss);
    MT_CUDA_LAUNCH_CHECK("cross_entropy");
}

#define REQUIRE_SHARD(kernel)                                                                \
    MT_CUDA_REQUIRE(n >= 0 && v_valid >= 0 && v_valid <= V, kernel,                          \
                    "n=%lld V=%lld v_valid=%lld", (long long)n, (long long)V,                \
                    (long long)v_valid)

/* the shard passes on float32 logits, as they are or as bf16 values */
#define AS_BF16(p) ((mt_f32_as_bf16 *)(p))
#define AS_BF16_C(p) ((const mt_f32_as_bf16 *)(p))

extern "C" void mt_cuda_launch_ce_shard_max(cudaStream_t s, float *mx, const float *logits,
                                            int64_t n, int64_t V, int64_t v_valid, bool round)
{
    REQUIRE_SHARD("ce_shard_max");
    if (n == 0)
        return;
    const unsigned g = row_blocks(n);
    if (round)
        mt_k_ce_shard_max<mt_f32_as_bf16><<<g, CE_THREADS, 0, s>>>(mx, AS_BF16_C(logits), n, V,
                                                                   v_valid);
    else
        mt_k_ce_shard_max<float><<<g, CE_THREADS, 0, s>>>(mx, logits, n, V, v_valid);
    MT_CUDA_LAUNCH_CHECK("ce_shard_max");
}

extern "C" void mt_cuda_launch_ce_shard_sum(cudaStream_t s, double *z, double *ly,
                                            const float *logits, const int32_t *targets,
                                            const float *mx, int64_t n, int64_t V, int64_t v_lo,
                                            int64_t v_valid, bool round)
{
    REQUIRE_SHARD("ce_shard_sum");
    if (n == 0)
        return;
    const unsigned g = row_blocks(n);
    if (round)
        mt_k_ce_shard_sum<mt_f32_as_bf16><<<g, CE_THREADS, 0, s>>>(z, ly, AS_BF16_C(logits),
                                                                   targets, mx, n, V, v_lo,
                                                                   v_valid);
    else
        mt_k_ce_shard_sum<float><<<g, CE_THREADS, 0, s>>>(z, ly, logits, targets, mx, n, V, v_lo,
                                                          v_valid);
    MT_CUDA_LAUNCH_CHECK("ce_shard_sum");
}

extern "C" void mt_cuda_launch_ce_shard_finish(cudaStream_t s, float *dlogits,
                                               const float *logits, const int32_t *targets,
                                               const float *mx, const double *z,
                                               const double *ly, int64_t n, int64_t V,
                                               int64_t v_lo, int64_t v_valid, float grad_scale,
                                               double *row_loss, bool round)
{
    REQUIRE_SHARD("ce_shard_finish");
    if (n == 0)
        return;
    const unsigned g = row_blocks(n);
    if (round)
        mt_k_ce_shard_finish<mt_f32_as_bf16><<<g, CE_THREADS, 0, s>>>(
            AS_BF16(dlogits), AS_BF16_C(logits), targets, mx, z, ly, n, V, v_lo, v_valid,
            grad_scale, row_loss);
    else
        mt_k_ce_shard_finish<float><<<g, CE_THREADS, 0, s>>>(
            dlogits, logits, targets, mx, z, ly, n, V, v_lo, v_valid, grad_scale, row_loss);
    MT_CUDA_LAUNCH_CHECK("ce_shard_finish");
}

/* the shard passes on bf16 bits (bf16 storage): logits read, dlogits
 * written as bf16, the same arithmetic as the rounding table's */
#define AS_NV(p) ((__nv_bfloat16 *)(p))
#define AS_NV_C(p) ((const __nv_bfloat16 *)(p))

extern "C" void mt_cuda_launch_ce_shard_max_bf16s(cudaStream_t s, float *mx,
                                                  const uint16_t *logits, int64_t n, int64_t V,
                                                  int64_t v_valid)
{
    REQUIRE_SHARD("ce_shard_max");
    if (n == 0)
        return;
    mt_k_ce_shard_max<__nv_bfloat16><<<row_blocks(n), CE_THREADS, 0, s>>>(mx, AS_NV_C(logits), n,
                                                                          V, v_valid);
    MT_CUDA_LAUNCH_CHECK("ce_shard_max");
}

extern "C" void mt_cuda_launch_ce_shard_sum_bf16s(cudaStream_t s, double *z, double *ly,
                                                  const uint16_t *logits, const int32_t *targets,
                                                  const float *mx, int64_t n, int64_t V,
                                                  int64_t v_lo, int64_t v_valid)
{
    REQUIRE_SHARD("ce_shard_sum");
    if (n == 0)
        return;
    mt_k_ce_shard_sum<__nv_bfloat16><<<row_blocks(n), CE_THREADS, 0, s>>>(
        z, ly, AS_NV_C(logits), targets, mx, n, V, v_lo, v_valid);
    MT_CUDA_LAUNCH_CHECK("ce_shard_sum");
}

extern "C" void mt_cuda_launch_ce_shard_finish_bf16s(cudaStream_t s, uint16_t *dlogits,
                                                     const uint16_t *logits,
                                                     const int32_t *targets, const float *mx,
                                                     const double *z, const double *ly, int64_t n,
                                                     int64_t V, int64_t v_lo, int64_t v_valid,
                                                     float grad_scale, double *row_loss)
{
    REQUIRE_SHARD("ce_shard_finish");
    if (n == 0)
        return;
    mt_k_ce_shard_finish<__nv_bfloat16><<<row_blocks(n), CE_THREADS, 0, s>>>(
        AS_NV(dlogits), AS_NV_C(logits), targets, mx, z, ly, n, V, v_lo, v_valid, grad_scale,
        row_loss);
    MT_CUDA_LAUNCH_CHECK("ce_shard_finish");
}
