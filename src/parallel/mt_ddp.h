/* mt_ddp.h: the ddp strategy's gradient reduction.
 *
 * Parameters are replicated; gradients are summed over the data-parallel
 * group in buckets of about distributed.ddp_bucket_cap_mb.  A bucket's
 * MPI_Iallreduce starts as soon as backward has finished every gradient in
 * it (the model's unit hook), so communication overlaps the rest of
 * backward.  With gradient accumulation only the last micro-step reduces
 * (like PyTorch DDP's no_sync).  The model's loss scale is 1 / (global
 * token count), so the summed gradient is the global token mean.  Off
 * host memory (mt_stage.h) a bucket is copied to a host staging buffer
 * when it starts and back when mt_ddp_finish has waited for it.  With
 * reduce_bf16 (reduce_dtype bfloat16, mt_comm_bf16.h) a bucket is rounded
 * to bf16 in a host buffer when it starts, summed in bf16, and widened
 * back after the wait: the gradients are then float32 copies of bf16
 * values.  The bucket cap counts float32 gradient bytes either way, so
 * the buckets are the same and bf16 messages are half the cap. */
#ifndef MT_DDP_H
#define MT_DDP_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "mt_comm_bf16.h"
#include "mt_model.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t offset, count; /* range of the gradient arena */
} mt_ddp_bucket_t;

typedef struct {
    MPI_Comm comm;
    int size;
    mt_model_t *model;
    mt_ddp_bucket_t *buckets; /* from the end of the arena backwards */
    MPI_Request *reqs;        /* one per bucket */
    int nbuckets, next;       /* next bucket to launch */
    bool sync;                /* reduce during this backward */
    bool overlap;             /* start buckets during backward (default true) */
    float *staged;            /* host copy of the gradient arena when the
                               * backend's memory is not host memory, or NULL */
    uint16_t *wire;           /* bf16 copy of the gradient arena (reduce_bf16), or NULL */
    mt_bf16_comm_t bf16;
    /* NCCL (distributed.collectives, doc/gpu.md): the group of comm
     * (an mt_nccl_group_t) when the buckets go through NCCL on device
     * memory, else NULL; pad: device bf16 space for one bucket */
    void *nccl, *pad;
    const mt_backend_t *pad_be;
    bool reduce_bf16;
} mt_ddp_t;

/* Buckets over the model's parameters, in backward order; registers the
 * model's unit hook.  comm is the data-parallel group; reduce_bf16 sums in
 * bf16 (above). */
mt_status_t mt_ddp_init(mt_ddp_t *d, MPI_Comm comm, mt_model_t *m, int64_t bucket_bytes,
                        bool reduce_bf16);

void mt_ddp_free(mt_ddp_t *d);

/* Before each micro-step's backward: sync true on the last one. */
void mt_ddp_begin(mt_ddp_t *d, bool sync);

/* After the last micro-step: launch what is left, wait for every bucket. */
mt_status_t mt_ddp_finish(mt_ddp_t *d);

#ifdef __cplusplus
}
#endif
#endif
