/* emu_blas.cc: cuBLAS and cuBLASLt for the host emulation of the CUDA
 * kernels (tests/emu/cuda).  Host loops, fp32 accumulation in k order,
 * after the stream's queued work; what is checked is what the library
 * would refuse: negative sizes, leading dimensions below the stored
 * rows, operand types, and (cuBLASLt) layouts whose shapes do not agree
 * with the transposes.  CUBLAS_COMPUTE_32F_FAST_16BF rounds each operand
 * element to bf16 first, as the tensor cores see them. */
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cublasLt.h"
#include "cublas_v2.h"
#include <cuda_bf16.h>
#include "emu.h"

struct mt_emu_cublas {
    cudaStream_t s;
};
struct mt_emu_cublaslt {
    int unused;
};
struct mt_emu_lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta, tb;
};
struct mt_emu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
struct mt_emu_lt_pref {
    size_t workspace;
    uint32_t align[4]; /* A, B, C, D; 0: cuBLASLt's default, 256 */
};
static const uint64_t algo_magic = 0x6d74656d75616c67ull; /* a heuristic's result */

static float load(const void *p, cudaDataType t, int64_t i)
{
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    __nv_bfloat16 h;
    memcpy(&h, (const uint16_t *)p + i, 2);
    return __bfloat162float(h);
}

static void store(void *p, cudaDataType t, int64_t i, float x)
{
    if (t == CUDA_R_32F)
        ((float *)p)[i] = x;
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
}

static float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/* device memory (or pinned host memory), as the library needs; NULL only
 * where nothing is read */
static bool on_device(const char *call, const char *what, const void *p)
{
    if (p && mt_emu_device_ptr(p))
        return true;
    fprintf(stderr, "CUDA kernel emulation: %s: %s %p is not device memory\n", call, what, p);
    return false;
}

static bool overlap(const void *p, size_t pb, const void *q, size_t qb)
{
    const char *a = (const char *)p, *b = (const char *)q;
    return pb && qb && a < b + qb && b < a + pb;
}

/* column-major C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C; beta 0 never
 * reads C (it may hold NaN) */
static cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                           int64_t k, float alpha, const void *A, cudaDataType at, int64_t lda,
                           const void *B, cudaDataType bt, int64_t ldb, float beta, const void *C,
                           cudaDataType ct, int64_t ldc, void *D, int64_t ldd, bool fast_bf16)
{
    if (m < 0 || n < 0 || k < 0 || (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) ||
        (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE;
    const int64_t arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
        ldc < (m > 1 ? m : 1) || ldd < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!on_device("gemm", "A", A) || !on_device("gemm", "B", B) || !on_device("gemm", "D", D) ||
        (beta != 0.0f && !on_device("gemm", "C", C)))
        return CUBLAS_STATUS_INVALID_VALUE;
    const size_t es = ct == CUDA_R_32F ? 4 : 2, ea = at == CUDA_R_32F ? 4 : 2,
                 eb = bt == CUDA_R_32F ? 4 : 2;
    const size_t dbytes = m && n && k ? (size_t)((n - 1) * ldd + m) * es : 0;
    if (dbytes && (overlap(D, dbytes, A, (size_t)(((ta == CUBLAS_OP_N ? k : m) - 1) * lda + arows) * ea) ||
        overlap(D, dbytes, B, (size_t)(((tb == CUBLAS_OP_N ? n : k) - 1) * ldb + brows) * eb))) {
        fprintf(stderr, "CUDA kernel emulation: gemm: the output overlaps an input (undefined)\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    std::vector<float> out((size_t)(m * n));
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            float s = 0.0f;
            for (int64_t p = 0; p < k; p++) {
                float a = load(A, at, ta == CUBLAS_OP_N ? i + p * lda : p + i * lda);
                float b = load(B, bt, tb == CUBLAS_OP_N ? p + j * ldb : j + p * ldb);
                if (fast_bf16)
                    a = bf16_round(a), b = bf16_round(b);
                s += a * b;
            }
            float r = alpha * s;
            if (beta != 0.0f)
                r += beta * load(C, ct, i + j * ldc);
            out[(size_t)(i + j * m)] = r;
        }
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++)
            store(D, ct, i + j * ldd, out[(size_t)(i + j * m)]);
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = (cublasHandle_t)calloc(1, sizeof(mt_emu_cublas));
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->s = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    (void)h;
    return mode == CUBLAS_DEFAULT_MATH ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

const char *cublasGetStatusString(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    mt_emu_drain(h->s);
    return gemm(ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C,
                CUDA_R_32F, ldc, C, ldc, false);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                            int lda, const void *B, cudaDataType Btype, int ldb, const void *beta,
                            void *C, cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    /* fp32 compute types take fp32 alpha and beta */
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_16BF)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (Atype != Btype || (compute == CUBLAS_COMPUTE_32F_FAST_16BF &&
                           (Atype != CUDA_R_32F || Ctype != CUDA_R_32F)))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    mt_emu_drain(h->s);
    return gemm(ta, tb, m, n, k, *(const float *)alpha, A, Atype, lda, B, Btype, ldb,
                *(const float *)beta, C, Ctype, ldc, C, ldc,
                compute == CUBLAS_COMPUTE_32F_FAST_16BF);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = (cublasLtHandle_t)calloc(1, sizeof(mt_emu_cublaslt));
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    *d = (cublasLtMatmulDesc_t)calloc(1, sizeof(mt_emu_lt_desc));
    if (!*d)
        return CUBLAS_STATUS_ALLOC_FAILED;
    (*d)->compute = compute, (*d)->scale = scale;
    (*d)->ta = (*d)->tb = CUBLAS_OP_N;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t bytes)
{
    if (bytes != sizeof(int32_t))
        return CUBLAS_STATUS_INVALID_VALUE;
    int32_t v;
    memcpy(&v, buf, sizeof v);
    if (a == CUBLASLT_MATMUL_DESC_TRANSA)
        d->ta = (cublasOperation_t)v;
    else if (a == CUBLASLT_MATMUL_DESC_TRANSB)
        d->tb = (cublasOperation_t)v;
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (ld < (int64_t)(rows > 1 ? rows : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    *l = (cublasLtMatrixLayout_t)calloc(1, sizeof(mt_emu_lt_layout));
    if (!*l)
        return CUBLAS_STATUS_ALLOC_FAILED;
    (*l)->type = type, (*l)->rows = rows, (*l)->cols = cols, (*l)->ld = ld;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = (cublasLtMatmulPreference_t)calloc(1, sizeof(mt_emu_lt_pref));
    return *p ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t bytes)
{
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && bytes == sizeof(uint64_t)) {
        memcpy(&p->workspace, buf, sizeof p->workspace);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
        a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && bytes == sizeof(uint32_t)) {
        memcpy(&p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeof(uint32_t));
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

/* m, n from D; k from op(A); op(B) must be k x n and C like D */
static cublasStatus_t lt_shape(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                               cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                               cublasLtMatrixLayout_t dd, int64_t *m, int64_t *n, int64_t *k)
{
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a->type != b->type || c->type != dd->type)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *m = (int64_t)dd->rows, *n = (int64_t)dd->cols;
    const int64_t am = (int64_t)(d->ta == CUBLAS_OP_N ? a->rows : a->cols);
    *k = (int64_t)(d->ta == CUBLAS_OP_N ? a->cols : a->rows);
    const int64_t bk = (int64_t)(d->tb == CUBLAS_OP_N ? b->rows : b->cols);
    const int64_t bn = (int64_t)(d->tb == CUBLAS_OP_N ? b->cols : b->rows);
    if (am != *m || bk != *k || bn != *n || c->rows != dd->rows || c->cols != dd->cols)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t *results,
                                              int *returned)
{
    (void)h;
    int64_t m, n, k;
    const cublasStatus_t st = lt_shape(d, a, b, c, dd, &m, &n, &k);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (requested < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(results, 0, sizeof *results);
    for (int i = 0; i < 4; i++) /* what the algorithm may assume */
        results->algo.data[i] = p->align[i] ? p->align[i] : 256;
    results->algo.data[4] = algo_magic;
    results->state = CUBLAS_STATUS_SUCCESS;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a, const void *B,
                              cublasLtMatrixLayout_t b, const void *beta, const void *C,
                              cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t s)
{
    (void)h;
    int64_t m, n, k;
    cublasStatus_t st = lt_shape(d, a, b, c, dd, &m, &n, &k);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (workspace_bytes && !on_device("cublasLtMatmul", "workspace", workspace))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (C == D && (c->ld != dd->ld || c->type != dd->type)) /* in place: one layout */
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!algo || algo->data[4] != algo_magic) {
        fprintf(stderr, "CUDA kernel emulation: cublasLtMatmul without a heuristic's algorithm\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const void *ptr[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ptr[i] % algo->data[i]) {
            fprintf(stderr,
                    "CUDA kernel emulation: cublasLtMatmul: %c = %p is not %llu-byte aligned, "
                    "as the algorithm assumes (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)\n",
                    "ABCD"[i], ptr[i], (unsigned long long)algo->data[i], "ABCD"[i]);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    mt_emu_drain(s);
    return gemm(d->ta, d->tb, m, n, k, *(const float *)alpha, A, a->type, a->ld, B, b->type,
                b->ld, *(const float *)beta, C, c->type, c->ld, D, dd->ld, false);
}

} /* extern "C" */
