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
typedef struct moe_route moe_route_t;

/* The routing totals of one micro-batch (mt_model_t.route, MT_MOE_ROUTE
 * doubles per pipeline slot): for each expert the (layer, token) rows
 * routed to it and their summed router probabilities, and the rows R,
 * over the MoE layers seen so far.  A pipeline stage adds its layers'
 * share and passes them on with its activations; the last stage sums them
 * over the ranks holding other tokens of the micro-batch (tensor and
 * context parallel ranks), computes the load-balancing loss, and the
 * totals travel back with the gradients for the backward. */
#define MT_MOE_ROUTE(E) (2 * (E) + 1)

/* Memory: the buffers the kernels read or write (expert arenas, bias,
 * routing outputs, activations, dispatch scratch) are the backend's
 * (be->device_alloc); the tables and the dispatch bookkeeping are host
 * memory, and the host copies (h_*) hold what the bookkeeping reads or
 * builds on its way to or from the backend. */
typedef struct mt_moe {
    const mt_backend_t *be;
    int64_t E, K, Im;         /* experts, experts per token, expert width */
    mt_arch_t arch;           /* whose names the experts have (mt_moe_expert_name) */
    int64_t Is;               /* shared experts' width (num_shared_experts Im), or 0 */
    int64_t N;                /* tokens of the micro-batch this rank routes (all the
                               * model's N, or N / tp under tensor parallelism) */
    int64_t cap;              /* rows an expert takes from those tokens; 0: dropless */
    int64_t El, e_lo;         /* this rank's experts: [e_lo, e_lo + El) */
    int ep, ep_rank;
    bool norm_topk;
    bool keep_router;         /* moe.ignore_router_for_ac under activation
                               * checkpointing: each layer keeps its router
                               * outputs, and the recompute reuses them */
    int nmoe;                 /* MoE layers of this rank's part of the model */
    bool *sparse;             /* [L]: layer l is a MoE layer */
    /* expert parameters: layer l, local expert i: xp[xfirst[l] + 3 i + {0,1,2}]
     * = experts.(e_lo + i).{gate,up,down}_proj.weight */
    mt_param_t *xp;
    int nxp, *xfirst;
    int64_t numel;            /* expert parameter elements on this rank */
    float *param_mem, *grad_mem; /* NULL when the experts are sharded (backend memory) */
    /* routing statistics of the last forward of each layer (this rank's tokens; host) */
    int64_t *counts;          /* [L * E] (routed, before any capacity limit) */
    int64_t *dropped;         /* [L]: (token, slot) pairs the capacity limit dropped */
    float *bias;              /* [L * E] aux-loss-free balancing bias, or NULL
                               * (mlp.gate.e_score_correction_bias in checkpoints;
                               * backend memory) */
    int64_t *kept, *kend;     /* [E] scratch: rows kept per expert, end of its block */
    double aux;               /* load-balancing loss of the last micro-batch (unscaled;
                               * on the ranks of the last pipeline stage) */
    float aux_scale;          /* d objective / d aux: coef / micro-batches of the step */
    /* Step totals of the training forwards (not the recomputes), that the
     * trainer reads and clears (train_moe.c): tokens routed to each expert
     * by global layer [L_full * E], tokens dropped, and the aux losses of
     * the micro-batches whose loss this rank computed. */
    bool training;            /* set by the model: this forward is followed by backward */
    int64_t *load, load_dropped;
    double aux_sum;
    /* routing state by pipeline slot: act[s L + l], rt[s L + l] */
    int slot;                 /* the pipeline slot in use (of m->nslots) */
    moe_acts_t **act;
    moe_route_t **rt;
    double *route_mem;        /* [m->nslots * MT_MOE_ROUTE(E)] */
    int64_t act_numel;        /* floats of routing buffers and activations */
    /* scratch shared by the layers; the received-row buffers (here and in
     * each moe_acts_t) grow when a step routes more rows to this rank
     * than they hold (dropless routing has no fixed bound short of every
     * token choosing this rank) */
    int64_t scap;             /* rows recvbuf, ye and da hold (and acc32) */
    int es;                   /* bytes of an activation element: 2 under bf16
                               * storage (bf16 bits), else 4 */
    float *acc32;             /* bf16 storage: [scap, H] float32, an expert's
                               * input gradient summed over its two GEMMs */
    int64_t *off;             /* [E] (host) */
    int32_t *src_tok;         /* [N K] token of each send row */
    float *sendbuf, *recvbuf, *ye, *da, *dw, *dlogits, *aux_dp;
    double *psum;             /* [E] the probability sums' running totals (moe_prob_sums) */
    /* host copies: the router's choices [N K], the send order and source
     * tokens [N K], the permutations [scap], the aux-loss gradient [E],
     * the bias [L E] */
    int32_t *h_idx, *h_slot_row, *h_src_tok, *h_perm, *h_iperm;
    float *h_aux_dp, *h_bias;
    struct moe_alloc *allocs; /* the fixed-size buffers, for mt_moe_free */
    int nalloc, capalloc;
} mt_moe_t;

/* Whether layer l of cfg's model is a MoE layer (num_experts > 0 and l
 * not in model.mlp_only_layers). */
