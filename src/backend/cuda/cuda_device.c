/* cuda_device.c: binding a rank to its GPU, device memory arenas, and the
 * CUDA error reporting the backend shares (mt_error_cuda, mt_cuda_die).
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
#include "mt_pool.h"

#define ARENA_ALIGN 256

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
    const size_t start = (a->used + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
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

/* ------------------------------------------------------------------ the pool */

static mt_pool_t pool;
static char *pool_base;

mt_status_t mt_cuda_pool_init(mt_cuda_arena_t *a)
{
    const size_t start = (a->used + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    size_t rest = start < a->size ? a->size - start : 0;
    void *base = NULL;
    MT_TRY(mt_cuda_arena_alloc(a, rest, &base));
    MT_TRY(mt_pool_init(&pool, rest));
    pool_base = (char *)base;
    return MT_OK;
}

void *mt_cuda_pool_alloc(size_t bytes)
{
    size_t off;
    if (!pool_base || !mt_pool_alloc(&pool, bytes, &off))
        return NULL;
    return pool_base + off;
}

bool mt_cuda_pool_free(void *p)
{
    char *c = (char *)p;
    if (!pool_base || c < pool_base || c >= pool_base + pool.cap)
        return false;
    /* kernels and copies already queued may still use it: the block is
     * reused only after they are done */
    (void)mt_cuda_synchronize();
    return mt_pool_free(&pool, (size_t)(c - pool_base));
}

void mt_cuda_pool_stats(size_t *size, size_t *used, size_t *peak)
{
    *size = pool_base ? pool.cap : 0;
    *used = pool_base ? pool.used : 0;
    *peak = pool_base ? pool.peak : 0;
}

mt_status_t mt_cuda_setup(MPI_Comm node_comm, size_t scratch_bytes, mt_cuda_device_t *dev,
                          size_t *reserved)
{
    static mt_cuda_arena_t arena; /* the process's one reservation */
    static mt_cuda_device_t bound;
    if (arena.base) { /* set up already (a second training run in this process) */
        *dev = bound;
        *reserved = arena.size;
        return MT_OK;
    }
    /* ranks of this node on the same physical GPU, by PCI bus id (each rank
     * may see only its own GPU, under --gpus-per-task or a per-rank
     * CUDA_VISIBLE_DEVICES): every rank joins the exchange, also one
     * whose binding failed, and fails after it */
    mt_status_t s = mt_cuda_device_init(dev, node_comm);
    enum { ID = 32 };
    char bus[ID] = "";
    if (s == MT_OK && cudaDeviceGetPCIBusId(bus, ID, dev->device) != cudaSuccess)
        (void)cudaGetLastError(), snprintf(bus, ID, "ordinal-%d", dev->device);
    int nodes = 1;
    MT_MPI_TRY(MPI_Comm_size(node_comm, &nodes));
    char *all = malloc((size_t)nodes * ID);
    if (!all)
        MT_FAIL(MT_ERR_NOMEM, "GPU bus ids");
    int rc = MPI_Allgather(bus, ID, MPI_CHAR, all, ID, MPI_CHAR, node_comm);
    int share = 0;
    for (int r = 0; rc == MPI_SUCCESS && bus[0] && r < nodes; r++)
        share += strncmp(all + (size_t)r * ID, bus, ID) == 0;
    free(all);
    MT_TRY(s);
    MT_MPI_TRY(rc);
    dev->sharing = share;
    const char *e = getenv("MT_CUDA_MEMORY_FRACTION");
    double fraction = e && atof(e) > 0 && atof(e) <= 1 ? atof(e) : MT_CUDA_MEMORY_SHARE;
    size_t free_b = 0, total_b = 0;
    MT_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    size_t want = (size_t)((double)total_b * fraction / (share > 0 ? share : 1));
    size_t margin = (size_t)512 << 20;
    if (want > free_b - (free_b > margin ? margin : free_b))
        want = free_b > margin ? free_b - margin : 0;
    if (want < scratch_bytes + ((size_t)64 << 20))
        MT_FAIL(MT_ERR_NOMEM, "GPU %d (%s): %zu MiB free, too little to reserve for training "
                "(MT_CUDA_MEMORY_FRACTION %.2f, %d ranks on it)", dev->device, dev->name,
                free_b >> 20, fraction, share);
    MT_TRY(mt_cuda_arena_init(&arena, "training", want));
    MT_TRY(mt_cuda_backend_init(&arena, scratch_bytes));
    MT_TRY(mt_cuda_pool_init(&arena));
    *reserved = want;
    bound = *dev;
    return MT_OK;
}
