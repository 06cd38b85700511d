/* cuda_norm.cu: RMSNorm of the CUDA backend, forward and backward.
 *
 * One block per row for the row-wise parts (rstd, out, dx), sums in double
 * as on the CPU.  The weight gradient dw is a reduction over rows; to stay
 * deterministic without atomics it runs in two kernels: partial sums over
 * a fixed number of row chunks (DW_CHUNKS, a function of n only) into
 * backend scratch, then one thread per column adding the chunks in order.
 * The bits do not depend on the GPU or the launch, only on the shapes.
 * Scratch: DW_CHUNKS * dim doubles.  With round (the bf16 table) the
 * activations x, dout and an accumulated dx are read as bf16 values and
 * out and dx are written rounded (mt_backend_t.reads_bf16, rounds_bf16);
 * the _bf16s launchers run the same kernels on bf16 bits (bf16 storage,
 * mt_backend_t.stores_bf16), which gives the rounding table's bits. */
#include "cuda_common.cuh"

#define ROW_THREADS 256
#define ROW_PACK 8 /* a row's elements a thread takes together */
#define DW_CHUNKS 128

/* ------------------------------------------------------------------ kernels */

/* T: float (round: the rounding table), or __nv_bfloat16 (bf16 storage,
 * round true) for x, w, out, dout and dx; rstd and dw stay float.  The
 * arithmetic is the same, so bf16 storage gives the rounding table's bits.
 * A thread takes a row's elements in packs of ROW_PACK (cuda_common.cuh)
 * whatever T, so its share of a row's sums is the same on both tables;
 * VEC (every row start and pointer 16-byte aligned) moves them in 16-byte
 * accesses. */
template <typename T, bool VEC>
__global__ void mt_k_rmsnorm_forward(T *out, float *rstd, const T *x, const T *w,
                                     const double *sums, int64_t n, int64_t dim,
                                     int64_t full_dim, float eps, bool round)
{
    __shared__ double buf[MT_WARP];
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const T *xr = x + i * dim;
        double ss = 0.0;
        if (!sums) /* uniform over the block: the block sum below is safe */
        mt_row_packs<ROW_PACK>(dim, [&](int64_t j, auto wd) {
            constexpr int V = decltype(wd)::value;
            const mt_pack_t<T, V> xp = mt_ld_pack<V, VEC>(xr + j);
#pragma unroll
            for (int k = 0; k < V; k++) {
                const double xj = mt_bf16_if(mt_ld(xp.e, k), round);
                ss += xj * xj;
            }
        });
        ss = sums ? sums[i] : mt_block_sum(ss, buf);
        const float r = (float)(1.0 / sqrt(ss / (double)full_dim + (double)eps));
        if (threadIdx.x == 0)
            rstd[i] = r;
        T *yr = out + i * dim;
        mt_row_packs<ROW_PACK>(dim, [&](int64_t j, auto wd) { /* HF's order */
            constexpr int V = decltype(wd)::value;
            const mt_pack_t<T, V> xp = mt_ld_pack<V, VEC>(xr + j), wp = mt_ld_pack<V, VEC>(w + j);
            mt_pack_t<T, V> yp;
#pragma unroll
            for (int k = 0; k < V; k++)
                mt_st(yp.e, k,
                      mt_bf16_if((mt_bf16_if(mt_ld(xp.e, k), round) * r) * mt_ld(wp.e, k), round));
            mt_st_pack<V, VEC>(yr + j, yp);
        });
    }
}

