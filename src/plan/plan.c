/* plan.c: parameter counts, per-rank memory and pipeline bubble estimates.
 * Every formula here is written out in doc/plan.md; change both together.
 * These are estimates for sizing an allocation, not allocator figures. */
#include "mt_plan.h"

#include <stdlib.h>

#include "model_moe.h"
#include "moe_layout.h"
#include "mt_cuda.h"
#include "mt_fsdp.h"
#include "mt_pp_exec.h"

#include <math.h>
#include <string.h>

/* Pipeline rank that holds stage s (the generator's layout). */
static int64_t stage_rank(const mt_config_t *cfg, int64_t s)
{
    return mt_pp_stage_rank(cfg->distributed.pipeline.pp_schedule, (int)cfg->distributed.pp_size,
                            (int)s);
}

static int64_t stage_layers(const mt_config_t *cfg, int64_t s)
{
    int lo, hi;
    mt_pp_stage_layers(cfg, (int)s, &lo, &hi);
    return hi - lo;
}

int64_t mt_plan_layers_on_rank(const mt_config_t *cfg, int64_t pp_rank)
{
    int64_t n = 0;
    for (int64_t s = 0; s < cfg->derived.num_stages; s++)
        if (stage_rank(cfg, s) == pp_rank)
            n += stage_layers(cfg, s);
    return n;
}

/* Parameters of decoder layer l: the TP-sharded part, the part every TP
 * rank holds whole, and the routed experts (split over ep, whole on every
 * TP rank: each TP rank routes its own tokens, model_moe.h).  A MoE
 * layer's router and shared experts are whole on every TP rank too. */
static void layer_params(const mt_config_t *cfg, int l, int64_t *sharded, int64_t *replicated,
                         int64_t *experts)
{
    const mt_model_config_t *m = &cfg->model;
    int64_t H = m->hidden_size, hd = cfg->derived.head_dim;
    int64_t kv = m->num_key_value_heads.value, Q = m->num_attention_heads * hd;
    *sharded = 2 * Q * H + 2 * kv * hd * H; /* q, o; k, v */
    *replicated = 2 * H + (m->qk_norm ? 2 * hd : 0);
    if (mt_model_qkv_bias(m)) /* split with their linears' rows */
        *sharded += Q + 2 * kv * hd;
    if (mt_model_o_bias(m)) /* a row-parallel linear's: whole */
        *replicated += H;
    *experts = 0;
    if (mt_moe_is_sparse(cfg, l)) {
        int64_t S = m->num_shared_experts * m->moe_intermediate_size;
        *experts = m->num_experts * 3 * H * m->moe_intermediate_size;
        *replicated += m->num_experts * H + 3 * H * S;
    } else {
        *sharded += 3 * H * m->intermediate_size;
        if (m->mlp_bias) /* gate and up split, down whole */
            *sharded += 2 * m->intermediate_size, *replicated += H;
    }
}

/* The share of the decoder layers that are MoE layers. */
static double moe_share(const mt_config_t *cfg)
{
    int64_t L = cfg->model.num_hidden_layers, n = 0;
    for (int l = 0; l < L; l++)
        n += mt_moe_is_sparse(cfg, l);
    return L > 0 ? (double)n / (double)L : 0.0;
}

/* Elements stored per token per layer for backward (before any division
 * by microbatch count), averaged over dense and MoE layers; see
 * doc/plan.md "Activations". */
static double act_per_token_layer(const mt_config_t *cfg, double act_bytes)
{
    const mt_model_config_t *m = &cfg->model;
    const mt_distributed_config_t *d = &cfg->distributed;
    double H = (double)m->hidden_size, tp = (double)d->tp_size;
    double hd = (double)cfg->derived.head_dim, kv = (double)m->num_key_value_heads.value;
    double sp = d->sequence_parallel ? tp : 1.0;
    double stream = 4 * H / sp;                      /* x, norm1 out, x mid, norm2 out */
    double w4 = 4.0 / act_bytes; /* a 4-byte element (lse, indices) in act_bytes units */
    double Q = (double)m->num_attention_heads * hd; /* q and the attention output */
    double attn = (2 * Q + 2 * kv * hd + m->num_attention_heads * w4) / tp; /* q,k,v,out,lse */
    double dense = 3.0 * (double)m->intermediate_size / tp; /* gate, up, act */
    /* a MoE layer, over the tokens each TP rank routes: per routed row the
     * expert input, gate, up and act (their buffers start a quarter above
     * the balanced load, model_moe.c mt_moe_reserve_rows, with two row
     * indices) and output; per token the router probabilities and the
     * shared experts' gate, up, act; per routed row the choice, weight and
     * send slot (4 bytes each whatever act_bytes is) */
    double K = (double)m->num_experts_per_tok, Im = (double)m->moe_intermediate_size;
    double moe = (K * (1.25 * (H + 3.0 * Im + 2.0 * w4) + H + 3.0 * w4) +
                  (double)m->num_experts * w4 +
                  3.0 * (double)(m->num_shared_experts * m->moe_intermediate_size)) / tp;
    double f = moe_share(cfg);
    return stream + attn + f * moe + (1.0 - f) * dense;
}

