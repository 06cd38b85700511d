/* mt_comm_bf16.h: bfloat16 on the wire, for the data-parallel collectives
 * of distributed.mp_policy (param_dtype, reduce_dtype = bfloat16).
 *
 * Storage stays float32 everywhere; only the message is bf16: a float32
 * buffer is rounded to bf16 bit patterns (uint16, round to nearest even)
 * in a host buffer, the collective runs on those, and the result is
 * widened back to float32 values that are exactly bf16 values.
 *
 *   all-gather   each rank's part rounded, then gathered: bit-identical to
 *                gathering float32 and rounding afterwards (rounding is
 *                per element).
 *   sum          mt_bf16_comm_t's op adds two bf16 operands in float32 and
 *                rounds the partial sum to bf16 at every step, as NCCL's
 *                bf16 sum does.  It is created non-commutative, so MPICH
 *                combines in a fixed rank order: the same inputs give the
 *                same bits on every run, and an all-reduce gives every rank
 *                the same bits.  The grouping (and so the last bits) is the
 *                MPI library's.  bf16 keeps 8 significant bits, so each
 *                rounding is within 2^-8 relative, and the sum of n
 *                values within n 2^-8 sum|x_i| of the exact sum.
 *
 * It does not pick the dtype (mt_fsdp_options_t, mt_ddp_init do), does not
 * stage by itself beyond the copies below (mt_stage.h describes staging),
 * and does not know NCCL (mt_nccl.h). */
#ifndef MT_COMM_BF16_H
#define MT_COMM_BF16_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "mt_backend.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    MPI_Datatype type; /* 2 bytes, named "mt_bf16"; MPI_SUM refuses it */
    MPI_Op sum;        /* per-step-rounded bf16 sum (above) */
    bool ready;
} mt_bf16_comm_t;

/* Create (after MPI_Init) / free the type and the op.  free is safe on a
 * zeroed or already freed struct. */
mt_status_t mt_bf16_comm_init(mt_bf16_comm_t *c);
void mt_bf16_comm_free(mt_bf16_comm_t *c);

/* Host buffers: dst[i] = bf16(src[i]) / dst[i] = float(src[i]). */
void mt_bf16_pack(uint16_t *dst, const float *src, int64_t n);
void mt_bf16_unpack(float *dst, const uint16_t *src, int64_t n);

/* The same with the float32 side in be's memory.  When mt_stage_needed(be)
 * the floats pass through `scratch` (n host floats); else scratch is not
 * used and may be NULL. */
void mt_bf16_pack_from(const mt_backend_t *be, uint16_t *dst, const float *x, float *scratch,
                       int64_t n);
void mt_bf16_unpack_to(const mt_backend_t *be, float *x, const uint16_t *src, float *scratch,
                       int64_t n);

#ifdef __cplusplus
}
#endif
#endif
