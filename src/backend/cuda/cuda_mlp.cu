/* cuda_mlp.cu: the elementwise kernels of the CUDA backend: SwiGLU forward
 * and backward, y += x, x *= s, and the deterministic sum of squares (the
 * gradient norm).
 *
 * SwiGLU uses CUDA's expf (within 2 ulp), where the CPU uses its own
 * Cephes expf: the two agree to a few float ulps, not bit for bit.  The
 * backward may run in place (dgate == gate, dup == up): each thread reads
 * its element before writing it.  With round (the bf16 table) SwiGLU reads
 * its inputs as bf16 values and rounds what it writes (mt_backend_t.
 * reads_bf16, rounds_bf16); the _bf16s launchers run the same kernels on
 * bf16 bits (bf16 storage, mt_backend_t.stores_bf16), which gives the
 * rounding table's bits.  sum_squares splits x into
 * MT_CUDA_SUMSQ_PARTS contiguous ranges (a function of n only), reduces
 * each in double with a fixed block tree, and the caller adds the parts in
 * order: the same bits on every run. */
#include "cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

#define GRID_STRIDE(i, n)                                                       \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);   \
         i += (int64_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float mt_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

/* T: float (round: the rounding table's float32 holding bf16 values), or
 * __nv_bfloat16 (bf16 storage, round true: loads exact, stores rounded);
 * the same arithmetic either way, so bf16 storage computes the rounding
 * table's bits.  In packs of 16 bytes (cuda_common.cuh), moved whole with
 * VEC (every pointer 16-byte aligned). */
template <typename T, bool VEC>
__global__ void mt_k_swiglu_forward(T *out, const T *gate, const T *up, int64_t n, bool round)
{
    mt_for_packs<16 / sizeof(T)>(n, [&](int64_t i, auto w) {
        constexpr int V = decltype(w)::value;
        const mt_pack_t<T, V> g = mt_ld_pack<V, VEC>(gate + i), u = mt_ld_pack<V, VEC>(up + i);
        mt_pack_t<T, V> o;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float gk = mt_bf16_if(mt_ld(g.e, k), round);
            mt_st(o.e, k, mt_bf16_if((gk * mt_sigmoid(gk)) * mt_bf16_if(mt_ld(u.e, k), round),
                                     round));
        }
        mt_st_pack<V, VEC>(out + i, o);
    });
}

/* may run in place (dgate == gate, dup == up): a pack is read whole
 * before it is written */
template <typename T, bool VEC>
__global__ void mt_k_swiglu_backward(T *dgate, T *dup, const T *dout, const T *gate, const T *up,
                                     int64_t n, bool round)
{
    mt_for_packs<16 / sizeof(T)>(n, [&](int64_t i, auto w) {
        constexpr int V = decltype(w)::value;
        const mt_pack_t<T, V> gp = mt_ld_pack<V, VEC>(gate + i), up_ = mt_ld_pack<V, VEC>(up + i);
        const mt_pack_t<T, V> dp = mt_ld_pack<V, VEC>(dout + i);
        mt_pack_t<T, V> dg, du;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float g = mt_bf16_if(mt_ld(gp.e, k), round);
            const float u = mt_bf16_if(mt_ld(up_.e, k), round);
            const float d = mt_bf16_if(mt_ld(dp.e, k), round);
            const float sg = mt_sigmoid(g);
            mt_st(dg.e, k, mt_bf16_if(d * u * (sg * (1.0f + g * (1.0f - sg))), round));
            mt_st(du.e, k, mt_bf16_if(d * (g * sg), round));
        }
        mt_st_pack<V, VEC>(dgate + i, dg);
        mt_st_pack<V, VEC>(dup + i, du);
    });
}

/* y += x; bf16 storage rounds the sum (the rounding table's add, then the
 * model's pass) */
template <typename T> __global__ void mt_k_add(T *y, const T *x, int64_t n)
{
    GRID_STRIDE(i, n) mt_st(y, i, mt_ld(y, i) + mt_ld(x, i));
}

__global__ void mt_k_scale(float *x, float a, int64_t n)
{
    GRID_STRIDE(i, n) x[i] *= a;
}

/* to the nearest bf16 value, ties to even (__float2bfloat16_rn keeps NaN) */
__global__ void mt_k_round_bf16(float *x, int64_t n)
{
    GRID_STRIDE(i, n) x[i] = mt_bf16_if(x[i], true);
}

/* block b sums x over its contiguous part, the CPU's chunking formula */
__global__ void mt_k_sum_squares(double *partial, const float *x, int64_t n, int64_t nparts)
{
    __shared__ double buf[MT_WARP];
    const int64_t b = blockIdx.x;
    const int64_t lo = n / nparts * b + (b < n % nparts ? b : n % nparts);
    const int64_t hi = lo + n / nparts + (b < n % nparts ? 1 : 0);
    double acc = 0.0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
        acc += (double)x[i] * (double)x[i];
    acc = mt_block_sum(acc, buf);
    if (threadIdx.x == 0)
        partial[b] = acc;
}

