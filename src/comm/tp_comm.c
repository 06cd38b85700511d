/* tp_comm.c: the tensor-parallel collectives over MPI, staged and in bf16
 * (mt_tp_comm.h). */
#include "mt_tp_comm.h"

#include <string.h>

#include "mt_comm.h"

mt_status_t mt_tp_comm_init(mt_tp_comm_t *c, MPI_Comm tp, const mt_backend_t *be, bool bf16)
{
    memset(c, 0, sizeof *c);
    c->tp = tp, c->be = be, c->size = 1;
    c->staged = mt_stage_needed(be);
    c->bf16 = bf16;
    c->bits = bf16 && be->stores_bf16;
    if (tp != MPI_COMM_NULL)
        MT_MPI_TRY(MPI_Comm_size(tp, &c->size));
    if (bf16 && c->size > 1)
        MT_TRY(mt_bf16_comm_init(&c->wire));
    return MT_OK;
}

void mt_tp_comm_free(mt_tp_comm_t *c)
{
    mt_bf16_comm_free(&c->wire);
    mt_stage_buf_free(&c->host);
    memset(c, 0, sizeof *c);
}

/* elements of the operation's input and output */
static int64_t in_count(const mt_tp_comm_t *c, int64_t n, mt_tp_op_t op)
{
    return op == MT_TP_SCATTER_FLOAT ? n * c->size : n;
}

static int64_t out_count(const mt_tp_comm_t *c, int64_t n, mt_tp_op_t op)
{
    return op == MT_TP_GATHER_FLOAT ? n * c->size : n;
}

/* The MPI collective on host memory; bf16 operands when wire. */
static mt_status_t mpi_collective(mt_tp_comm_t *c, const void *in, void *out, int64_t n,
                                  mt_tp_op_t op, bool wire)
{
    if (n > 2147483647LL)
        MT_FAIL(MT_ERR_UNSUPPORTED, "a tensor-parallel collective of %lld elements needs 64-bit "
                "MPI counts", (long long)n);
    MPI_Datatype t = wire ? c->wire.type : op == MT_TP_SUM_DOUBLE ? MPI_DOUBLE : MPI_FLOAT;
    MPI_Op sum = wire ? c->wire.sum : MPI_SUM;
    MPI_Request rq;
    int rc, k = (int)n;
    if (op == MT_TP_GATHER_FLOAT)
        rc = MPI_Iallgather(in, k, t, out, k, t, c->tp, &rq);
    else if (op == MT_TP_SCATTER_FLOAT)
        rc = MPI_Ireduce_scatter_block(in, out, k, t, sum, c->tp, &rq);
    else
        rc = MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, k, t,
                            op == MT_TP_MAX_FLOAT ? MPI_MAX : sum, c->tp, &rq);
    if (rc != MPI_SUCCESS)
        MT_FAIL(MT_ERR_MPI, "tensor-parallel collective: MPI error %d", rc);
    return mt_wait_all(1, &rq);
}

mt_status_t mt_tp_comm_run(mt_tp_comm_t *c, const void *in, void *out, int64_t n, mt_tp_op_t op)
{
    bool wire = c->bf16 && (op == MT_TP_SUM_FLOAT || op == MT_TP_GATHER_FLOAT ||
                            op == MT_TP_SCATTER_FLOAT);
    int64_t ni = in_count(c, n, op), no = out_count(c, n, op);
    size_t el = wire ? 2 : op == MT_TP_SUM_DOUBLE ? sizeof(double) : sizeof(float);
    c->bytes_sent += (int64_t)el * ni;
    /* bf16 storage: the operands are the wire's bf16 bits already */
    bool as_is = !wire || c->bits;
    if (as_is && !c->staged)
        return mpi_collective(c, in, out, n, op, wire);
    const mt_backend_t *be = c->be;
    if (as_is) { /* host copies of the operands; in place for the all-reduces */
        size_t in_b = el * (size_t)ni, out_b = el * (size_t)no;
        char *h = mt_stage_reserve(&c->host, in_b + out_b);
        if (!h)
            MT_FAIL(MT_ERR_NOMEM, "host staging buffer of a tensor-parallel collective");
        if (in == out) { /* in_b == out_b */
            be->copy_to_host(h + in_b, in, out_b);
            MT_TRY(mpi_collective(c, h + in_b, h + in_b, n, op, wire));
        } else {
            be->copy_to_host(h, in, in_b);
            MT_TRY(mpi_collective(c, h, h + in_b, n, op, wire));
        }
        be->copy_to_device(out, h + in_b, out_b);
        return MT_OK;
    }
    /* bf16: [the floats' staging, when staged] [message in] [message out] */
    size_t fl = c->staged ? sizeof(float) * (size_t)(ni > no ? ni : no) : 0;
    char *h = mt_stage_reserve(&c->host, fl + 2 * (size_t)(ni + no));
    if (!h)
        MT_FAIL(MT_ERR_NOMEM, "host buffers of a bf16 tensor-parallel collective");
    float *scratch = c->staged ? (float *)h : NULL;
    uint16_t *wi = (uint16_t *)(h + fl), *wo = wi + ni;
    mt_bf16_pack_from(be, wi, in, scratch, ni);
    MT_TRY(mpi_collective(c, wi, wo, n, op, true));
    mt_bf16_unpack_to(be, out, wo, scratch, no);
    return MT_OK;
}
