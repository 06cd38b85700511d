/* moe_dispatch.c: MPI all-to-alls that move MoE tokens between the ranks
 * of an expert-parallel group (the hook model_moe.c calls).  Counts first
 * (MPI_Alltoall), then rows (MPI_Alltoallv) in rank order, using a
 * contiguous row datatype so counts and displacements are rows, not
 * floats.  It deliberately keeps no routing logic: the model decides what
 * goes where; this file only ships it and counts the bytes and seconds
 * (bench/bench_moe.sh reads them).  The counts are host memory; the rows
 * are the backend's and go through mt_stage_alltoallv (host copies off
 * the plain CPU backend, MPI on the rows themselves on it).  Under bf16
 * storage the rows are bf16 bits already and go as they are. */
#include "moe_dispatch.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt_clock.h"
#include "mt_comm.h"

mt_status_t mt_moe_dispatch_init(mt_moe_dispatch_t *d, MPI_Comm ep, const mt_backend_t *be,
                                 bool bf16)
{
    memset(d, 0, sizeof *d);
    d->comm = ep, d->be = be, d->bf16 = bf16;
    d->bits = bf16 && be->stores_bf16;
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
    if (d->be)
        d->be->device_free(d->s16), d->be->device_free(d->r16);
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

/* A bf16 buffer of at least n elements in *b (be's memory; grown when
 * short, which happens while dropless routing finds its largest counts). */
static bool bf16_buffer(const mt_backend_t *be, uint16_t **b, int64_t *cap, int64_t n)
{
    if (n <= *cap && *b)
        return true;
    be->device_free(*b);
    *cap = n > 0 ? n : 1;
    *b = be->device_alloc(sizeof(uint16_t) * (size_t)*cap);
    return *b != NULL;
}

void *mt_moe_dispatch_start(void *ctx, const void *send, const int64_t *scounts, void *recv,
                            const int64_t *rcounts, int64_t width)
{
    mt_moe_dispatch_t *d = ctx;
    void *ticket = NULL;
    double t0 = mt_now_s();
    size_t elem = d->bf16 ? sizeof(uint16_t) : sizeof(float);
    if (d->row_width != width) {
        if (d->row != MPI_DATATYPE_NULL)
            MPI_Type_free(&d->row);
        MPI_Type_contiguous((int)width, d->bf16 ? MPI_UINT16_T : MPI_FLOAT, &d->row);
        MPI_Type_commit(&d->row);
        d->row_width = width;
    }
    int so = 0, ro = 0;
    for (int r = 0; r < d->size; r++) {
        d->sc[r] = (int)scounts[r], d->sd[r] = so, so += d->sc[r];
        d->rc[r] = (int)rcounts[r], d->rd[r] = ro, ro += d->rc[r];
        if (r != d->rank)
            d->bytes_sent += (int64_t)elem * width * scounts[r];
    }
    const void *s = send;
    void *r = recv;
    if (d->bf16 && !d->bits) { /* bf16 values: packed exactly, widened at the join */
        if (d->unpack_to || !bf16_buffer(d->be, &d->s16, &d->s16_cap, so * width) ||
            !bf16_buffer(d->be, &d->r16, &d->r16_cap, ro * width))
            mt_comm_fatal(d->comm, MPI_ERR_NO_MEM, d->unpack_to
                          ? "expert-parallel all-to-all: started before the last was joined"
                          : "expert-parallel all-to-all: bf16 row buffers");
        d->be->to_bf16(d->s16, send, so * width);
        s = d->s16, r = d->r16;
        d->unpack_to = recv, d->unpack_n = ro * width;
    }
    if (mt_stage_alltoallv(d->be, &d->h_send, &d->h_recv, s, d->sc, d->sd, r, d->rc, d->rd,
                           d->row, elem * (size_t)width, d->comm, &ticket) != MT_OK)
        mt_comm_fatal(d->comm, MPI_ERR_OTHER, "expert-parallel all-to-all");
    if (!ticket) /* complete already (MPI): nothing to join, widen now */
        mt_moe_dispatch_join(d, NULL);
    d->calls++;
    d->seconds += mt_now_s() - t0;
    return ticket;
}

void mt_moe_dispatch_join(void *ctx, void *ticket)
{
    mt_moe_dispatch_t *d = ctx;
    if (ticket && mt_stage_join(ticket) != MT_OK)
        mt_comm_fatal(d->comm, MPI_ERR_OTHER, "expert-parallel all-to-all (join)");
    if (d->unpack_to) { /* the bf16 rows received: widened in order on the compute stream */
        d->be->from_bf16(d->unpack_to, d->r16, d->unpack_n);
        d->unpack_to = NULL;
    }
}