/* ------------------------------------------------------------------ launchers */

#define REQUIRE_N(kernel, n) MT_CUDA_REQUIRE((n) >= 0, kernel, "n=%lld", (long long)(n))

template <typename T>
static void swiglu_forward(cudaStream_t s, T *out, const T *gate, const T *up, int64_t n,
                           bool round)
{
    REQUIRE_N("swiglu_forward", n);
    if (n == 0)
        return;
    const unsigned g = mt_pack_blocks(n, 16 / sizeof(T));
    if (mt_aligned16(out, gate, up))
        mt_k_swiglu_forward<T, true><<<g, 256, 0, s>>>(out, gate, up, n, round);
    else
        mt_k_swiglu_forward<T, false><<<g, 256, 0, s>>>(out, gate, up, n, round);
    MT_CUDA_LAUNCH_CHECK("swiglu_forward");
}

template <typename T>
static void swiglu_backward(cudaStream_t s, T *dgate, T *dup, const T *dout, const T *gate,
                            const T *up, int64_t n, bool round)
{
    REQUIRE_N("swiglu_backward", n);
    if (n == 0)
        return;
    const unsigned g = mt_pack_blocks(n, 16 / sizeof(T));
    if (mt_aligned16(dgate, dup, dout, gate, up))
        mt_k_swiglu_backward<T, true><<<g, 256, 0, s>>>(dgate, dup, dout, gate, up, n, round);
    else
        mt_k_swiglu_backward<T, false><<<g, 256, 0, s>>>(dgate, dup, dout, gate, up, n, round);
    MT_CUDA_LAUNCH_CHECK("swiglu_backward");
}

template <typename T> static void add(cudaStream_t s, T *y, const T *x, int64_t n)
{
    REQUIRE_N("add", n);
    if (n == 0)
        return;
    mt_k_add<T><<<mt_cuda_blocks(n, 256), 256, 0, s>>>(y, x, n);
    MT_CUDA_LAUNCH_CHECK("add");
}

extern "C" void mt_cuda_launch_swiglu_forward(cudaStream_t s, float *out, const float *gate,
                                              const float *up, int64_t n, bool round)
{
    swiglu_forward(s, out, gate, up, n, round);
}

extern "C" void mt_cuda_launch_swiglu_backward(cudaStream_t s, float *dgate, float *dup,
                                               const float *dout, const float *gate,
                                               const float *up, int64_t n, bool round)
{
    swiglu_backward(s, dgate, dup, dout, gate, up, n, round);
}

extern "C" void mt_cuda_launch_add(cudaStream_t s, float *y, const float *x, int64_t n)
{
    add(s, y, x, n);
}

/* bf16 storage: the same kernels on bf16 bits */
extern "C" void mt_cuda_launch_swiglu_forward_bf16s(cudaStream_t s, uint16_t *out,
                                                    const uint16_t *gate, const uint16_t *up,
                                                    int64_t n)
{
    swiglu_forward(s, (__nv_bfloat16 *)out, (const __nv_bfloat16 *)gate,
                   (const __nv_bfloat16 *)up, n, true);
}

extern "C" void mt_cuda_launch_swiglu_backward_bf16s(cudaStream_t s, uint16_t *dgate,
                                                     uint16_t *dup, const uint16_t *dout,
                                                     const uint16_t *gate, const uint16_t *up,
                                                     int64_t n)
{
    swiglu_backward(s, (__nv_bfloat16 *)dgate, (__nv_bfloat16 *)dup, (const __nv_bfloat16 *)dout,
                    (const __nv_bfloat16 *)gate, (const __nv_bfloat16 *)up, n, true);
}

extern "C" void mt_cuda_launch_add_bf16s(cudaStream_t s, uint16_t *y, const uint16_t *x,
                                         int64_t n)
{
    add(s, (__nv_bfloat16 *)y, (const __nv_bfloat16 *)x, n);
}

extern "C" void mt_cuda_launch_scale(cudaStream_t s, float *x, float a, int64_t n)
{
    REQUIRE_N("scale", n);
    if (n == 0)
        return;
    mt_k_scale<<<mt_cuda_blocks(n, 256), 256, 0, s>>>(x, a, n);
    MT_CUDA_LAUNCH_CHECK("scale");
}

extern "C" void mt_cuda_launch_round_bf16(cudaStream_t s, float *x, int64_t n)
{
    REQUIRE_N("round_bf16", n);
    if (n == 0)
        return;
    mt_k_round_bf16<<<mt_cuda_blocks(n, 256), 256, 0, s>>>(x, n);
    MT_CUDA_LAUNCH_CHECK("round_bf16");
}

extern "C" void mt_cuda_launch_sum_squares(cudaStream_t s, double *partial, const float *x,
                                           int64_t n)
{
    REQUIRE_N("sum_squares", n);
    mt_k_sum_squares<<<MT_CUDA_SUMSQ_PARTS, 256, 0, s>>>(partial, x, n, MT_CUDA_SUMSQ_PARTS);
    MT_CUDA_LAUNCH_CHECK("sum_squares");
}
