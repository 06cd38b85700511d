/* moe_dispatch.h: the expert-parallel token exchange over MPI, behind the
 * model's ep_alltoall hook (mt_model.h, mt_ep_op_t).  The model stays
 * single-device; this is the only MoE code that knows MPI.  The rows are
 * the backend's memory: off the plain CPU backend they are staged through
 * host buffers (mt_stage.h).  Not installed. */
#ifndef MT_MOE_DISPATCH_H
#define MT_MOE_DISPATCH_H

#include <mpi.h>
#include <stdint.h>

#include "mt_model.h"
#include "mt_stage.h"
#include "mt_status.h"

typedef struct {
    MPI_Comm comm;            /* the EP group (not owned) */
    int size, rank;
    const mt_backend_t *be;   /* whose memory the rows are */
    mt_stage_buf_t h_send, h_recv; /* host copies of the rows (staged only) */
    int *sc, *sd, *rc, *rd;   /* per-call counts and displacements, in rows */
    MPI_Datatype row;         /* `row_width` floats, or bf16 values (bf16) */
    int64_t row_width;
    /* Rows of bf16 values (mixed precision: every row the model exchanges
     * is one) travel as bf16: packed into s16 (be's memory) before the
     * exchange, received into r16 and widened into the caller's rows at
     * the join (unpack_to, unpack_n elements; NULL: nothing pending). */
    bool bf16;
    bool bits;                /* bf16 storage (be->stores_bf16): the rows are
                               * bf16 bits already, sent as they are */
    uint16_t *s16, *r16;
    int64_t s16_cap, r16_cap; /* elements */
    float *unpack_to;
    int64_t unpack_n;
    /* what the all-to-alls cost: bytes this rank sent to other ranks (the
     * rows to itself are a copy), calls, and seconds inside them */
    int64_t bytes_sent, calls;
    double seconds;
} mt_moe_dispatch_t;

/* bf16: the rows hold bf16 values (distributed.mp_policy.param_dtype
 * bfloat16), so they travel as bf16, half the bytes, exactly. */
mt_status_t mt_moe_dispatch_init(mt_moe_dispatch_t *d, MPI_Comm ep, const mt_backend_t *be,
                                 bool bf16);
void mt_moe_dispatch_free(mt_moe_dispatch_t *d);

/* The hook: MT_EP_COUNTS is an MPI_Alltoall of `width` int64 per rank
 * (host memory), MT_EP_ROWS an MPI_Alltoallv of rows of `width` floats
 * (be's memory; mt_stage_alltoallv; as bf16 under bf16).  Both wait
 * politely (mt_wait_all).  A failure mid-forward cannot be agreed on:
 * it aborts the job (mt_comm_fatal). */
void mt_moe_dispatch_hook(void *ctx, mt_ep_op_t op, const void *send, const int64_t *scounts,
                          void *recv, const int64_t *rcounts, int64_t width);

/* The asynchronous row exchange (mt_model_t.ep_start, ep_join): through
 * NCCL it returns the all-to-all's event, which the join makes the
 * compute stream wait for; over MPI it completes before returning NULL.
 * Its seconds count only the host's time to start it.  Under bf16 the
 * received rows are widened by the join (NCCL; one exchange in flight at
 * a time) or before a NULL ticket is returned. */
void *mt_moe_dispatch_start(void *ctx, const void *send, const int64_t *scounts, void *recv,
                            const int64_t *rcounts, int64_t width);
void mt_moe_dispatch_join(void *ctx, void *ticket);

/* Point m's hooks at d. */
void mt_moe_dispatch_attach(mt_moe_dispatch_t *d, mt_model_t *m);

#endif
