/* cuda_matmul.cu: GEMMs of the CUDA backend and the bf16 <-> fp32
 * conversions.
 *
 * fp32: cublasSgemm in the default math mode (no TF32), so the results
 * stay within a few fp32 ulps of the CPU's sgemm.  fp32 on tensor cores
 * (the bf16-numerics table, mt_backend_cuda_bf16): cublasGemmEx with fp32
 * operands and CUBLAS_COMPUTE_32F_FAST_16BF.  bf16: cublasLtMatmul
 * with bf16 A, B and CUBLAS_COMPUTE_32F (fp32 accumulation, fp32
 * alpha/beta), C bf16 or fp32 (weight gradients accumulate in fp32).  Both are row-major through the usual trick: a row-major
 * [M,N] matrix is a column-major [N,M] one, so C^T = op(B)^T op(A)^T is
 * computed with the operands swapped and the transposes kept.
 *
 * cuBLASLt's descriptors and algorithms are kept per shape (lt_plan).
 * Not done here: fused epilogues (bias, GELU), fp8. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <limits.h>

#include "cuda_common.cuh"

static void cublas_check(cublasStatus_t st, const char *call, const char *file, int line)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        mt_cuda_die(call, cublasGetStatusString(st), file, line);
}
#define CUBLAS_CHECK(call) cublas_check((call), #call, __FILE__, __LINE__)

/* ------------------------------------------------------------------ kernels */

/* float32 <-> bf16 (D, S: float and __nv_bfloat16 either way; mt_ld
 * widens exactly, mt_st rounds to nearest even) in packs of 8
 * (cuda_common.cuh), with VEC (both pointers 16-byte aligned) one 16-byte
 * bf16 access and two float32 ones */
template <typename D, typename S, bool VEC>
__global__ void mt_k_convert(D *dst, const S *src, int64_t n)
{
    mt_for_packs<8>(n, [&](int64_t i, auto w) {
        constexpr int V = decltype(w)::value;
        const mt_pack_t<S, V> x = mt_ld_pack<V, VEC>(src + i);
        mt_pack_t<D, V> y;
#pragma unroll
        for (int k = 0; k < V; k++)
            mt_st(y.e, k, mt_ld(x.e, k));
        mt_st_pack<V, VEC>(dst + i, y);
    });
}

template <typename D, typename S>
static void convert(cudaStream_t s, void *dst, const void *src, int64_t n)
{
    if (mt_aligned16(dst, src))
        mt_k_convert<D, S, true><<<mt_pack_blocks(n, 8), 256, 0, s>>>((D *)dst, (const S *)src, n);
    else
        mt_k_convert<D, S, false><<<mt_pack_blocks(n, 8), 256, 0, s>>>((D *)dst, (const S *)src, n);
}

/* C = beta C for k == 0 (cuBLAS wants ld >= 1); bf16 or fp32 */
template <typename T> __global__ void mt_k_beta_only(T *c, int64_t n, float beta)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        mt_st(c, i, beta == 0.0f ? 0.0f : beta * mt_ld(c, i));
}

/* ------------------------------------------------------------------ launchers */

static void check_dims(const char *kernel, int64_t m, int64_t n, int64_t k)
{
    MT_CUDA_REQUIRE(m >= 0 && n >= 0 && k >= 0, kernel, "m=%lld n=%lld k=%lld", (long long)m,
                    (long long)n, (long long)k);
    MT_CUDA_REQUIRE(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, kernel,
                    "cuBLAS takes int dims: m=%lld n=%lld k=%lld", (long long)m, (long long)n,
                    (long long)k);
}

/* fp32 A, B, C row-major through cuBLAS's column-major view:
 * C^T[n,m] = op(B)^T[n,k] op(A)^T[k,m].  fast_bf16: compute type
 * CUBLAS_COMPUTE_32F_FAST_16BF (below), else cublasSgemm in the default
 * math mode (no TF32). */