bool mt_moe_is_sparse(const mt_config_t *cfg, int l);

/* Hugging Face names of layer l's router and of expert e's projection k
 * (0 gate, 1 up, 2 down): mlp.gate, mlp.experts.E.gate_proj, ..., or
 * Mixtral's block_sparse_moe.gate, block_sparse_moe.experts.E.w1 (gate),
 * w3 (up), w2 (down). */
void mt_moe_router_name(mt_arch_t arch, int l, char *buf, size_t cap);
void mt_moe_expert_name(mt_arch_t arch, int l, int64_t e, int k, char *buf,
                        size_t cap);

/* Experts, routing buffers and scratch for m (whose layers and router
 * parameters exist), for EP rank ep_rank of ep_size.  Under tensor
 * parallelism each TP rank routes its own N / tp of the micro-batch's
 * tokens (Megatron's folding of TP into the MoE layer; model.c splits and
 * gathers), so the experts and the router are whole on every TP rank and
 * their gradients partial.  no_arenas: leave out the expert parameter and
 * gradient arenas; whoever shards the experts points their data and grad
 * at its own buffers before use.  no_acts: no activations, routing state
 * or dispatch buffers either (a table of names and shapes, as
 * MT_MODEL_NO_ACT_ARENA leaves the dense model: the checkpoint's). */
mt_status_t mt_moe_init(mt_model_t *m, const mt_config_t *cfg, int ep_rank, int ep_size,
                        bool no_arenas, bool no_acts);
void mt_moe_free(mt_model_t *m);

/* Initial expert weights: normal(seed, name, element), as for every other
 * parameter, so independent of the mesh. */
void mt_moe_init_weights(mt_model_t *m, uint64_t seed);
void mt_moe_zero_grad(mt_model_t *m);

/* Aux-loss-free balancing: after a step, move each MoE layer's bias by
 * rate towards balance (+rate for an expert below the layer's mean load,
 * -rate above); load [L_full * E], by global layer, is the step's routed
 * tokens over the whole global batch, so every rank moves it the same way. */
void mt_moe_update_bias(mt_model_t *m, const int64_t *load, double rate);

/* Point m->route and the routing state at pipeline slot `slot`. */
void mt_moe_use_slot(mt_model_t *m, int slot);

/* out [n,H] = res + MoE(h) for layer l over this rank's n = m->moe->N
 * tokens; h is their normed input [n,H].  Adds the layer's routing to
 * m->route (not when recomputing). */
void mt_moe_forward(mt_model_t *m, int l, const float *h, const float *res, float *out);
/* After the last layer of the micro-batch (at the head): m->route holds
 * this rank's totals over every MoE layer of the model; sums them over
 * the ranks holding the micro-batch's other tokens (m->route_sum, when
 * set) and computes the load-balancing loss into m->moe->aux. */
void mt_moe_finish_forward(mt_model_t *m);
/* dh [n,H] = d/dh (overwritten) from dout [n,H], the gradient of out;
 * router and expert gradients are accumulated.  Includes the
 * load-balancing loss's gradient, scaled by m->moe->aux_scale, from the
 * micro-batch's totals in m->route. */
void mt_moe_backward(mt_model_t *m, int l, const float *h, const float *dout, float *dh);

/* Floats of the MoE activations and routing buffers in backend memory as
 * allocated now (for the memory line; not in the model's act_numel, which
 * is its own arena). */
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

/* (model_init.c) The initial values of m's flat elements [0, m->numel)
 * (mt_model_init_range) into dst, backend memory: generated on the host
 * and copied in chunks; as bf16 bits under m->bf16_storage (an arena). */
void mt_model_init_device(const mt_model_t *m, uint64_t seed, float *dst);

/* Mixed precision (doc/mixed-precision.md): an activation or activation
 * gradient that is complete becomes a bf16 value; nothing in float32.
 * Kernels and GEMMs compute and accumulate in fp32, and what they leave is
 * rounded once (model.c, model_moe.c). */
static inline void mt_model_round(const mt_model_t *m, float *x, int64_t n)
{
    if (m->bf16 && !m->bf16_storage) /* bf16 bits are rounded by their writer */
        m->be->round_bf16(x, n);
}

/* The same for what an entry that rounds on a rounding table
 * (mt_backend_t.rounds_bf16: RMSNorm, RoPE, SwiGLU, attention, the loss)
 * has just written, or what the loss is about to read: a pass only when
 * the table does not round it itself.  Either way the result is the same
 * bits; the rounding table saves the pass. */
static inline void mt_model_round_out(const mt_model_t *m, float *x, int64_t n)
{
    if (!m->be->rounds_bf16)
        mt_model_round(m, x, n);
}

/* The same for a GEMM's output that only such entries read, on a table
 * that rounds what they load (mt_backend_t.reads_bf16: the CUDA one): the
 * pass moves into the readers' loads.  The value stays unrounded in
 * memory, so nothing else (a collective, a GEMM, a copy kept for later)
 * may read it: callers name those readers at each use. */
static inline void mt_model_round_in(const mt_model_t *m, float *x, int64_t n)
{
    if (!m->be->reads_bf16)
        mt_model_round(m, x, n);
}

#endif