/* The pipeline schedules are generated and simulated (pp_schedule.c,
 * pp_simulate.c) with every F, B and W of a stage costing the same and no
 * communication time: a full backward costs 2F, as in the closed forms of
 * doc/plan.md, which the tests check the simulation against. */
#define PLAN_BUBBLE_LABEL "simulated: F = B = W per stage, no communication time"

static mt_status_t simulate(mt_pp_schedule_t s, int p, int v, int m, mt_pp_sim_result_t *res)
{
    mt_pp_sched_t sc;
    MT_TRY(mt_pp_schedule_build(s, p, v, m, &sc));
    mt_status_t st = mt_pp_simulate(&sc, 1, 1, 1, 0, res);
    mt_pp_sched_free(&sc);
    MT_TRY(st);
    return MT_OK;
}

/* The chosen schedule into *res and the bubble fields; the other schedules
 * into the comparison table. */
static mt_status_t bubble(const mt_config_t *cfg, mt_plan_t *plan, mt_pp_sim_result_t *res)
{
    const mt_pipeline_config_t *pl = &cfg->distributed.pipeline;
    int p = (int)cfg->distributed.pp_size, m = (int)cfg->derived.num_microbatches;
    int v = (int)cfg->derived.stages_per_rank;
    memset(res, 0, sizeof *res);
    if (p == 1) {
        plan->bubble_fraction = 0, plan->bubble_ratio = 0, plan->bubble_formula = "no pipeline";
        return MT_OK;
    }
    MT_TRY(simulate(pl->pp_schedule, p, v, m, res));
    plan->bubble_fraction = res->bubble_fraction, plan->bubble_ratio = res->bubble_ratio;
    plan->bubble_formula = PLAN_BUBBLE_LABEL;
    bool multi = mt_pp_schedule_multi_stage(pl->pp_schedule);
    for (int k = 0; k < MT_PP_NUM_SCHEDULES; k++) {
        mt_pp_schedule_t s = (mt_pp_schedule_t)k;
        int sv = !mt_pp_schedule_multi_stage(s) ? 1 : s == MT_PP_V_SCHEDULE ? 2 : multi ? v : 2;
        mt_pp_sim_result_t r;
        mt_plan_pp_row_t *row = &plan->pp_table[plan->pp_table_len++];
        row->schedule = s, row->v = sv, row->chosen = s == pl->pp_schedule;
        if (simulate(s, p, sv, m, &r) != MT_OK) {
            snprintf(row->note, sizeof row->note, "%s", mt_error_message());
            mt_error_clear();
            continue;
        }
        row->valid = true;
        row->bubble_fraction = r.bubble_fraction, row->bubble_ratio = r.bubble_ratio;
        row->peak_held = r.peak_held[0];
        mt_pp_sim_result_free(&r);
    }
    return MT_OK;
}

/* NCCL's wire buffers on a pipeline rank (the trainer's rules: pp_link.c,
 * fsdp.c, ddp.c, train_device.c): its msg_bufs pipeline message buffers
 * (mt_pp_sched_buffers), each one micro-batch's activation [tokens / sp,
 * H] in the wire dtype; fsdp's pad (the largest unit, in bf16 when both
 * directions are) and, for HSDP with bf16 reductions, a shard-sized bf16
 * one; ddp's bf16 bucket (the cap plus the largest parameter, which a
 * bucket may overrun by); the sharded experts' fsdp pad (a layer's
 * experts, xunit) or the replicated experts' own ddp bf16 bucket (xrep:
 * the rank's experts when more than one rank holds them); the
 * tensor-parallel bf16 pad, a whole micro-batch of the residual stream
 * [tokens, H] (not under bf16 storage, whose TP messages go as they are,
 * train_device.c). */
