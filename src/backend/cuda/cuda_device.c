/* cuda_device.c: binding a rank to its GPU, device memory arenas, and the
 * CUDA error reporting the backend shares (mt_error_cuda, mt_cuda_die).
 * The lowest of the CUDA backend's files: it calls none of the others.
 *
 * A rank takes the GPU of its node-local rank (local_rank % device_count),
 * from the node communicator the caller passes (MPI_Comm_split_type with
 * MPI_COMM_TYPE_SHARED): the library never uses MPI_COMM_WORLD.  Device
 * memory comes from arenas: one cudaMalloc each and a bump allocator, no
 * managed memory, nothing freed piecemeal.  It does not choose arena
 * sizes: the model's memory plan does that (doc/gpu.md). */
#include "config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

mt_status_t mt_error_cuda(int err, const char *call, const char *file, int line)
{
    const cudaError_t e = (cudaError_t)err;
    const mt_status_t st = e == cudaErrorMemoryAllocation ? MT_ERR_NOMEM : MT_ERR_INTERNAL;
    mt_error_set(st, file, line, "%s failed: %s (%s)", call, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
        mt_error_hint("check that nvidia-smi lists a GPU, that CUDA_VISIBLE_DEVICES is not empty "
                      "and that the driver supports this CUDA toolkit");
        break;
    case cudaErrorMemoryAllocation:
        mt_error_hint("the GPU is out of memory: lower training.micro_batch_size or the sequence "
                      "length, or shard more (FSDP); meshtrain-plan estimates the memory");
        break;
    case cudaErrorInvalidDevice:
        mt_error_hint("more ranks per node than GPUs, or CUDA_VISIBLE_DEVICES hides some: check "
                      "the job's --gpus-per-node and the binding script");
        break;
    default:
        mt_error_hint("rerun with CUDA_LAUNCH_BLOCKING=1 to report the failing kernel where it "
                      "fails, or under compute-sanitizer");
        break;
    }
    return st;
}

void mt_cuda_die(const char *what, const char *detail, const char *file, int line)
{
    fprintf(stderr, "meshtrain cuda backend: %s failed at %s:%d: %s\n", what, file, line,
            detail ? detail : "");
    fprintf(stderr, "hint: rerun with CUDA_LAUNCH_BLOCKING=1 (or under compute-sanitizer) to "
                    "see which kernel failed\n");
    abort();
}

int mt_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no device: not sticky, clear it */
        return 0;
    }
    return n;
}

mt_status_t mt_cuda_device_init(mt_cuda_device_t *dev, MPI_Comm node_comm)
{
    memset(dev, 0, sizeof *dev);
    MT_MPI_TRY(MPI_Comm_rank(node_comm, &dev->local_rank));
    MT_MPI_TRY(MPI_Comm_size(node_comm, &dev->local_size));
    dev->device_count = mt_cuda_device_count();
    if (dev->device_count == 0) {
        mt_error_set(MT_ERR_UNSUPPORTED, __FILE__, __LINE__,
                     "no CUDA device is visible to node-local rank %d", dev->local_rank);
        mt_error_hint("run on a GPU node, check CUDA_VISIBLE_DEVICES, or use the CPU backend");
        return MT_ERR_UNSUPPORTED;
    }
    /* More ranks than GPUs on a node share them round-robin: the
     * MPI-staged fallback that lets multi-rank code paths run on one GPU. */
    dev->device = dev->local_rank % dev->device_count;
    MT_CUDA_TRY(cudaSetDevice(dev->device));
    struct cudaDeviceProp p;
    MT_CUDA_TRY(cudaGetDeviceProperties(&p, dev->device));
    snprintf(dev->name, sizeof dev->name, "%s", p.name);
    dev->cc_major = p.major;
    dev->cc_minor = p.minor;
    dev->sm_count = p.multiProcessorCount;
    dev->total_mem = p.totalGlobalMem;
    return MT_OK;
}

/* ------------------------------------------------------------------ arenas */

mt_status_t mt_cuda_arena_init(mt_cuda_arena_t *a, const char *name, size_t bytes)
{
    memset(a, 0, sizeof *a);
    a->name = name ? name : "device";
    if (bytes == 0)
        return MT_OK;
    void *p = NULL;
    MT_CUDA_TRY(cudaMalloc(&p, bytes));
    a->base = (char *)p;
    a->size = bytes;
    return MT_OK;
}

mt_status_t mt_cuda_arena_alloc(mt_cuda_arena_t *a, size_t bytes, void **out)
{
    const size_t start = mt_cuda_arena_next(a);
    if (start > a->size || bytes > a->size - start) {
        *out = NULL;
        mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__,
                     "device arena \"%s\": %zu bytes requested, %zu of %zu in use", a->name,
                     bytes, a->used, a->size);
        mt_error_hint("the memory plan sized this arena too small: a bug if meshtrain-plan "
                      "sized it, otherwise give the arena more memory");
        return MT_ERR_NOMEM;
    }
    *out = a->base + start;
    a->used = start + bytes;
    if (a->used > a->peak)
        a->peak = a->used;
    return MT_OK;
}

void mt_cuda_arena_reset(mt_cuda_arena_t *a)
{
    a->used = 0;
}

void mt_cuda_arena_free(mt_cuda_arena_t *a)
{
    if (a->base)
        (void)cudaFree(a->base);
    memset(a, 0, sizeof *a);
}
