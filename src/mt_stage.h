/* mt_stage.h: collectives on backend memory, staged through host buffers.
 *
 * MPI is given host pointers.  A backend whose memory is not host memory
 * (cuda, cpu_guarded) has a collective's operands copied out with
 * copy_to_host, the collective run on the host copy, and the result
 * copied back with copy_to_device; a non-blocking collective keeps its
 * host buffer until the wait that completes it, then copies back.  This
 * is the fallback that lets several ranks share one GPU (and run without
 * CUDA-aware MPI or NCCL): two copies per collective and host buffers the
 * size of what is in flight.  The plain CPU backend's memory is host
 * memory: nothing is staged and MPI works on it directly, as before.
 *
 * The pipeline's sends and receives stage in pp_exec.c itself (its send
 * buffers were host copies already).  Not staged: the context- and
 * expert-parallel exchanges (ring_attention.c, moe_dispatch.c,
 * train_moe.c); validation refuses those off the CPU on more than one
 * rank (doc/gpu.md). */
#ifndef MT_STAGE_H
#define MT_STAGE_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

#include "mt_backend.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* true when MPI may not be handed be's memory directly: every backend but
 * the plain CPU one. */
bool mt_stage_needed(const mt_backend_t *be);

/* A host buffer for blocking staged collectives, grown on demand. */
typedef struct {
    void *host;
    size_t cap;
} mt_stage_buf_t;

/* At least `bytes` of host memory (contents not kept across growth), or
 * NULL when out of memory. */
void *mt_stage_reserve(mt_stage_buf_t *s, size_t bytes);
void mt_stage_buf_free(mt_stage_buf_t *s);

/* Blocking in-place sum of n floats of be's memory over comm, through s
 * when be needs staging (mt_allreduce on x itself otherwise). */
mt_status_t mt_stage_allreduce_sum(const mt_backend_t *be, mt_stage_buf_t *s, float *x, int n,
                                   MPI_Comm comm);

#ifdef __cplusplus
}
#endif
#endif