static double nccl_wire_bytes(const mt_config_t *cfg, int msg_bufs, bool fsdp,
                              const mt_fsdp_options_t *fso, double unit_max,
                              double xunit, double xrep, double tokens, double p_rank,
                              bool storage)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    double H = (double)cfg->model.hidden_size, tp = (double)d->tp_size;
    bool bf16 = d->mp_policy.param_dtype != MT_DTYPE_FLOAT32;
    bool rbf16 = d->mp_policy.reduce_dtype == MT_DTYPE_BFLOAT16;
    double wire = 0;
    wire += (double)msg_bufs * tokens / (d->sequence_parallel ? tp : 1) * H * (bf16 ? 2 : 4);
    double shard = (double)(cfg->derived.dp_shard * d->cp_size);
    if (fsdp && shard > 1) {
        bool two = fso->gather_bf16 && (fso->reduce_bf16 || !fso->shard_grads);
        wire += unit_max * (two ? 2 : 4);
        if (cfg->derived.dp_replicate > 1 && fso->reduce_bf16)
            wire += 2 * unit_max / shard;
    } else if (!fsdp && d->strategy == MT_STRATEGY_DDP && cfg->derived.dp_size > 1 && rbf16) {
        double V = (double)cfg->derived.padded_vocab, I = (double)cfg->model.intermediate_size;
        double largest = fmax(V * H, I * H) / tp;
        wire += 2 * fmin(p_rank, d->ddp_bucket_cap_mb * 1048576.0 / 4 + largest);
    }
    if (xunit > 0) /* the sharded experts' own fsdp: a pad of a layer's experts */
        wire += xunit * (fso->gather_bf16 && fso->reduce_bf16 ? 2 : 4);
    if (xrep > 0 && rbf16) /* their ddp's bucket; the largest parameter is an expert's */
        wire += 2 * fmin(xrep, d->ddp_bucket_cap_mb * 1048576.0 / 4 +
                                   H * (double)cfg->model.moe_intermediate_size);
    if (d->tp_size > 1 && bf16 && !storage)
        wire += 2 * tokens * H;
    return wire;
}

mt_status_t mt_plan_compute(const mt_config_t *cfg, mt_plan_t *plan)
{
    return mt_plan_compute_ex(cfg, 0, plan);
}

/* What the estimate of every pipeline rank shares. */
typedef struct {
    double lsh, lrep, lexp;   /* per-layer means of layer_params' three parts (the
                               * layers of a rank are counted, not named) */
    double fp, fg, fo;        /* data-parallel sharding of parameters, gradients and
                               * optimizer state */
    bool fsdp;                /* an fsdp strategy, with the trainer's options fso */
    mt_fsdp_options_t fso;
    bool bf16, storage;       /* bf16 compute; bf16 storage (MT_PLAN_BF16_STORAGE) */
    double pbytes, gbytes, act_bytes; /* bytes of a parameter, gradient, activation */
    double sbytes;            /* of an owned (fsdp-sharded) parameter */
    double obytes;            /* optimizer state per element: m, v (+master) */
    bool exp_sharded;         /* the experts FSDP-sharded over e_shard ranks */
    double e_shard;
    bool gpu, nccl;           /* on a GPU; NCCL carries the collectives */
    int *msg_bufs;            /* [2 pp]: the first pp are each pipeline rank's NCCL
                               * message buffers, sends and receives together */
    mt_pp_sim_result_t sim;   /* the chosen schedule, simulated */
    int64_t first_rank, last_rank; /* pipeline ranks of the first and the last stage */
} plan_ctx_t;

/* One pipeline rank's estimate, in bytes. */
typedef struct {
    double layers;            /* decoder layers it holds */
    double params, grads, optim, acts;
    double ws, wire;          /* device workspace, NCCL wire buffers */
    double nflight;           /* stage-microbatches whose activations it holds at once */
} rank_bytes_t;

/* The logical parameter counts into plan, and the per-layer means. */
static void count_params(const mt_config_t *cfg, mt_plan_t *plan, plan_ctx_t *c)
{
    int64_t H = cfg->model.hidden_size, V = cfg->derived.padded_vocab;
    int64_t L = cfg->model.num_hidden_layers;
    plan->params_embedding = V * H;
    plan->params_head = H + (cfg->model.tie_word_embeddings ? 0 : V * H);
    plan->params_total = plan->params_embedding + plan->params_head;
    for (int l = 0; l < L; l++) {
        int64_t a, b, e;
        layer_params(cfg, l, &a, &b, &e);
        c->lsh += (double)a / (double)L, c->lrep += (double)b / (double)L;
        c->lexp += (double)e / (double)L;
        plan->params_total += a + b + e;
        if (a + b + e > plan->params_layer_max)
            plan->params_layer_max = a + b + e;
    }
}