static void gemm_f32(const char *name, cudaStream_t s, float *c, const float *a, const float *b,
                     int64_t m, int64_t n, int64_t k, bool ta, bool tb, float beta, bool fast_bf16)
{
    check_dims(name, m, n, k);
    if (m == 0 || n == 0)
        return;
    if (k == 0) {
        mt_k_beta_only<float><<<mt_cuda_blocks(m * n, 256), 256, 0, s>>>(c, m * n, beta);
        MT_CUDA_LAUNCH_CHECK("beta_only");
        return;
    }
    cublasHandle_t h = (cublasHandle_t)mt_cuda_ctx(name)->cublas;
    CUBLAS_CHECK(cublasSetStream(h, s));
    const float alpha = 1.0f;
    const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int ldb = (int)(tb ? k : n), lda = (int)(ta ? m : k);
    if (fast_bf16)
        CUBLAS_CHECK(cublasGemmEx(h, opb, opa, (int)n, (int)m, (int)k, &alpha, b, CUDA_R_32F, ldb,
                                  a, CUDA_R_32F, lda, &beta, c, CUDA_R_32F, (int)n,
                                  CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_CHECK(cublasSgemm(h, opb, opa, (int)n, (int)m, (int)k, &alpha, b, ldb, a, lda,
                                 &beta, c, (int)n));
}

extern "C" void mt_cuda_launch_matmul(cudaStream_t s, float *c, const float *a, const float *b,
                                      int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                                      float beta)
{
    gemm_f32("matmul", s, c, a, b, m, n, k, ta, tb, beta, false);
}

/* fp32 A, B, C with CUBLAS_COMPUTE_32F_FAST_16BF: cuBLAS converts A and B
 * to bf16 (exact when they hold bf16 values, as in the bf16-numerics
 * table) and runs the tensor cores with fp32 accumulation into the fp32
 * C.  CUBLAS_GEMM_DEFAULT lets cuBLAS pick the kernel from the shape, the
 * same one every call; with the handle's one stream and its default
 * workspace and atomics not allowed (cuBLAS's defaults), the result is
 * the same bits on every run on one GPU model and toolkit. */
extern "C" void mt_cuda_launch_matmul_fast_bf16(cudaStream_t s, float *c, const float *a,
                                                const float *b, int64_t m, int64_t n, int64_t k,
                                                bool ta, bool tb, float beta)
{
    gemm_f32("matmul_fast_bf16", s, c, a, b, m, n, k, ta, tb, beta, true);
}

/* the alignment of p in bytes, at most 256 (cuBLASLt's default assumption) */
static uint32_t lt_align(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a)
        a >>= 1;
    return a;
}

static cublasLtHandle_t lt_handle(mt_cuda_ctx_t *ctx) { return (cublasLtHandle_t)ctx->cublaslt; }

/* cuBLASLt plans.  A GEMM's matmul descriptor, its three layouts and the
 * heuristic's algorithm depend only on the shape, the transposes, the
 * output type and the operands' alignments, so each is made once and kept
 * (the heuristic alone takes some microseconds of host time, and a dense
 * step issues hundreds of GEMMs of a few dozen shapes).  The table keeps
 * the LT_PLANS most recently used plans (MoE's expert GEMMs change their
 * row counts every step and would otherwise fill it) and is emptied with
 * the context (mt_cuda_lt_plans_free).  The same algorithm for a shape
 * for the whole run is also what makes a run's bits repeat.  Rank
 * threads do not share a context: one caller at a time. */
#define LT_PLANS 128

typedef struct {
    int64_t m, n, k;
    bool ta, tb, c_f32;
    uint32_t align[4];
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    uint64_t used; /* 0: an empty slot */
} lt_plan_t;

static lt_plan_t lt_plans[LT_PLANS];
static uint64_t lt_tick;
static mt_cuda_lt_stats_t lt_stats;

static void lt_plan_destroy(lt_plan_t *p)
{
    if (!p->used)
        return;
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
}

extern "C" void mt_cuda_lt_plans_free(void)
{
    for (int i = 0; i < LT_PLANS; i++)
        lt_plan_destroy(&lt_plans[i]);
    lt_tick = 0;
    memset(&lt_stats, 0, sizeof lt_stats);
}

extern "C" void mt_cuda_lt_stats(mt_cuda_lt_stats_t *st)
{
    *st = lt_stats;
    st->plans = 0;
    for (int i = 0; i < LT_PLANS; i++)
        st->plans += lt_plans[i].used != 0;
}

/* The plan of this GEMM: the kept one, or a new one in the least recently
 * used slot. */
static const lt_plan_t *lt_plan(mt_cuda_ctx_t *ctx, bool c_f32, const void *a, const void *b,
                                const void *cin, const void *c, int64_t m, int64_t n, int64_t k,
                                bool ta, bool tb, const char *kernel)
{
    /* The heuristic assumes 256-byte aligned operands unless told
     * otherwise, and row slices (the LM head's chunks, a layer's part of
     * an arena) can be less aligned: tell it what these pointers are
     * (Lt's A is our b, its B our a, C our cin, D our c). */
    const uint32_t align[4] = {lt_align(b), lt_align(a), lt_align(cin), lt_align(c)};
    lt_plan_t *p = &lt_plans[0];
    for (int i = 0; i < LT_PLANS; i++) {
        lt_plan_t *q = &lt_plans[i];
        if (q->used && q->m == m && q->n == n && q->k == k && q->ta == ta && q->tb == tb &&
            q->c_f32 == c_f32 && !memcmp(q->align, align, sizeof align)) {
            q->used = ++lt_tick;
            lt_stats.hits++;
            return q;
        }
        if (q->used < p->used)
            p = q;
    }
    if (p->used)
        lt_stats.evictions++;
    lt_plan_destroy(p);
    lt_stats.misses++;
    const cublasOperation_t op1 = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op2 = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op1,
                                                sizeof op1));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op2,
                                                sizeof op2));
    /* first operand B: stored column-major [n,k] (ld n), or [k,n] (ld k) when tb */
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, tb ? k : n, tb ? n : k,
                                            tb ? k : n));
    /* second operand A: stored column-major [k,m] (ld k), or [m,k] (ld m) when ta */
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, ta ? m : k, ta ? k : m,
                                            ta ? m : k));
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p->lc, c_f32 ? CUDA_R_32F : CUDA_R_16BF, n, m, n));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ctx->lt_workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i],
                                                          sizeof align[i]));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(lt_handle(ctx), p->desc, p->la, p->lb, p->lc, p->lc, pref,
                                       1, &heur, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    p->used = ++lt_tick; /* set before the check: the table frees the slot's handles */
    p->m = m, p->n = n, p->k = k, p->ta = ta, p->tb = tb, p->c_f32 = c_f32;
    memcpy(p->align, align, sizeof align);
    MT_CUDA_REQUIRE(found > 0, kernel,
                    "cuBLASLt has no algorithm for m=%lld n=%lld k=%lld ta=%d tb=%d",
                    (long long)m, (long long)n, (long long)k, (int)ta, (int)tb);
    p->algo = heur.algo;
    return p;
}

