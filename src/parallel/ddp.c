/* ddp.c: bucketed, overlapped gradient all-reduce for strategy ddp.
 * Staged through a host copy of the gradient arena off host memory; bf16
 * buckets (reduce_bf16) travel in a host bf16 copy of the arena. */
/* MPICH annotates MPI_STATUSES_IGNORE arguments with access sizes that
 * GCC 12 misreads as an overflow of a zero-sized region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include <config.h>

#include "mt_ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_comm.h"
#include "mt_stage.h"
#ifdef MT_HAVE_NCCL
#include "mt_cuda.h"
#include "mt_nccl.h"

/* A bucket through NCCL, on device memory: no staging. */
static void launch_nccl(mt_ddp_t *d, const mt_ddp_bucket_t *b)
{
    if (mt_nccl_all_reduce_f32(d->nccl, d->model->grad_mem + b->offset, (size_t)b->count, d->pad,
                               d->reduce_bf16, (cudaStream_t)mt_cuda_stream()) != MT_OK)
        mt_comm_fatal(d->comm, MPI_ERR_OTHER, "gradient bucket all-reduce (NCCL)");
}
#endif

static void launch(mt_ddp_t *d, int64_t from)
{
    while (d->next < d->nbuckets && d->buckets[d->next].offset >= from) {
        mt_ddp_bucket_t *b = &d->buckets[d->next];
        float *g = d->model->grad_mem + b->offset;
        int rc;
#ifdef MT_HAVE_NCCL
        if (d->nccl) {
            launch_nccl(d, b);
            d->next++;
            continue;
        }
#endif
        if (d->wire) { /* final: round the bucket out (through the staging copy off the host) */
            uint16_t *w = d->wire + b->offset;
            mt_bf16_pack_from(d->model->be, w, g, d->staged ? d->staged + b->offset : NULL,
                              b->count);
            rc = MPI_Iallreduce(MPI_IN_PLACE, w, (int)b->count, d->bf16.type, d->bf16.sum, d->comm,
                                &d->reqs[d->next]);
            d->next++;
            if (rc != MPI_SUCCESS)
                mt_comm_fatal(d->comm, rc, "gradient bucket all-reduce (bf16)");
            continue;
        }
        if (d->staged) { /* the bucket's gradients are final: copy them out */
            d->model->be->copy_to_host(d->staged + b->offset, g, sizeof(float) * (size_t)b->count);
            g = d->staged + b->offset;
        }
        rc = MPI_Iallreduce(MPI_IN_PLACE, g, (int)b->count, MPI_FLOAT, MPI_SUM, d->comm,
                                &d->reqs[d->next]);
        d->next++;
        if (rc != MPI_SUCCESS) /* the other ranks already wait for this bucket */
            mt_comm_fatal(d->comm, rc, "gradient bucket all-reduce");
    }
    /* Poke the progress engine so launched buckets move during backward. */
    if (d->next > 0) {
        int flag;
        MPI_Testall(d->next, d->reqs, &flag, MPI_STATUSES_IGNORE);
        (void)flag;
    }
}

static void hook(void *ctx, int unit, mt_unit_event_t ev)
{
    mt_ddp_t *d = ctx;
    if (ev == MT_UNIT_POST_BACKWARD && d->sync && d->overlap)
        launch(d, d->model->unit_lo[unit]);
}