/* Data-parallel sharding factors for parameters, gradients, optimizer. */
static void sharding(const mt_config_t *cfg, plan_ctx_t *c)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    const mt_derived_t *dv = &cfg->derived;
    double shard = (double)(dv->dp_shard * d->cp_size); /* fsdp2: dp_shard_cp */
    c->fp = c->fg = c->fo = 1;
    c->fsdp = mt_fsdp_options_from_config(cfg, &c->fso);
    c->fso.pipeline = d->pp_size > 1; /* the trainer's pipeline mode (mt_fsdp.h) */
    if (d->strategy == MT_STRATEGY_FSDP2) {
        c->fp = c->fg = c->fo = shard;
    } else if (d->strategy == MT_STRATEGY_MEGATRON_FSDP) {
        double all = (double)(dv->dp_size * d->cp_size);
        c->fo = d->zero_dp_strategy >= 1 ? all : 1;
        c->fg = d->zero_dp_strategy >= 2 ? all : 1;
        c->fp = d->zero_dp_strategy >= 3 ? all : 1;
    }
}

/* Storage is float32 by default, also under bf16 mixed precision (bf16
 * values held in float32: doc/mixed-precision.md), but for the
 * checkpointed layer inputs and the bf16 wire buffers; bf16 adds fp32
 * master weights beside the optimizer state where the parameters the
 * optimizer updates are the model's own (not fsdp shards).  Under bf16
 * storage (MT_PLAN_BF16_STORAGE) the parameter arena, the gathered units
 * and the activations are bf16 bits; fsdp's owned shards (the masters),
 * gradients and the column-parallel dh accumulator float32.  Experts:
 * split over ep, then FSDP-sharded (fsdp2) over the ranks holding the
 * same ones (ep_shard x tp, or dp x cp x tp without EP) instead of
 * dp_shard_cp. */
static void element_bytes(const mt_config_t *cfg, unsigned flags, mt_plan_t *plan,
                          plan_ctx_t *c)
{
    c->bf16 = cfg->distributed.mp_policy.param_dtype != MT_DTYPE_FLOAT32;
    c->storage = c->bf16 && (flags & MT_PLAN_BF16_STORAGE);
    plan->bf16_storage = c->storage;
    c->pbytes = c->storage ? 2 : 4, c->gbytes = 4, c->act_bytes = c->storage ? 2 : 4;
    c->sbytes = c->storage && c->fsdp && c->fso.shard_params ? 4 : c->pbytes;
    bool master = c->bf16 && !(c->fsdp && c->fso.shard_params);
    c->obytes = 8 + (master ? 4 : 0);
    c->exp_sharded = mt_moe_experts_sharded(cfg);
    c->e_shard = c->exp_sharded ? (double)mt_moe_expert_replicas(cfg) : 1;
}

/* On a GPU: NCCL (and its wire buffers) unless collectives is mpi; the
 * pipeline's message buffers follow each rank's list (c->msg_bufs). */
static mt_status_t nccl_message_buffers(const mt_config_t *cfg, plan_ctx_t *c)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    const mt_derived_t *dv = &cfg->derived;
    c->gpu = d->device == MT_DEVICE_CUDA, c->nccl = c->gpu && d->collectives != MT_COLL_MPI;
    mt_pp_sched_t lists = {0};
    if (c->nccl && d->pp_size > 1)
        MT_TRY(mt_pp_schedule_build(d->pipeline.pp_schedule, (int)d->pp_size,
                                    (int)dv->stages_per_rank, (int)dv->num_microbatches, &lists));
    int *msg_bufs = calloc(2 * (size_t)d->pp_size, sizeof *msg_bufs);
    mt_status_t ms = msg_bufs ? MT_OK : mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "plan");
    if (lists.actions && ms == MT_OK &&
        (ms = mt_pp_sched_buffers(&lists, msg_bufs, msg_bufs + d->pp_size)) == MT_OK)
        for (int64_t r = 0; r < d->pp_size; r++)
            msg_bufs[r] += msg_bufs[d->pp_size + r];
    mt_pp_sched_free(&lists);
    if (ms != MT_OK)
        free(msg_bufs);
    MT_TRY(ms);
    c->msg_bufs = msg_bufs;
    return MT_OK;
}

