/* moe_dispatch.c: MPI all-to-alls that move MoE tokens between the ranks
 * of an expert-parallel group (the hook model_moe.c calls).  Counts first
 * (MPI_Alltoall), then rows (MPI_Alltoallv) in rank order, using a
 * contiguous row datatype so counts and displacements are rows, not
 * floats.  It deliberately keeps no routing logic: the model decides what
 * goes where; this file only ships it and counts the bytes and seconds
 * (bench/moe_bench.sh reads them).  The counts are host memory; the rows
 * are the backend's and go through mt_stage_alltoallv (host copies off
 * the plain CPU backend, MPI on the rows themselves on it). */
#include "moe_dispatch.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt_clock.h"
#include "mt_comm.h"

mt_status_t mt_moe_dispatch_init(mt_moe_dispatch_t *d, MPI_Comm ep, const mt_backend_t *be)
{
    memset(d, 0, sizeof *d);
    d->comm = ep, d->be = be;
    d->row = MPI_DATATYPE_NULL;
    MT_MPI_TRY(MPI_Comm_size(ep, &d->size));
    MT_MPI_TRY(MPI_Comm_rank(ep, &d->rank));
    d->sc = calloc((size_t)d->size, sizeof(int));
    d->sd = calloc((size_t)d->size, sizeof(int));
    d->rc = calloc((size_t)d->size, sizeof(int));
    d->rd = calloc((size_t)d->size, sizeof(int));
    if (!d->sc || !d->sd || !d->rc || !d->rd)
        MT_FAIL(MT_ERR_NOMEM, "all-to-all counts for %d ranks", d->size);
    return MT_OK;
}

void mt_moe_dispatch_free(mt_moe_dispatch_t *d)
{
    if (d->row != MPI_DATATYPE_NULL)
        MPI_Type_free(&d->row);
    free(d->sc), free(d->sd), free(d->rc), free(d->rd);
    mt_stage_buf_free(&d->h_send), mt_stage_buf_free(&d->h_recv);
    memset(d, 0, sizeof *d);
}

void mt_moe_dispatch_attach(mt_moe_dispatch_t *d, mt_model_t *m)
{
    m->ep_alltoall = mt_moe_dispatch_hook;
    m->ep_start = mt_moe_dispatch_start;
    m->ep_join = mt_moe_dispatch_join;
    m->ep_ctx = d;
}

void mt_moe_dispatch_hook(void *ctx, mt_ep_op_t op, const void *send, const int64_t *scounts,
                          void *recv, const int64_t *rcounts, int64_t width)
{
    mt_moe_dispatch_t *d = ctx;
    if (op == MT_EP_ROWS) {
        mt_moe_dispatch_join(ctx, mt_moe_dispatch_start(ctx, send, scounts, recv, rcounts, width));
        return;
    }
    MPI_Request rq;
    double t0 = mt_now_s();
    int rc = MPI_Ialltoall(send, (int)width, MPI_INT64_T, recv, (int)width, MPI_INT64_T, d->comm,
                           &rq);
    d->bytes_sent += (int64_t)sizeof(int64_t) * width * (d->size - 1);
    if (rc != MPI_SUCCESS || mt_wait_all(1, &rq) != MT_OK)
        mt_comm_fatal(d->comm, rc != MPI_SUCCESS ? rc : MPI_ERR_OTHER, "expert-parallel all-to-all");
    d->calls++;
    d->seconds += mt_now_s() - t0;
}

void *mt_moe_dispatch_start(void *ctx, const void *send, const int64_t *scounts, void *recv,
                            const int64_t *rcounts, int64_t width)
{
    mt_moe_dispatch_t *d = ctx;
    void *ticket = NULL;
    double t0 = mt_now_s();
    if (d->row_width != width) {
        if (d->row != MPI_DATATYPE_NULL)
            MPI_Type_free(&d->row);
        MPI_Type_contiguous((int)width, MPI_FLOAT, &d->row);
        MPI_Type_commit(&d->row);
        d->row_width = width;
    }
    int so = 0, ro = 0;
    for (int r = 0; r < d->size; r++) {
        d->sc[r] = (int)scounts[r], d->sd[r] = so, so += d->sc[r];
        d->rc[r] = (int)rcounts[r], d->rd[r] = ro, ro += d->rc[r];
        if (r != d->rank)
            d->bytes_sent += (int64_t)sizeof(float) * width * scounts[r];
    }
    if (mt_stage_alltoallv(d->be, &d->h_send, &d->h_recv, send, d->sc, d->sd, recv, d->rc, d->rd,
                           d->row, sizeof(float) * (size_t)width, d->comm, &ticket) != MT_OK)
        mt_comm_fatal(d->comm, MPI_ERR_OTHER, "expert-parallel all-to-all");
    d->calls++;
    d->seconds += mt_now_s() - t0;
    return ticket;
}

void mt_moe_dispatch_join(void *ctx, void *ticket)
{
    mt_moe_dispatch_t *d = ctx;
    if (mt_stage_join(ticket) != MT_OK)
        mt_comm_fatal(d->comm, MPI_ERR_OTHER, "expert-parallel all-to-all (join)");
}