mt_status_t mt_ddp_init(mt_ddp_t *d, MPI_Comm comm, mt_model_t *m, int64_t bucket_bytes,
                        bool reduce_bf16)
{
    memset(d, 0, sizeof *d);
    d->comm = comm, d->model = m;
    MT_MPI_TRY(MPI_Comm_size(comm, &d->size));
    int64_t cap = bucket_bytes / (int64_t)sizeof(float);
    if (cap < 1)
        cap = 1;
    d->buckets = calloc((size_t)m->nparams, sizeof *d->buckets);
    d->reqs = calloc((size_t)m->nparams, sizeof *d->reqs);
    if (!d->buckets || !d->reqs)
        MT_FAIL(MT_ERR_NOMEM, "ddp buckets");
    d->reduce_bf16 = reduce_bf16;
#ifdef MT_HAVE_NCCL
    if (d->size > 1) /* NCCL: device memory, no host copies (bf16 in a device pad, below) */
        d->nccl = mt_nccl_for(comm);
#endif
    bool host = d->size > 1 && !d->nccl; /* MPI on host memory */
    if (host && mt_stage_needed(m->be) &&
        !(d->staged = malloc(sizeof(float) * (size_t)(m->numel > 0 ? m->numel : 1))))
        MT_FAIL(MT_ERR_NOMEM, "host staging copy of the gradients (%lld floats)",
                (long long)m->numel);
    if (host && reduce_bf16) {
        MT_TRY(mt_bf16_comm_init(&d->bf16));
        if (!(d->wire = malloc(sizeof(uint16_t) * (size_t)(m->numel > 0 ? m->numel : 1))))
            MT_FAIL(MT_ERR_NOMEM, "host bf16 copy of the gradients (%lld values)",
                    (long long)m->numel);
    }
    /* Whole parameters, last first; a bucket closes once it reaches the cap. */
    int64_t end = m->numel, start = m->numel;
    for (int i = m->nparams - 1; i >= 0; i--) {
        start = m->params[i].offset;
        if (end - start >= cap || i == 0) {
            d->buckets[d->nbuckets].offset = start;
            d->buckets[d->nbuckets].count = end - start;
            d->reqs[d->nbuckets] = MPI_REQUEST_NULL;
            d->nbuckets++;
            end = start;
        }
    }
    if (d->nccl && d->reduce_bf16) { /* one bucket's bf16 values at a time, in stream order */
        int64_t most = 1;
        for (int i = 0; i < d->nbuckets; i++)
            most = d->buckets[i].count > most ? d->buckets[i].count : most;
        d->pad_be = m->be;
        if (!(d->pad = m->be->device_alloc(sizeof(uint16_t) * (size_t)most)))
            MT_FAIL(MT_ERR_NOMEM, "device bf16 space for a gradient bucket");
    }
    m->unit_hook = hook;
    m->hook_ctx = d;
    d->overlap = true;
    return MT_OK;
}

void mt_ddp_free(mt_ddp_t *d)
{
    if (d->model && d->model->hook_ctx == d) {
        d->model->unit_hook = NULL;
        d->model->hook_ctx = NULL;
    }
    free(d->buckets);
    free(d->reqs);
    free(d->staged);
    free(d->wire);
    if (d->pad)
        d->pad_be->device_free(d->pad);
    mt_bf16_comm_free(&d->bf16);
    memset(d, 0, sizeof *d);
}

void mt_ddp_begin(mt_ddp_t *d, bool sync)
{
    d->sync = sync && d->size > 1;
    d->next = 0;
    for (int i = 0; i < d->nbuckets; i++)
        d->reqs[i] = MPI_REQUEST_NULL;
}

mt_status_t mt_ddp_finish(mt_ddp_t *d)
{
    if (!d->sync)
        return MT_OK;
    launch(d, 0);
#ifdef MT_HAVE_NCCL
    if (d->nccl) { /* the compute stream waits for the buckets (on the device) */
        d->sync = false;
        return mt_nccl_join(d->nccl, (cudaStream_t)mt_cuda_stream());
    }
#endif
    mt_status_t s = mt_wait_all(d->nbuckets, d->reqs);
    d->sync = false;
    MT_TRY(s);
    for (int i = 0; d->wire && i < d->nbuckets; i++) {
        const mt_ddp_bucket_t *b = &d->buckets[i];
        mt_bf16_unpack_to(d->model->be, d->model->grad_mem + b->offset, d->wire + b->offset,
                          d->staged ? d->staged + b->offset : NULL, b->count);
    }
    for (int i = 0; d->staged && !d->wire && i < d->nbuckets; i++) {
        const mt_ddp_bucket_t *b = &d->buckets[i];
        d->model->be->copy_to_device(d->model->grad_mem + b->offset, d->staged + b->offset,
                                     sizeof(float) * (size_t)b->count);
    }
    return MT_OK;
}