/* Pipeline rank r's parameters of the model (this TP rank's part);
 * *expert: its experts. */
static double rank_params(const mt_config_t *cfg, const mt_plan_t *plan, const plan_ctx_t *c,
                          int64_t r, double layers, double *expert)
{
    double tp = (double)cfg->distributed.tp_size;
    int64_t H = cfg->model.hidden_size;
    bool last = r == c->last_rank;
    double sharded = layers * c->lsh / tp, repl = layers * c->lrep;
    if (r == c->first_rank)
        sharded += (double)plan->params_embedding / tp;
    if (last)
        sharded += (double)(plan->params_head - H) / tp, repl += (double)H;
    if (last && c->last_rank != c->first_rank && cfg->model.tie_word_embeddings)
        sharded += (double)plan->params_embedding / tp; /* tied lm_head copy on another rank */
    *expert = layers * c->lexp / (double)cfg->distributed.ep_size; /* this rank's experts */
    return sharded + repl;
}

/* FSDP working buffers (gathered units, unsharded unit gradients) of
 * pipeline rank r, sized by the trainer's own rule over its units: the
 * embedding, its layers (with EP only its own experts), the head; into
 * *pw and *gw, and the largest unit (its NCCL pad) into *unit_max.  A
 * layer's unit: sharded experts gather with it (their own fsdp, driven by
 * the same unit events). */
static mt_status_t fsdp_work(const mt_config_t *cfg, const mt_plan_t *plan, const plan_ctx_t *c,
                             int64_t r, double layers, double p_rank, double *pw, double *gw,
                             double *unit_max)
{
    double tp = (double)cfg->distributed.tp_size;
    int64_t H = cfg->model.hidden_size;
    double layer = c->lsh / tp + c->lrep;
    int64_t nl = (int64_t)layers, nu = 0;
    int64_t *lo = malloc(sizeof *lo * (size_t)(nl + 3));
    if (!lo)
        MT_FAIL(MT_ERR_NOMEM, "plan units");
    lo[0] = 0;
    bool has_embed = r == c->first_rank, last = r == c->last_rank;
    if (has_embed)
        lo[nu + 1] = lo[nu] + (int64_t)((double)plan->params_embedding / tp), nu++;
    for (int64_t l = 0; l < nl; l++)
        lo[nu + 1] = lo[nu] + (int64_t)layer, nu++;
    if (last)
        lo[nu + 1] = lo[nu] + (int64_t)((double)(plan->params_head - H) / tp) + H, nu++;
    for (int64_t u = 0; u < nu; u++)
        *unit_max = fmax(*unit_max, (double)(lo[u + 1] - lo[u]));
    int64_t p_work, g_work, rs_tmp;
    mt_fsdp_work_numel(lo, (int)nu, cfg->model.tie_word_embeddings && has_embed && last,
                       &c->fso, (int64_t)(p_rank / c->fo), &p_work, &g_work, &rs_tmp);
    free(lo);
    *pw = (double)p_work, *gw = (double)(g_work + rs_tmp);
    return MT_OK;
}

/* The sharded experts' own fsdp (also when the rest is not sharded, as
 * under tp alone), a unit a layer: its working buffers added into *pw and
 * *gw, a layer's experts (its NCCL pad) into *xunit. */
static mt_status_t expert_work(const mt_config_t *cfg, const plan_ctx_t *c, double layers,
                               double expert, double *pw, double *gw, double *xunit)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    int64_t nl = (int64_t)layers, p_work, g_work, rs_tmp;
    mt_fsdp_options_t xo = c->fso;
    xo.reshard_after_forward = d->moe.reshard_after_forward;
    int64_t *xl = malloc(sizeof *xl * (size_t)(nl + 1));
    if (!xl)
        MT_FAIL(MT_ERR_NOMEM, "plan units");
    for (int64_t l = 0; l <= nl; l++)
        xl[l] = l * (int64_t)(c->lexp / (double)d->ep_size);
    mt_fsdp_work_numel(xl, (int)nl, false, &xo, (int64_t)(expert / c->e_shard), &p_work,
                       &g_work, &rs_tmp);
    free(xl);
    *pw += (double)p_work, *gw += (double)(g_work + rs_tmp);
    *xunit = c->lexp / (double)d->ep_size;
    return MT_OK;
}