template <typename T, bool VEC>
__global__ void mt_k_rmsnorm_backward_dx(T *dx, const T *dout, const T *x, const T *w,
                                         const float *rstd, const double *sums, int64_t n,
                                         int64_t dim, int64_t full_dim, bool acc, bool round)
{
    __shared__ double buf[MT_WARP];
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const T *xr = x + i * dim, *gr = dout + i * dim;
        double gx = 0.0;
        if (!sums)
        mt_row_packs<ROW_PACK>(dim, [&](int64_t j, auto wd) {
            constexpr int V = decltype(wd)::value;
            const mt_pack_t<T, V> gp = mt_ld_pack<V, VEC>(gr + j), xp = mt_ld_pack<V, VEC>(xr + j);
            const mt_pack_t<T, V> wp = mt_ld_pack<V, VEC>(w + j);
#pragma unroll
            for (int k = 0; k < V; k++)
                gx += (double)mt_bf16_if(mt_ld(gp.e, k), round) * (double)mt_ld(wp.e, k) *
                      (double)mt_bf16_if(mt_ld(xp.e, k), round);
        });
        gx = sums ? sums[i] : mt_block_sum(gx, buf);
        const double r = rstd[i];
        const float coef = (float)(r * r * r * gx / (double)full_dim);
        const float rf = (float)r;
        T *dr = dx + i * dim; /* may not alias dout: rows are read above, then written */
        mt_row_packs<ROW_PACK>(dim, [&](int64_t j, auto wd) {
            constexpr int V = decltype(wd)::value;
            const mt_pack_t<T, V> gp = mt_ld_pack<V, VEC>(gr + j), xp = mt_ld_pack<V, VEC>(xr + j);
            const mt_pack_t<T, V> wp = mt_ld_pack<V, VEC>(w + j);
            mt_pack_t<T, V> dp;
            if (acc)
                dp = mt_ld_pack<V, VEC>(dr + j);
#pragma unroll
            for (int k = 0; k < V; k++) {
                const float g = mt_bf16_if(mt_ld(gp.e, k), round);
                const float xj = mt_bf16_if(mt_ld(xp.e, k), round);
                const float v = rf * (g * mt_ld(wp.e, k)) - coef * xj;
                /* += : the residual's gradient */
                mt_st(dp.e, k, mt_bf16_if(acc ? mt_bf16_if(mt_ld(dp.e, k), round) + v : v, round));
            }
            mt_st_pack<V, VEC>(dr + j, dp);
        });
    }
}

/* sums[i] = this rank's part of row i's sum of a b w (w NULL: of a b) */
template <typename T>
__global__ void mt_k_rmsnorm_rowsums(double *sums, const T *a, const T *b, const T *w,
                                     int64_t n, int64_t dim, bool round)
{
    __shared__ double buf[MT_WARP];
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const T *ar = a + i * dim, *br = b + i * dim;
        double acc = 0.0;
        mt_row_packs<ROW_PACK>(dim, [&](int64_t j, auto wd) {
            constexpr int V = decltype(wd)::value;
            const mt_pack_t<T, V> ap = mt_ld_pack<V, false>(ar + j), bp = mt_ld_pack<V, false>(br + j);
#pragma unroll
            for (int k = 0; k < V; k++) {
                /* a w b: the CPU's order (dot3_f64), the backward's gx */
                const double av = mt_bf16_if(mt_ld(ap.e, k), round);
                const double bv = mt_bf16_if(mt_ld(bp.e, k), round);
                acc += w ? av * (double)mt_ld(w, j + k) * bv : av * bv;
            }
        });
        acc = mt_block_sum(acc, buf);
        if (threadIdx.x == 0)
            sums[i] = acc;
    }
}

/* partial[ch][c] = sum over the rows of chunk ch of dout * x * rstd */
template <typename T>
__global__ void mt_k_rmsnorm_dw_partial(double *partial, const T *dout, const T *x,
                                        const float *rstd, int64_t n, int64_t dim,
                                        int64_t rows_per_chunk, bool round)
{
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t ch = blockIdx.y;
    if (c >= dim)
        return;
    const int64_t r0 = ch * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
    double acc = 0.0;
    for (int64_t i = r0; i < r1; i++)
        acc += (double)mt_bf16_if(mt_ld(dout, i * dim + c), round) *
               (double)mt_bf16_if(mt_ld(x, i * dim + c), round) * (double)rstd[i];
    partial[ch * dim + c] = acc;
}

__global__ void mt_k_rmsnorm_dw_finish(float *dw, const double *partial, int64_t nchunks,
                                       int64_t dim)
{
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= dim)
        return;
    double acc = 0.0;
    for (int64_t ch = 0; ch < nchunks; ch++)
        acc += partial[ch * dim + c];
    dw[c] += (float)acc;
}

/* ------------------------------------------------------------------ launchers */

static unsigned row_blocks(int64_t n) { return n < 65535 * 16 ? (unsigned)n : 65535 * 16; }

