/* cuda_context.cu: the CUDA backend's context, one per process (one GPU
 * per rank): the stream every kernel runs on, the cuBLAS and cuBLASLt
 * handles, the device scratch and the pinned host buffer.
 *
 * The launchers of the kernel files and the tables of cuda_backend.cu and
 * cuda_storage.cu reach it through mt_cuda_ctx, mt_cuda_scratch and
 * mt_cuda_host; it calls nothing of theirs (the tables' file tears down
 * the GEMMs' kept plans with it: mt_cuda_backend_free).  It is not
 * thread-safe, and every kernel shares the one scratch area, which stream
 * order protects.  Communication streams live in nccl_comm.c. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <string.h>

#include "cuda_internal.h"

static mt_cuda_ctx_t ctx;

extern "C" mt_cuda_ctx_t *mt_cuda_ctx(const char *kernel)
{
    if (!ctx.ready)
        mt_cuda_die(kernel, "the CUDA backend is not initialised: call mt_cuda_backend_init first",
                    __FILE__, __LINE__);
    return &ctx;
}

/* one of the context's fixed buffers, which must hold `bytes` */
static void *fixed_buffer(const char *kernel, const char *what, void *buf, size_t have,
                          size_t bytes)
{
    mt_cuda_ctx(kernel);
    if (bytes > have) {
        char msg[160];
        snprintf(msg, sizeof msg, "needs %zu bytes of %s, the backend has %zu", bytes, what, have);
        mt_cuda_die(kernel, msg, __FILE__, __LINE__);
    }
    return buf;
}

extern "C" void *mt_cuda_scratch(const char *kernel, size_t bytes)
{
    return fixed_buffer(kernel, "scratch", ctx.scratch, ctx.scratch_bytes, bytes);
}

extern "C" char *mt_cuda_host(const char *kernel, size_t bytes)
{
    return (char *)fixed_buffer(kernel, "host staging", ctx.host, ctx.host_bytes, bytes);
}

extern "C" mt_status_t mt_cuda_backend_init(mt_cuda_arena_t *arena, size_t scratch_bytes)
{
    if (ctx.ready)
        MT_FAIL(MT_ERR_INTERNAL, "the CUDA backend is already initialised");
    memset(&ctx, 0, sizeof ctx);
    MT_CUDA_TRY(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
    cublasHandle_t h;
    cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS)
        MT_FAIL(MT_ERR_INTERNAL, "cublasCreate failed: %s", cublasGetStatusString(st));
    ctx.cublas = h;
    cublasLtHandle_t lt;
    st = cublasLtCreate(&lt);
    if (st != CUBLAS_STATUS_SUCCESS)
        MT_FAIL(MT_ERR_INTERNAL, "cublasLtCreate failed: %s", cublasGetStatusString(st));
    ctx.cublaslt = lt;
    /* fp32 GEMMs stay fp32: no TF32 unless asked for (NVIDIA_TF32_OVERRIDE) */
    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    /* cuBLASLt's recommendation for Hopper */
    MT_TRY(mt_cuda_arena_alloc(arena, MT_CUDA_LT_WORKSPACE_BYTES, &ctx.lt_workspace));
    ctx.lt_workspace_bytes = MT_CUDA_LT_WORKSPACE_BYTES;
    void *scratch = NULL;
    MT_TRY(mt_cuda_arena_alloc(arena, scratch_bytes, &scratch));
    ctx.scratch = (char *)scratch;
    ctx.scratch_bytes = scratch_bytes;
    void *host = NULL;
    MT_CUDA_TRY(cudaMallocHost(&host, scratch_bytes));
    ctx.host = (char *)host;
    ctx.host_bytes = scratch_bytes;
    ctx.ready = 1;
    return MT_OK;
}

extern "C" void mt_cuda_context_free(void)
{
    if (!ctx.ready)
        return;
    cudaStreamSynchronize(ctx.stream);
    cublasLtDestroy((cublasLtHandle_t)ctx.cublaslt);
    cublasDestroy((cublasHandle_t)ctx.cublas);
    cudaFreeHost(ctx.host);
    cudaStreamDestroy(ctx.stream);
    memset(&ctx, 0, sizeof ctx); /* the scratch belongs to the caller's arena */
}

extern "C" void *mt_cuda_stream(void)
{
    return mt_cuda_ctx("mt_cuda_stream")->stream;
}

extern "C" mt_status_t mt_cuda_synchronize(void)
{
    MT_CUDA_TRY(cudaStreamSynchronize(mt_cuda_ctx("mt_cuda_synchronize")->stream));
    return MT_OK;
}