/* The tokens of one micro-batch (a pipeline's microbatch) on a CP rank. */
static double micro_tokens(const mt_config_t *cfg)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    return (double)(d->pp_size > 1 ? d->pipeline.pp_microbatch_size
                                   : cfg->step_scheduler.local_batch_size) *
           (double)cfg->derived.seq_len / (double)d->cp_size;
}

/* The decoder layers' activations that pipeline rank r holds at its peak;
 * *nflight: the stage-microbatches they belong to (F done, backward
 * including W not yet), from the simulation. */
static double layer_activations(const mt_config_t *cfg, const plan_ctx_t *c, int64_t r,
                                double layers, double tokens, double *nflight)
{
    const mt_model_config_t *m = &cfg->model;
    const mt_distributed_config_t *d = &cfg->distributed;
    const mt_derived_t *dv = &cfg->derived;
    double tp = (double)d->tp_size, act_bytes = c->act_bytes;
    int64_t H = m->hidden_size;
    double per_layer = act_per_token_layer(cfg, act_bytes) * tokens * act_bytes;
    if (d->pp_size > 1 && (d->pipeline.pp_schedule == MT_PP_ZERO_BUBBLE ||
                           d->pipeline.pp_schedule == MT_PP_V_SCHEDULE)) {
        /* B keeps the linears' output gradients for W: d(down_proj) and
         * d(o_proj) whole, dq, dk, dv of this rank's heads */
        double hdim = (double)dv->head_dim;
        double qkv = ((double)m->num_attention_heads +
                      2.0 * (double)m->num_key_value_heads.value) * hdim;
        per_layer += (2.0 * (double)H + qkv / tp) * tokens * act_bytes;
    }
    double stage_layers_avg = layers / (double)dv->stages_per_rank;
    *nflight = d->pp_size > 1 ? (double)c->sim.peak_held[r] : 1;
    if (d->activation_checkpointing) { /* layer inputs kept, one layer recomputed; under
                                         * bf16 all but a stage's first as bf16 bits */
        double xb = c->bf16 ? 2.0 : act_bytes;
        return *nflight * (act_bytes + (stage_layers_avg - 1) * xb) * tokens * (double)H /
                   (d->sequence_parallel ? tp : 1) + per_layer;
    }
    return *nflight * stage_layers_avg * per_layer;
}

/* Add into *acts the ring's shards (context parallelism) and, on the last
 * stage's rank, the logits of one microbatch. */
static void ring_and_logits(const mt_config_t *cfg, const plan_ctx_t *c, int64_t r,
                            double tokens, double *acts)
{
    const mt_model_config_t *m = &cfg->model;
    const mt_distributed_config_t *d = &cfg->distributed;
    const mt_derived_t *dv = &cfg->derived;
    double tp = (double)d->tp_size;
    int64_t V = dv->padded_vocab;
    if (d->cp_size > 1) /* the ring's K/V and dK/dV shards (10 float32, ring_attention.c)
                         * and under bf16 4 of bf16 bits; under bf16 storage 6 float32
                         * and 4 bf16, and the out and dq sums (float32) */
        *acts += tokens * (double)dv->head_dim / tp *
                 (c->storage ? 32.0 * (double)m->num_key_value_heads.value +
                                   8.0 * (double)m->num_attention_heads
                             : (double)m->num_key_value_heads.value *
                                   (40.0 + (c->bf16 ? 8.0 : 0.0)));
    /* fp32 logits of one microbatch for the loss: the head's backward
     * runs right after its forward, so only one is ever alive */
    if (r == c->last_rank) /* in row chunks (mt_model_head_chunk) */
        *acts += (double)mt_model_head_chunk((int64_t)tokens, (int64_t)((double)V / tp)) *
                 (double)V / tp * c->act_bytes; /* (bf16 bits under bf16 storage) */
}

/* Add into *acts the backward working buffers of one microbatch: the
 * final norm's input and output and four residual-stream gradients, plus
 * the q, k, v and MLP gradients (doc/plan.md), and the MoE layers'. */