template <typename T>
static void rmsnorm_forward(cudaStream_t s, T *out, float *rstd, const T *x, const T *w,
                            const double *sums, int64_t n, int64_t dim, int64_t full_dim,
                            float eps, bool round)
{
    MT_CUDA_REQUIRE(n >= 0 && dim > 0 && full_dim >= dim, "rmsnorm_forward",
                    "n=%lld dim=%lld full_dim=%lld", (long long)n, (long long)dim,
                    (long long)full_dim);
    if (n == 0)
        return;
    if (dim % ROW_PACK == 0 && mt_aligned16(out, x, w))
        mt_k_rmsnorm_forward<T, true><<<row_blocks(n), ROW_THREADS, 0, s>>>(
            out, rstd, x, w, sums, n, dim, full_dim, eps, round);
    else
        mt_k_rmsnorm_forward<T, false><<<row_blocks(n), ROW_THREADS, 0, s>>>(
            out, rstd, x, w, sums, n, dim, full_dim, eps, round);
    MT_CUDA_LAUNCH_CHECK("rmsnorm_forward");
}

template <typename T>
static void rmsnorm_backward(cudaStream_t s, T *dx, float *dw, const T *dout, const T *x,
                             const T *w, const float *rstd, const double *sums, int64_t n,
                             int64_t dim, int64_t full_dim, bool accumulate, bool round)
{
    MT_CUDA_REQUIRE(n >= 0 && dim > 0 && full_dim >= dim, "rmsnorm_backward",
                    "n=%lld dim=%lld full_dim=%lld", (long long)n, (long long)dim,
                    (long long)full_dim);
    if (n == 0)
        return;
    const int64_t nchunks = n < DW_CHUNKS ? n : DW_CHUNKS;
    const int64_t rows_per_chunk = (n + nchunks - 1) / nchunks;
    double *partial = (double *)mt_cuda_scratch("rmsnorm_backward",
                                                (size_t)(nchunks * dim) * sizeof(double));
    /* dw first: it reads dout and x, which dx may overwrite when aliased */
    dim3 grid((unsigned)((dim + 255) / 256), (unsigned)nchunks);
    mt_k_rmsnorm_dw_partial<T><<<grid, 256, 0, s>>>(partial, dout, x, rstd, n, dim,
                                                    rows_per_chunk, round);
    MT_CUDA_LAUNCH_CHECK("rmsnorm_dw_partial");
    mt_k_rmsnorm_dw_finish<<<(unsigned)((dim + 255) / 256), 256, 0, s>>>(dw, partial, nchunks,
                                                                         dim);
    MT_CUDA_LAUNCH_CHECK("rmsnorm_dw_finish");
    if (dim % ROW_PACK == 0 && mt_aligned16(dx, dout, x, w))
        mt_k_rmsnorm_backward_dx<T, true><<<row_blocks(n), ROW_THREADS, 0, s>>>(
            dx, dout, x, w, rstd, sums, n, dim, full_dim, accumulate, round);
    else
        mt_k_rmsnorm_backward_dx<T, false><<<row_blocks(n), ROW_THREADS, 0, s>>>(
            dx, dout, x, w, rstd, sums, n, dim, full_dim, accumulate, round);
    MT_CUDA_LAUNCH_CHECK("rmsnorm_backward_dx");
}

extern "C" void mt_cuda_launch_rmsnorm_forward(cudaStream_t s, float *out, float *rstd,
                                               const float *x, const float *w, int64_t n,
                                               int64_t dim, float eps, bool round)
{
    rmsnorm_forward(s, out, rstd, x, w, (const double *)NULL, n, dim, dim, eps, round);
}

extern "C" void mt_cuda_launch_rmsnorm_backward(cudaStream_t s, float *dx, float *dw,
                                                const float *dout, const float *x,
                                                const float *w, const float *rstd, int64_t n,
                                                int64_t dim, bool accumulate, bool round)
{
    rmsnorm_backward(s, dx, dw, dout, x, w, rstd, (const double *)NULL, n, dim, dim, accumulate,
                     round);
}

/* bf16 storage: the same kernels on bf16 bits (x, w, out, dout, dx) */
extern "C" void mt_cuda_launch_rmsnorm_forward_bf16s(cudaStream_t s, uint16_t *out, float *rstd,
                                                     const uint16_t *x, const uint16_t *w,
                                                     int64_t n, int64_t dim, float eps)
{
    rmsnorm_forward(s, (__nv_bfloat16 *)out, rstd, (const __nv_bfloat16 *)x,
                    (const __nv_bfloat16 *)w, (const double *)NULL, n, dim, dim, eps, true);
}

