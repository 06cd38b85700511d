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
 * memory (mt_backend_t.host_memory): nothing is staged and MPI works on
 * it directly.
 *
 * Users: fsdp.c, ddp.c and train.c (data and tensor parallelism, with
 * their own host regions for what they keep in flight), ring_attention.c
 * (the context-parallel K/V and dK/dV ring, through the point-to-point
 * helpers below), moe_dispatch.c (the expert-parallel row all-to-alls)
 * and train_moe.c (the expert gradients' all-reduce; the sharded experts
 * go through fsdp.c).  The pipeline's sends and receives stage in
 * pp_exec.c itself (its messages carry the MoE routing totals too), the
 * tensor-parallel collectives in tp_comm.c. */
#ifndef MT_STAGE_H
#define MT_STAGE_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

#include "mt_backend.h"
#include "mt_comm_bf16.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A host buffer for blocking staged collectives, grown on demand (and
 * what mt_stage_allreduce_grad's bf16 messages need beside it). */
typedef struct {
    void *host;
    size_t cap;
    mt_bf16_comm_t wire;      /* bf16 type and sum, made on first use */
    void *dev;                /* NCCL's bf16 wire buffer, dev_be's memory */
    size_t dev_cap;
    const mt_backend_t *dev_be;
} mt_stage_buf_t;

/* At least `bytes` of host memory (contents not kept across growth), or
 * NULL when out of memory. */
void *mt_stage_reserve(mt_stage_buf_t *s, size_t bytes);
void mt_stage_buf_free(mt_stage_buf_t *s);

/* Blocking in-place sum of n floats of be's memory over comm, through s
 * when be needs staging (mt_allreduce on x itself otherwise). */
mt_status_t mt_stage_allreduce_sum(const mt_backend_t *be, mt_stage_buf_t *s, float *x, int n,
                                   MPI_Comm comm);

/* A gradient's blocking in-place sum of n floats of be's memory over
 * comm, in the reduce dtype: float32 as mt_stage_allreduce_sum, or with
 * bf16 as bf16 messages summed by mt_comm_bf16.h's op (NCCL: ncclBfloat16)
 * and landing as float32 holding bf16 values, in pieces of at most 2^24
 * elements (32 MiB messages, and buffers of that size). */
mt_status_t mt_stage_allreduce_grad(const mt_backend_t *be, mt_stage_buf_t *s, float *x,
                                    int64_t n, MPI_Comm comm, bool bf16);

/* MPI_Alltoallv (waiting politely, mt_wait_all) of `row`s of
 * row_bytes each between send and recv in be's memory; counts and
 * displacements are in rows, the displacements packed in rank order (each
 * block right after the previous one).  Staged: the sent rows are copied
 * out into hs, received into hr and copied in.  Through NCCL (a GPU per
 * rank) it is enqueued after the compute so far; with ticket NULL the
 * compute stream then waits for it, else *ticket is its event for
 * mt_stage_join (NULL when the exchange has already completed: MPI). */
mt_status_t mt_stage_alltoallv(const mt_backend_t *be, mt_stage_buf_t *hs, mt_stage_buf_t *hr,
                               const void *send, const int *scounts, const int *sdispls,
                               void *recv, const int *rcounts, const int *rdispls,
                               MPI_Datatype row, size_t row_bytes, MPI_Comm comm,
                               void **ticket);

/* The compute stream waits for the collective of ticket (an NCCL
 * operation's event from mt_stage_alltoallv or the trainer's TP hook);
 * nothing for NULL. */
mt_status_t mt_stage_join(void *ticket);

/* Non-blocking point-to-point of n floats of be's memory.  host: NULL
 * when !mt_stage_needed(be) (MPI then works on x itself), else a host
 * buffer of n floats that belongs to the request until it completes.
 * isend copies x into host first (x may change at once); after the wait
 * that completes a receive, mt_stage_recv_finish copies it into x. */
mt_status_t mt_stage_isend(const mt_backend_t *be, float *host, const float *x, int n, int dest,
                           int tag, MPI_Comm comm, MPI_Request *rq);
mt_status_t mt_stage_irecv(float *host, float *x, int n, int src, int tag, MPI_Comm comm,
                           MPI_Request *rq);
void mt_stage_recv_finish(const mt_backend_t *be, const float *host, float *x, int n);

#ifdef __cplusplus
}
#endif
#endif