/* cuBLASLt: bf16 A and B, C and D bf16 or fp32, fp32 accumulation:
 * c = op(a) op(b) + beta cin (cin, C, is read apart from c, D, unless it
 * is c; beta 1 when it is not) */
static void matmul_lt(cudaStream_t s, void *c, const void *cin, bool c_f32, const uint16_t *a,
                      const uint16_t *b, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                      float beta, const char *kernel)
{
    check_dims(kernel, m, n, k);
    if (m == 0 || n == 0)
        return;
    if (k == 0 && cin != c) { /* c = cin */
        MT_CUDA_CHECK(cudaMemcpyAsync(c, cin, (size_t)(m * n) * (c_f32 ? 4 : 2),
                                      cudaMemcpyDeviceToDevice, s));
        return;
    }
    if (k == 0) {
        if (c_f32)
            mt_k_beta_only<float><<<mt_cuda_blocks(m * n, 256), 256, 0, s>>>((float *)c, m * n,
                                                                              beta);
        else
            mt_k_beta_only<__nv_bfloat16>
                <<<mt_cuda_blocks(m * n, 256), 256, 0, s>>>((__nv_bfloat16 *)c, m * n, beta);
        MT_CUDA_LAUNCH_CHECK("beta_only");
        return;
    }
    mt_cuda_ctx_t *ctx = mt_cuda_ctx(kernel);
    const lt_plan_t *p = lt_plan(ctx, c_f32, a, b, cin, c, m, n, k, ta, tb, kernel);
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt_handle(ctx), p->desc, &alpha, b, p->la, a, p->lb, &beta, cin,
                                p->lc, c, p->lc, &p->algo, ctx->lt_workspace,
                                ctx->lt_workspace_bytes, s));
}

extern "C" void mt_cuda_launch_matmul_bf16(cudaStream_t s, uint16_t *c, const uint16_t *a,
                                           const uint16_t *b, int64_t m, int64_t n, int64_t k,
                                           bool ta, bool tb, float beta)
{
    matmul_lt(s, c, c, false, a, b, m, n, k, ta, tb, beta, "matmul_bf16");
}

/* c = r + op(a) op(b), bf16: cuBLASLt reads r as C and writes c as D, so
 * a residual branch's output projection needs no copy of the residual
 * first (the bits of that copy and a beta-1 GEMM: the same C values, the
 * same fp32 sum, one rounding) */
extern "C" void mt_cuda_launch_matmul_bf16_add(cudaStream_t s, uint16_t *c, const uint16_t *r,
                                               const uint16_t *a, const uint16_t *b, int64_t m,
                                               int64_t n, int64_t k, bool ta, bool tb)
{
    matmul_lt(s, c, r, false, a, b, m, n, k, ta, tb, 1.0f, "matmul_bf16_add");
}

extern "C" void mt_cuda_launch_matmul_bf16_f32out(cudaStream_t s, float *c, const uint16_t *a,
                                                  const uint16_t *b, int64_t m, int64_t n,
                                                  int64_t k, bool ta, bool tb, float beta)
{
    matmul_lt(s, c, c, true, a, b, m, n, k, ta, tb, beta, "matmul_bf16_f32out");
}

extern "C" void mt_cuda_launch_convert(cudaStream_t s, void *dst, const void *src, int64_t n,
                                       bool to_bf16)
{
    MT_CUDA_REQUIRE(n >= 0, "convert", "n=%lld", (long long)n);
    if (n == 0)
        return;
    if (to_bf16)
        convert<__nv_bfloat16, float>(s, dst, src, n);
    else
        convert<float, __nv_bfloat16>(s, dst, src, n);
    MT_CUDA_LAUNCH_CHECK("convert");
}