extern "C" void mt_cuda_launch_rmsnorm_backward_bf16s(cudaStream_t s, uint16_t *dx, float *dw,
                                                      const uint16_t *dout, const uint16_t *x,
                                                      const uint16_t *w, const float *rstd,
                                                      int64_t n, int64_t dim, bool accumulate)
{
    rmsnorm_backward(s, (__nv_bfloat16 *)dx, dw, (const __nv_bfloat16 *)dout,
                     (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, rstd,
                     (const double *)NULL, n, dim, dim, accumulate, true);
}

/* ---- rows split across ranks: the partial sums, then the norm with them */

template <typename T>
static void rmsnorm_rowsums(cudaStream_t s, double *sums, const T *a, const T *b, const T *w,
                            int64_t n, int64_t dim, bool round)
{
    MT_CUDA_REQUIRE(n >= 0 && dim > 0, "rmsnorm_rowsums", "n=%lld dim=%lld", (long long)n,
                    (long long)dim);
    if (n == 0)
        return;
    mt_k_rmsnorm_rowsums<T><<<row_blocks(n), ROW_THREADS, 0, s>>>(sums, a, b, w, n, dim, round);
    MT_CUDA_LAUNCH_CHECK("rmsnorm_rowsums");
}

extern "C" void mt_cuda_launch_rmsnorm_rowsums(cudaStream_t s, double *sums, const float *a,
                                               const float *b, const float *w, int64_t n,
                                               int64_t dim, bool round)
{
    rmsnorm_rowsums(s, sums, a, b, w, n, dim, round);
}

extern "C" void mt_cuda_launch_rmsnorm_forward_sums(cudaStream_t s, float *out, float *rstd,
                                                    const float *x, const float *w,
                                                    const double *sums, int64_t n, int64_t dim,
                                                    int64_t full_dim, float eps, bool round)
{
    MT_CUDA_REQUIRE(sums != NULL, "rmsnorm_forward_sums", "sums=NULL");
    rmsnorm_forward(s, out, rstd, x, w, sums, n, dim, full_dim, eps, round);
}

extern "C" void mt_cuda_launch_rmsnorm_backward_sums(cudaStream_t s, float *dx, float *dw,
                                                     const float *dout, const float *x,
                                                     const float *w, const float *rstd,
                                                     const double *sums, int64_t n, int64_t dim,
                                                     int64_t full_dim, bool accumulate,
                                                     bool round)
{
    MT_CUDA_REQUIRE(sums != NULL, "rmsnorm_backward_sums", "sums=NULL");
    rmsnorm_backward(s, dx, dw, dout, x, w, rstd, sums, n, dim, full_dim, accumulate, round);
}

extern "C" void mt_cuda_launch_rmsnorm_rowsums_bf16s(cudaStream_t s, double *sums,
                                                     const uint16_t *a, const uint16_t *b,
                                                     const uint16_t *w, int64_t n, int64_t dim)
{
    rmsnorm_rowsums(s, sums, (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b,
                    (const __nv_bfloat16 *)w, n, dim, true);
}

extern "C" void mt_cuda_launch_rmsnorm_forward_sums_bf16s(cudaStream_t s, uint16_t *out,
                                                          float *rstd, const uint16_t *x,
                                                          const uint16_t *w, const double *sums,
                                                          int64_t n, int64_t dim,
                                                          int64_t full_dim, float eps)
{
    MT_CUDA_REQUIRE(sums != NULL, "rmsnorm_forward_sums", "sums=NULL");
    rmsnorm_forward(s, (__nv_bfloat16 *)out, rstd, (const __nv_bfloat16 *)x,
                    (const __nv_bfloat16 *)w, sums, n, dim, full_dim, eps, true);
}

extern "C" void mt_cuda_launch_rmsnorm_backward_sums_bf16s(cudaStream_t s, uint16_t *dx,
                                                           float *dw, const uint16_t *dout,
                                                           const uint16_t *x, const uint16_t *w,
                                                           const float *rstd, const double *sums,
                                                           int64_t n, int64_t dim,
                                                           int64_t full_dim, bool accumulate)
{
    MT_CUDA_REQUIRE(sums != NULL, "rmsnorm_backward_sums", "sums=NULL");
    rmsnorm_backward(s, (__nv_bfloat16 *)dx, dw, (const __nv_bfloat16 *)dout,
                     (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, rstd, sums, n, dim,
                     full_dim, accumulate, true);
}