static void backward_buffers(const mt_config_t *cfg, const plan_ctx_t *c, double tokens,
                             double *acts)
{
    const mt_model_config_t *m = &cfg->model;
    const mt_distributed_config_t *d = &cfg->distributed;
    double tp = (double)d->tp_size, act_bytes = c->act_bytes;
    int64_t H = m->hidden_size;
    double hd = (double)cfg->derived.head_dim, Q = (double)m->num_attention_heads * hd;
    double KV = (double)m->num_key_value_heads.value * hd;
    double sp = d->sequence_parallel ? tp : 1.0;
    /* x_final, dres, dtmp (+ the scattered norm gradient under sp)
     * per rank's tokens; the final norm output, dh, datt (and the
     * gathered norm output under sp) whole */
    double stream_b = sp > 1 ? 4.0 * (double)H / sp + 4.0 * (double)H : 6.0 * (double)H;
    /* datt holds the attention output's gradient too: this rank's heads,
     * nh * head_dim / tp wide, where that passes H */
    double datt_more = Q / tp > (double)H ? Q / tp - (double)H : 0.0;
    *acts += tokens * (stream_b + datt_more + (Q + 2.0 * KV + (double)m->intermediate_size) / tp) *
             act_bytes;
    if (c->storage) /* dh's float32 accumulator (model_arena.c) */
        *acts += tokens * (double)H * 4.0;
    if (moe_share(cfg) > 0) { /* the MoE layers' send rows, and a quarter above
                               * the balanced load (mt_moe_reserve_rows) their receive,
                               * expert-output and activation-gradient rows
                               * (model_moe.c) and under bf16 storage the
                               * experts' float32 input-gradient sums; the
                               * rows' tokens and weight gradients; the router's
                               * logit gradient; under ep in bf16 (not storage)
                               * the wire's rows both ways */
        double Hd = (double)H, Imd = (double)m->moe_intermediate_size;
        *acts += tokens * (double)m->num_experts_per_tok *
                 ((Hd + 1.25 * (2.0 * Hd + Imd)) * act_bytes +
                  (c->storage ? 1.25 * 4.0 * Hd : 0.0) + 2.0 * 4.0 +
                  (d->ep_size > 1 && c->bf16 && !c->storage ? 4.0 * Hd : 0.0)) / tp;
        *acts += tokens * (double)m->num_experts * act_bytes / tp;
    }
}

/* LoRA (peft:): the adapters' elements on a TP rank, per layer on average:
 * a column-parallel linear's lora_A whole and lora_B split, a
 * row-parallel one's the other way round (model_arena.c) */
static double lora_per_layer(const mt_config_t *cfg)
{
    const mt_model_config_t *m = &cfg->model;
    double tp = (double)cfg->distributed.tp_size, r = (double)cfg->peft.dim, n = 0;
    double H = (double)m->hidden_size, I = (double)m->intermediate_size;
    double Q = (double)(m->num_attention_heads * cfg->derived.head_dim);
    double KV = (double)(m->num_key_value_heads.value * cfg->derived.head_dim);
    static const char *const proj[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                       "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                       "mlp.down_proj"};
    const double out[7] = {Q, KV, KV, H, I, I, H}, in[7] = {H, H, H, Q, H, H, I};
    const bool row[7] = {false, false, false, true, false, false, true};
    char name[128];
    for (int64_t l = 0; l < m->num_hidden_layers; l++)
        for (int j = 0; j < 7; j++) {
            snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, proj[j]);
            if (mt_peft_matches(&cfg->peft, name))
                n += row[j] ? r * in[j] / tp + r * out[j] : r * in[j] + r * out[j] / tp;
        }
    return m->num_hidden_layers > 0 ? n / (double)m->num_hidden_layers : 0;
}

