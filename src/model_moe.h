/* model_moe.h: the routed mixture-of-experts block (Hugging Face
 * Qwen3-MoE semantics) that replaces the MLP of a decoder layer, for
 * model.c, model_arena.c, the trainer and the tests.  Not installed.
 *
 * The router weight (mlp.gate.weight) is an ordinary parameter of the
 * layer, in the model's flat parameter order, so data parallelism (fsdp2,
 * ddp) treats it like any other.  The experts are not: under expert
 * parallelism each rank holds different ones, so they live in arenas of
 * their own (expert parameters and gradients, their own flat order) that
 * the trainer reduces over the ranks holding the same experts. */
#ifndef MT_MODEL_MOE_H
#define MT_MODEL_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "mt_model.h"

typedef struct moe_acts moe_acts_t;

typedef struct mt_moe {
    int64_t E, K, Im;         /* experts, experts per token, expert width */
    int64_t Is;               /* shared experts' width (num_shared_experts Im), or 0 */
    int64_t cap;              /* rows an expert takes from a micro-batch; 0: dropless */
    int64_t El, e_lo;         /* this rank's experts: [e_lo, e_lo + El) */
    int ep, ep_rank;
    bool norm_topk;
    bool keep_router;         /* moe.ignore_router_for_ac under activation
                               * checkpointing: each layer keeps its router
                               * outputs, and the recompute reuses them */
    int nmoe, last;           /* MoE layers; index of the last one */
    bool *sparse;             /* [L]: layer l is a MoE layer */
    /* expert parameters: layer l, local expert i: xp[xfirst[l] + 3 i + {0,1,2}]
     * = experts.(e_lo + i).{gate,up,down}_proj.weight */
    mt_param_t *xp;
    int nxp, *xfirst;
    int64_t numel;            /* expert parameter elements on this rank */
    float *param_mem, *grad_mem; /* NULL when the experts are sharded */
    /* routing statistics of the last forward: tokens of this micro-batch
     * routed to each expert, and their summed router probabilities */
    int64_t *counts;          /* [L * E] (routed, before any capacity limit) */
    int64_t *dropped;         /* [L]: (token, slot) pairs the capacity limit dropped */
    float *bias;              /* [L * E] aux-loss-free balancing bias, or NULL
                               * (mlp.gate.e_score_correction_bias in checkpoints) */
    int64_t *kept, *kend;     /* [E] scratch: rows kept per expert, end of its block */
    double *psum;             /* [L * E] */
    double *ctot;             /* [E]: counts summed over the MoE layers */
    double aux;               /* load-balancing loss of the last forward (unscaled) */
    float aux_scale;          /* d objective / d aux: coef / micro-batches of the step */
    int64_t rmax;             /* rows an expert rank can receive: ep N min(K, El) */
    int64_t act_numel;        /* floats of routing buffers and activations */
    moe_acts_t *acts;         /* [L]; one shared set under activation checkpointing */
    /* scratch shared by the layers */
    int64_t *off;             /* [E] */
    int32_t *src_tok;         /* [N K] token of each send row */
    float *sendbuf, *recvbuf, *ye, *da, *dw, *dlogits, *aux_dp;
    void **allocs;            /* everything above, for mt_moe_free */
    int nalloc, capalloc;
} mt_moe_t;

/* Whether layer l of cfg's model is a MoE layer (num_experts > 0 and l
 * not in model.mlp_only_layers). */
bool mt_moe_is_sparse(const mt_config_t *cfg, int l);

/* Experts, routing buffers and scratch for m (whose layers and router
 * parameters exist), for EP rank ep_rank of ep_size.  Refuses what this
 * release does not compute (tensor parallelism).  no_arenas: leave out the
 * expert parameter and gradient arenas; whoever shards the experts points
 * their data and grad at its own buffers before use. */
mt_status_t mt_moe_init(mt_model_t *m, const mt_config_t *cfg, int ep_rank, int ep_size,
                        bool no_arenas);
void mt_moe_free(mt_model_t *m);

/* Initial expert weights: normal(seed, name, element), as for every other
 * parameter, so independent of the mesh. */
void mt_moe_init_weights(mt_model_t *m, uint64_t seed);
void mt_moe_zero_grad(mt_model_t *m);

/* Aux-loss-free balancing: after a step, move each MoE layer's bias by
 * rate towards balance (+rate for an expert below the layer's mean load,
 * -rate above); load [L * E] is the step's routed tokens over the whole
 * global batch, so every rank moves it the same way. */
void mt_moe_update_bias(mt_model_t *m, const int64_t *load, double rate);

/* out [N,H] = res + MoE(h) for layer l; h is the normed input [N,H]. */
void mt_moe_forward(mt_model_t *m, int l, const float *h, const float *res, float *out);
/* dh [N,H] = d/dh (overwritten) from dout, the gradient of out; router
 * and expert gradients are accumulated.  Includes the load-balancing
 * loss's gradient, scaled by m->moe->aux_scale. */
void mt_moe_backward(mt_model_t *m, int l, const float *h, const float *dout, float *dh);

/* Floats of the MoE activations and routing buffers (for the memory line;
 * not in the model's act_numel, which is its own arena). */
int64_t mt_moe_act_numel(const mt_model_t *m);

/* Parameters of all experts (every EP rank's) and matmul FLOPs per token
 * of the active experts (6 K 3 H Im per MoE layer). */
int64_t mt_moe_logical_numel(const mt_model_t *m);
double mt_moe_flops_per_token(const mt_model_t *m);

/* A model-like view of the expert parameters for mt_adamw_step and
 * mt_fsdp: params, nparams, be, numel, arenas, and units that mirror the
 * model's (unit 0 and L+1 empty, unit l+1 = layer l's experts, empty for
 * a dense layer), so the model's unit events drive it unchanged.
 * unit_lo must have room for L + 3 entries. */
mt_model_t mt_moe_param_view(const mt_model_t *m, int64_t *unit_lo);

#endif
