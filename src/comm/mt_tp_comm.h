/* mt_tp_comm.h: the tensor-parallel collectives of the model
 * (mt_model_t.tp_allreduce, mt_tp_op_t) over MPI, on host memory or
 * staged through host copies of a device's memory (mt_stage.h), with
 * bf16 on the wire under bf16 compute.  The NCCL path is the trainer's
 * (train_device.c); this is everything else.
 *
 * bf16 wire (distributed.mp_policy.param_dtype bfloat16): what crosses
 * the TP group is an activation or activation gradient, which bf16
 * compute holds as bf16 values (doc/mixed-precision.md), so the float
 * sums, gathers and reduce-scatters send bf16 (mt_comm_bf16.h): a gather
 * of bf16 values is exact, and a sum adds in float32 and rounds every
 * partial sum, as NCCL's bf16 sum does; on two ranks that is the
 * float32 sum of the two rounded once, bit for bit.  The maximum and the
 * double sums (the vocabulary-parallel loss) stay as they are.  Half the
 * bytes of the float32 path.  Under bf16 storage (mt_backend_t.stores_bf16)
 * those operands hold bf16 bits already: no conversion either way. */
#ifndef MT_TP_COMM_H
#define MT_TP_COMM_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "mt_backend.h"
#include "mt_comm_bf16.h"
#include "mt_model.h"
#include "mt_stage.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    MPI_Comm tp;
    int size;
    const mt_backend_t *be;
    bool staged;           /* be's memory is not host memory */
    bool bf16;             /* bf16 on the wire for float sums and gathers */
    bool bits;             /* bf16 storage (be->stores_bf16): their operands
                            * are bf16 bits, sent and received as they are */
    mt_bf16_comm_t wire;   /* its type and op */
    mt_stage_buf_t host;   /* staging: floats, then the bf16 messages */
    int64_t bytes_sent;    /* bytes this rank handed to MPI, for the tests */
} mt_tp_comm_t;

/* Collective over nothing; the op of bf16 is created here. */
mt_status_t mt_tp_comm_init(mt_tp_comm_t *c, MPI_Comm tp, const mt_backend_t *be, bool bf16);
void mt_tp_comm_free(mt_tp_comm_t *c);

/* One collective over c->tp (every TP rank calls it with the same n and
 * op): in and out are be's memory, n as mt_tp_op_t says. */
mt_status_t mt_tp_comm_run(mt_tp_comm_t *c, const void *in, void *out, int64_t n, mt_tp_op_t op);

#ifdef __cplusplus
}
#endif
#endif