/* Pipeline rank r's estimate into *b. */
static mt_status_t rank_bytes(const mt_config_t *cfg, const mt_plan_t *plan, const plan_ctx_t *c,
                              int64_t r, rank_bytes_t *b)
{
    b->layers = (double)mt_plan_layers_on_rank(cfg, r);
    double expert, p_rank = rank_params(cfg, plan, c, r, b->layers, &expert);
    /* the largest fsdp unit, and the experts' (their fsdp's NCCL pads) */
    double pw = 0, gw = 0, unit_max = 0, xunit = 0;
    if (c->fsdp)
        MT_TRY(fsdp_work(cfg, plan, c, r, b->layers, p_rank, &pw, &gw, &unit_max));
    if (c->exp_sharded && b->layers > 0)
        MT_TRY(expert_work(cfg, c, b->layers, expert, &pw, &gw, &xunit));
    /* (experts: their fsdp's float32 shards, or an arena like the model's) */
    b->params = p_rank / c->fp * c->sbytes +
                expert / c->e_shard * (c->exp_sharded ? 4 : c->pbytes) + pw * c->pbytes;
    b->grads = (p_rank / c->fg + expert / c->e_shard) * c->gbytes + gw * c->gbytes;
    /* experts keep a master copy unless fsdp shards them (train_moe.c) */
    double obytes_exp = 8 + (c->bf16 && !c->exp_sharded ? 4 : 0);
    b->optim = p_rank / c->fo * c->obytes + expert / c->e_shard * obytes_exp;
    if (cfg->peft.enabled) { /* the frozen base whole on each data-parallel rank, no
                              * gradient or optimizer state; the adapters train */
        double unit = lora_per_layer(cfg), ad = unit * b->layers;
        /* fsdp shards the adapters, with two layers' units gathered at a time */
        double work = c->fsdp ? unit * (b->layers < 2 ? b->layers : 2) : 0;
        b->params = p_rank * c->pbytes + (ad / c->fp + work) * 4.0;
        b->grads = (ad / c->fg + work) * 4.0;
        b->optim = ad / c->fo * 8.0;
    }
    double tokens = micro_tokens(cfg);
    b->acts = layer_activations(cfg, c, r, b->layers, tokens, &b->nflight);
    ring_and_logits(cfg, c, r, tokens, &b->acts);
    backward_buffers(cfg, c, tokens, &b->acts);
    b->ws = 0, b->wire = 0;
    if (c->gpu)
        b->ws = (double)(MT_CUDA_LT_WORKSPACE_BYTES + MT_CUDA_SCRATCH_BYTES);
    if (c->nccl)
        b->wire = nccl_wire_bytes(cfg, c->msg_bufs[r], c->fsdp, &c->fso, unit_max, xunit,
                                  !c->exp_sharded && mt_moe_expert_replicas(cfg) > 1 ? expert : 0,
                                  tokens, p_rank + expert, c->storage);
    return MT_OK;
}

/* Every pipeline rank's estimate; the largest goes into plan. */
static mt_status_t worst_rank(const mt_config_t *cfg, mt_plan_t *plan, plan_ctx_t *c)
{
    plan->bytes_total = -1;
    /* the embedding sits with the first stage; norm, lm_head and loss with the last */
    c->first_rank = stage_rank(cfg, 0);
    c->last_rank = stage_rank(cfg, cfg->derived.num_stages - 1);
    for (int64_t r = 0; r < cfg->distributed.pp_size; r++) {
        rank_bytes_t b;
        MT_TRY(rank_bytes(cfg, plan, c, r, &b));
        double total = b.params + b.grads + b.optim + b.acts + b.ws + b.wire;
        if (total > plan->bytes_total) {
            plan->worst_pp_rank = (int)r;
            plan->layers_on_worst = (int64_t)b.layers;
            plan->bytes_params = b.params, plan->bytes_grads = b.grads;
            plan->bytes_optim = b.optim;
            plan->bytes_activations = b.acts, plan->bytes_total = total;
            plan->inflight_microbatches = b.nflight;
            plan->bytes_device_workspace = b.ws, plan->bytes_device_nccl = b.wire;
        }
    }
    return MT_OK;
}

mt_status_t mt_plan_compute_ex(const mt_config_t *cfg, unsigned flags, mt_plan_t *plan)
{
    memset(plan, 0, sizeof *plan);
    if (!cfg->validated)
        MT_FAIL(MT_ERR_RANGE, "mt_plan_compute needs a validated config");
    plan_ctx_t c;
    memset(&c, 0, sizeof c);
    count_params(cfg, plan, &c);
    sharding(cfg, &c);
    element_bytes(cfg, flags, plan, &c);
    MT_TRY(nccl_message_buffers(cfg, &c));
    mt_status_t s = bubble(cfg, plan, &c.sim);
    if (s == MT_OK) {
        s = worst_rank(cfg, plan, &c);
        mt_pp_sim_result_free(&c.sim);
    }
    free(c.msg_bufs);
    MT_TRY(s);
    return MT_OK;
}

double mt_plan_device_pool_bytes(const mt_plan_t *plan)
{
    return plan->bytes_total - plan->bytes_device_workspace;
}

double mt_plan_gpu_bytes_needed(const mt_plan_t *plan)
{
    return plan->bytes_total / MT_CUDA_MEMORY_SHARE;
}
