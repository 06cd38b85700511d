/* cuda_setup.c: the trainer's bring-up of the CUDA backend on a rank
 * (mt_cuda_setup: the GPU binding, the one reservation, the context on it)
 * and the device-memory pool made of what the reservation has left.
 *
 * Above the context (cuda_context.cu): it initialises the context, and the
 * pool waits for the context's stream before it reuses a block.  C, so the
 * NCCL emulation (tests/emu/nccl) compiles it as is against its stand-in
 * for the .cu files. */
#include "config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "mt_pool.h"

/* ------------------------------------------------------------------ the pool */

static mt_pool_t pool;
static char *pool_base;

mt_status_t mt_cuda_pool_init(mt_cuda_arena_t *a)
{
    const size_t start = mt_cuda_arena_next(a);
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
