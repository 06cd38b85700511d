/* model_moe_internal.h: what the MoE block's step (model_moe.c) and its
 * state (model_moe_state.c) share: a layer's routing and dispatch
 * buffers.  Not installed. */
#ifndef MT_MODEL_MOE_INTERNAL_H
#define MT_MODEL_MOE_INTERNAL_H

#include <stdint.h>

#include "model_moe.h"

/* The router's outputs of a layer (backend memory): kept per layer and
 * slot, also under activation checkpointing with moe.ignore_router_for_ac. */
struct moe_route {
    float *probs;      /* [N,E] router probabilities */
    int32_t *idx;      /* [N,K] chosen experts */
    float *w;          /* [N,K] routing weights */
};

/* A layer's dispatch state: the counts are host memory, the rest the
 * backend's. */
struct moe_acts {
    int32_t *slot_row; /* [N,K] row of (t, j) in the send order */
    int64_t *scnt, *rcnt; /* [ep] rows sent to / received from each EP rank (host) */
    int64_t *ecnt;     /* [ep, El] rows received from rank s for local expert e (host) */
    int64_t R, cap;    /* rows received; rows the next five buffers hold */
    int32_t *perm, *iperm; /* [cap] expert-major row i is received row perm[i] */
    float *xe;         /* [cap,H] expert inputs, expert-major */
    float *g, *u, *a;  /* [cap,Im] */
    float *y;          /* [N K,H] expert outputs, back in send order */
    float *sg, *su, *sa; /* [N,Is] shared experts' gate, up, silu(gate) up */
};

/* Element n of an activation buffer (mt_act_at's rule for the experts) */
static inline float *mt_moe_at(const mt_moe_t *x, const float *p, int64_t n)
{
    return (float *)((char *)p + (size_t)x->es * (size_t)n);
}

/* Room for R received rows in a's row buffers (and the shared scratch):
 * short of R they grow to R and a quarter; out of memory aborts the job,
 * since a step cannot fail part-way through an exchange. */
void mt_moe_reserve_rows(mt_moe_t *x, moe_acts_t *a, int64_t R, int64_t H);

#endif
