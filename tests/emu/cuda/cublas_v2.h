/* cublas_v2.h: the cuBLAS subset of src/backend/cuda/cuda_matmul.cu and
 * src/backend/cuda/cuda_backend.cu, for the host emulation of the CUDA kernels
 * (tests/emu/cuda; the GEMMs are host loops in emu_blas.cc that check
 * their arguments as cuBLAS documents them: column-major operands,
 * leading dimensions, transposes).  Enumerator values are cuBLAS 13's. */
#ifndef MT_EMU_CUBLAS_V2_H
#define MT_EMU_CUBLAS_V2_H

#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;
typedef cudaDataType cudaDataType_t;

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_16BF = 75 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

typedef struct mt_emu_cublas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
const char *cublasGetStatusString(cublasStatus_t st);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                            int lda, const void *B, cudaDataType Btype, int ldb, const void *beta,
                            void *C, cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);

#ifdef __cplusplus
}
#endif
#endif
