/* model_arena.c: the model's parameters (with Hugging Face names) and the
 * arenas behind them.  Everything the forward and backward touch is carved
 * out of three allocations made here, once: parameters, gradients (one
 * contiguous block each, in parameter order, so the optimizer and the
 * gradient reductions see flat buffers) and activations.  They and the
 * small per-token buffers the kernels read are the backend's memory
 * (be->device_alloc: device memory on a GPU); the tables describing them
 * are host memory. */
#include "mt_model.h"

#include "model_lora.h"
#include "model_moe.h"
#include "model_rope.h"
#include "mt_bf16.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mt_model_t *m;
    int64_t offset; /* running element offset into param/grad arenas */
    /* LoRA: the base goes to m->frozen at its own running offset; only
     * the adapters (add_lora) are parameters */
    bool frozen;
    int64_t foff;
} builder_t;

/* A parameter of logical shape [rows, cols] (cols 0: 1-D); this rank
 * holds its tp_dim split (-1: all of it). */
static mt_param_t *add_param(builder_t *b, const char *name, int64_t rows, int64_t cols,
                             bool norm, int tp_dim)
{
    const mt_model_t *m = b->m;
    mt_param_t *p = b->frozen ? &b->m->frozen[b->m->nfrozen++] : &b->m->params[b->m->nparams++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->full_shape[0] = rows;
    p->full_shape[1] = cols > 0 ? cols : 1;
    p->tp_dim = m->tp > 1 ? tp_dim : -1;
    if (p->tp_dim == 0) {
        rows /= m->tp;
        p->tp_off = m->tp_rank * rows;
    } else if (p->tp_dim == 1) {
        cols /= m->tp;
        p->tp_off = m->tp_rank * cols;
    }
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 1;
    p->numel = rows * (cols > 0 ? cols : 1);
    p->is_norm = p->no_decay = norm;
    int64_t *at = b->frozen ? &b->foff : &b->offset;
    p->offset = *at;
    *at += p->numel;
    return p;
}

/* LoRA on the frozen linear w when peft's target rules match it: lora_A
 * [r, in] and lora_B [out, r], trainable, split under TP as Megatron
 * splits them: a column-parallel w's A whole (each rank's gradient a
 * partial sum, its part of the output rows) and B by rows; a
 * row-parallel w's A by columns and B whole.  Decayed like any matrix
 * (AutoModel hands the optimizer every trainable tensor). */
static void add_lora(builder_t *b, const mt_config_t *cfg, mt_param_t *w)
{
    char name[MT_PARAM_NAME_MAX], mod[MT_PARAM_NAME_MAX];
    size_t n = strlen(w->name) - strlen(".weight");
    snprintf(mod, sizeof mod, "%.*s", (int)n, w->name);
    if (!b->m->lora || !mt_peft_matches(&cfg->peft, mod))
        return;
    int64_t r = b->m->lora_r;
    bool col = w->tp_dim == 0;
    b->frozen = false;
    snprintf(name, sizeof name, "%s.lora_A.weight", mod);
    w->lora_a = add_param(b, name, r, w->full_shape[1], false, w->tp_dim == 1 ? 1 : -1);
    w->lora_a->tp_partial_grad = b->m->tp > 1 && col;
    snprintf(name, sizeof name, "%s.lora_B.weight", mod);
    w->lora_b = add_param(b, name, w->full_shape[0], r, false, w->tp_dim == 0 ? 0 : -1);
    b->frozen = true;
}

/* The bias of the linear just added (w), named as Hugging Face names it
 * (".weight" -> ".bias"), its rows split as w's are: with the rows of a
 * column-parallel linear (tp_dim 0), whole for a row-parallel one, whose
 * bias is added once after the TP sum.  Not decayed (Megatron's rule for
 * biases, and this project's for the norms: 1-D tensors); zero at start,
 * as transformers' _init_weights leaves a Linear's bias. */
static mt_param_t *add_bias(builder_t *b, const mt_param_t *w)
{
    char name[MT_PARAM_NAME_MAX];
    size_t n = strlen(w->name) - strlen("weight");
    snprintf(name, sizeof name, "%.*sbias", (int)n, w->name);
    mt_param_t *p = add_param(b, name, w->full_shape[0], 0, false, w->tp_dim == 0 ? 0 : -1);
    p->no_decay = p->is_bias = true;
    return p;
}

/* Carve n floats from the activation arena (NULL arena: count only), in
 * whole 4 floats: every buffer starts 16-byte aligned (the arena's start
 * is), as the kernels' 16-byte accesses want (cuda_common.cuh's packs,
 * the attention's cp.async tiles: a misaligned buffer takes their
 * element-wise paths, the same bits, slower) */
static float *carve(float *base, int64_t *off, int64_t n)
{
    float *p = base ? base + *off : NULL;
    *off += (n + 3) / 4 * 4;
    return p;
}

/* Carve an activation of n elements: bf16 bits under bf16 storage (in
 * whole floats), else n floats */
static float *carve_act(const mt_model_t *m, float *base, int64_t *off, int64_t n)
{
    return carve(base, off, m->bf16_storage ? (n + 1) / 2 : n);
}

static void layer_acts(const mt_model_t *m, float *base, int64_t *off, mt_layer_acts_t *a,
                       bool with_x, bool mlp)
{
    /* Ns rows: this rank's tokens of the residual stream (sequence
     * parallelism); N rows: the whole sequence */
    int64_t N = m->N, Ns = m->Ns, H = m->H, Q = m->nh * m->hd, KV = m->nkv * m->hd;
    if (with_x)
        a->x = carve_act(m, base, off, Ns * H);
    a->x16 = NULL;
    a->h1 = carve_act(m, base, off, Ns * H); /* under sp: gathered again for backward */
    a->rstd1 = carve(base, off, Ns);
    if (m->qk_norm) {
        a->q_raw = carve_act(m, base, off, N * Q);
        a->k_raw = carve_act(m, base, off, N * KV);
        a->q_rstd = carve(base, off, N * m->nh);
        a->k_rstd = carve(base, off, N * m->nkv);
    } else {
        a->q_raw = a->k_raw = a->q_rstd = a->k_rstd = NULL;
    }
    a->q = carve_act(m, base, off, N * Q);
    a->k = carve_act(m, base, off, N * KV);
    a->v = carve_act(m, base, off, N * KV);
    a->att = carve_act(m, base, off, N * Q);
    a->lse = carve(base, off, N * m->nh);
    a->x_mid = carve_act(m, base, off, Ns * H);
    a->h2 = carve_act(m, base, off, Ns * H);
    a->rstd2 = carve(base, off, Ns);
    if (mlp) { /* a dense MLP's; a MoE layer keeps its own (model_moe.c) */
        a->g = carve_act(m, base, off, N * m->I);
        a->u = carve_act(m, base, off, N * m->I);
        a->a = carve_act(m, base, off, N * m->I);
    } else {
        a->g = a->u = a->a = NULL;
    }
    if (m->split_bw) {
        a->w_dmlp = carve_act(m, base, off, N * H);
        a->w_datt = carve_act(m, base, off, N * H);
        a->w_dq = carve_act(m, base, off, N * Q);
        a->w_dk = carve_act(m, base, off, N * KV);
        a->w_dv = carve_act(m, base, off, N * KV);
    } else {
        a->w_dmlp = a->w_datt = a->w_dq = a->w_dk = a->w_dv = NULL;
    }
}

int64_t mt_model_head_chunk(int64_t N, int64_t V)
{
    const char *e = getenv("MESHTRAIN_HEAD_CHUNK_ROWS");
    int64_t c = ((int64_t)256 << 20) / (4 * (V > 0 ? V : 1));
    /* at least MT_HEAD_CHUNK_MIN rows: the lm_head gradient GEMM sums c
     * rows into its float32 [V, H] accumulator per chunk, 2 c FLOPs for
     * each 8 bytes of it read and written, against an H200's 206 FLOPs a
     * byte: at 1024 rows that traffic takes 80% of the GEMM's compute
     * time, which only a perfect overlap would hide; at 2048, 40% */
    if (c < MT_HEAD_CHUNK_MIN)
        c = MT_HEAD_CHUNK_MIN;
    c -= c % MT_HEAD_CHUNK_ALIGN; /* whole GEMM tiles of rows */
    if (e && atoll(e) > 0)
        c = atoll(e);
    return c < N ? c : (N > 0 ? N : 1);
}

/* Lay out the activation buffers of chunk c: what a stage-microbatch
 * keeps from its forward to its backward (its layers' activations, the
 * output and the output gradient) from base, and the scratch that one pass
 * uses and leaves (the backward's working buffers, the recompute buffers
 * under activation checkpointing, the head's norm output and logits) from
 * shared, which every slot shares.  With
 * NULL bases only count; *nshared gets the shared part's size. */
static int64_t layout_acts(mt_model_t *m, float *base, float *shared, int c, int64_t *nshared)
{
    int64_t off = 0, sh = 0, N = m->N, Ns = m->Ns, H = m->H, Q = m->nh * m->hd;
    int64_t KV = m->nkv * m->hd;
    int lo = m->chunk_lo[c], hi = m->chunk_lo[c + 1];
    bool head = m->has_head && c == m->nchunks - 1;
    if (m->checkpointing) {
        /* the layer inputs: float32, or bf16 bits (2 bytes, in whole
         * floats) but for the stage input */
        for (int l = lo; l < hi; l++) {
            bool b = m->x_bf16 && l > lo;
            float *x = b ? carve(base, &off, (Ns * H + 1) / 2)
                         : carve_act(m, base, &off, Ns * H);
            m->acts[l].x = b ? NULL : x;
            m->acts[l].x16 = b ? (uint16_t *)x : NULL;
        }
        bool mlp = false; /* the shared scratch needs the MLP buffers if any layer is dense */
        for (int l = lo; l < hi; l++)
            mlp |= m->layers[l].router == NULL;
        layer_acts(m, shared, &sh, &m->scratch, false, mlp);
        for (int l = lo; l < hi; l++) {
            float *x = m->acts[l].x;
            uint16_t *x16 = m->acts[l].x16;
            m->acts[l] = m->scratch;
            m->acts[l].x = x, m->acts[l].x16 = x16;
        }
    } else {
        for (int l = lo; l < hi; l++)
            layer_acts(m, base, &off, &m->acts[l], true, m->layers[l].router == NULL);
    }
    m->x_final = carve_act(m, base, &off, Ns * H);
    m->dres = carve_act(m, base, &off, Ns * H);
    /* the head's forward and backward run in one pass (model.c) */
    m->xf = head ? carve_act(m, shared, &sh, N * H) : NULL;
    m->rstdf = head ? carve(shared, &sh, Ns) : NULL;
    m->head_chunk = mt_model_head_chunk(N, m->V);
    m->logits = head ? carve_act(m, shared, &sh, m->head_chunk * m->V) : NULL;
    m->dtmp = carve_act(m, shared, &sh, Ns * H);
    m->dh_local = m->sp ? carve_act(m, shared, &sh, Ns * H) : NULL;
    m->gather = m->sp ? carve_act(m, shared, &sh, N * H) : NULL;
    m->dh = carve_act(m, shared, &sh, N * H);
    m->dh_acc = m->bf16_storage ? carve(shared, &sh, N * H) : NULL;
    m->datt = carve_act(m, shared, &sh, N * (Q > H ? Q : H));
    m->dq = carve_act(m, shared, &sh, N * Q);
    m->dk = carve_act(m, shared, &sh, N * KV);
    m->dv = carve_act(m, shared, &sh, N * KV);
    m->dI = carve_act(m, shared, &sh, N * m->I);
    *nshared = sh;
    return off;
}

mt_status_t mt_model_init(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                          int64_t B, int64_t T)
{
    return mt_model_init_ep(m, cfg, be, B, T, 0, -1, -1, NULL);
}

mt_status_t mt_model_init_ex(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                             int64_t B, int64_t T, unsigned flags, int tp_rank)
{
    return mt_model_init_ep(m, cfg, be, B, T, flags, tp_rank, -1, NULL);
}

static mt_status_t model_init(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                              int64_t B, int64_t T, unsigned flags, int tp_rank, int ep_rank,
                              const mt_model_part_t *part);

mt_status_t mt_model_init_ep(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                             int64_t B, int64_t T, unsigned flags, int tp_rank, int ep_rank,
                             const mt_model_part_t *part)
{
    return model_init(m, cfg, be, B, T, flags, tp_rank, ep_rank, part);
}

mt_status_t mt_model_init_part(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                               int64_t B, int64_t T, unsigned flags, int tp_rank,
                               const mt_model_part_t *part)
{
    return model_init(m, cfg, be, B, T, flags, tp_rank, -1, part);
}

/* This rank's layers and chunks from part (NULL: everything, one chunk). */
static mt_status_t set_part(mt_model_t *m, const mt_model_part_t *part)
{
    int nc = part ? part->nchunks : 1;
    m->nchunks = nc;
    m->has_embed = part ? part->embed : true;
    m->has_head = part ? part->head : true;
    m->nslots = part && part->nslots > 0 ? part->nslots : 1;
    m->split_bw = part && part->split_backward;
    m->chunk_lo = malloc(sizeof *m->chunk_lo * (size_t)(nc + 1));
    if (!m->chunk_lo)
        MT_FAIL(MT_ERR_NOMEM, "chunk table");
    int64_t L = 0;
    for (int c = 0; c < nc; c++) {
        int lo = part ? part->layer_lo[c] : 0, hi = part ? part->layer_hi[c] : (int)m->L_full;
        if (lo < 0 || hi <= lo || hi > m->L_full || (c > 0 && lo < part->layer_hi[c - 1]))
            MT_FAIL(MT_ERR_RANGE, "stage %d: layers [%d, %d) of %lld", c, lo, hi,
                    (long long)m->L_full);
        m->chunk_lo[c] = (int)L;
        L += hi - lo;
    }
    m->chunk_lo[nc] = (int)L;
    m->L = L;
    m->layer_id = malloc(sizeof *m->layer_id * (size_t)(L > 0 ? L : 1));
    if (!m->layer_id)
        MT_FAIL(MT_ERR_NOMEM, "layer table");
    for (int c = 0, l = 0; c < nc; c++)
        for (int g = part ? part->layer_lo[c] : 0; g < (part ? part->layer_hi[c] : m->L_full); g++)
            m->layer_id[l++] = g;
    if (m->tied && m->has_head && !m->has_embed)
        MT_FAIL(MT_ERR_UNSUPPORTED, "tie_word_embeddings: the last pipeline stage needs the "
                "embedding, which another rank holds; not in this release");
    if (m->split_bw && m->checkpointing)
        MT_FAIL(MT_ERR_UNSUPPORTED, "a split backward (zero_bubble, v_schedule) with "
                "activation_checkpointing is not in this release: the weight-gradient pass "
                "needs each layer's stored activations");
    return MT_OK;
}

static mt_status_t model_init(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                              int64_t B, int64_t T, unsigned flags, int tp_rank, int ep_rank,
                              const mt_model_part_t *part)
{
    memset(m, 0, sizeof *m);
    if (!cfg->validated)
        MT_FAIL(MT_ERR_RANGE, "mt_model_init needs a validated config");
    const mt_model_config_t *mc = &cfg->model;
    m->be = be;
    /* tp_rank -1: the whole model on one device, whatever tp_size says */
    m->tp = tp_rank < 0 ? 1 : (int)cfg->distributed.tp_size;
    m->tp_rank = tp_rank < 0 ? 0 : tp_rank;
    int64_t Vp = cfg->derived.padded_vocab;
    m->V_valid_full = mc->vocab_size;
    m->V = Vp / m->tp, m->v_lo = m->tp_rank * m->V;
    m->V_valid = m->V_valid_full - m->v_lo;
    m->V_valid = m->V_valid < 0 ? 0 : m->V_valid > m->V ? m->V : m->V_valid;
    m->H = mc->hidden_size, m->I = mc->intermediate_size / m->tp;
    m->L_full = mc->num_hidden_layers;
    m->nh = mc->num_attention_heads / m->tp, m->nkv = mc->num_key_value_heads.value / m->tp;
    m->hd = cfg->derived.head_dim;
    m->eps = (float)mc->rms_norm_eps, m->init_std = mc->initializer_range;
    m->tied = mc->tie_word_embeddings, m->qk_norm = mc->qk_norm;
    m->qk_norm_whole = mt_model_qk_norm_whole(mc);
    m->checkpointing = cfg->distributed.activation_checkpointing;
    m->bf16 = cfg->distributed.mp_policy.param_dtype == MT_DTYPE_BFLOAT16;
    /* bf16 storage: every activation is bf16 bits already (and the kept
     * layer inputs with them) */
    m->bf16_storage = be->stores_bf16;
    m->x_bf16 = m->bf16 && m->checkpointing && !m->bf16_storage;
    if (be->rounds_bf16 && !m->bf16)
        MT_FAIL(MT_ERR_CONFIG, "the %s backend rounds activations to bf16: it serves "
                "mp_policy.param_dtype bfloat16 only", be->name);

    m->B = B, m->T = T, m->N = B * T;
    m->window = mc->sliding_window.set ? mc->sliding_window.value : 0;
    m->sp = m->tp > 1 && cfg->distributed.sequence_parallel;
    m->Ns = m->sp ? m->N / m->tp : m->N;
    if (m->tp > 1 && m->N * m->H > 2147483647LL)
        MT_FAIL(MT_ERR_UNSUPPORTED, "tensor-parallel collectives of %lld x %lld elements need "
                "64-bit MPI counts (MPI-4 large counts), not in this release: use a smaller "
                "micro-batch", (long long)m->N, (long long)m->H);
    if (m->sp && m->N % m->tp)
        MT_FAIL(MT_ERR_CONFIG, "sequence parallelism: %lld tokens per micro-batch are not "
                "divisible by tp_size %d", (long long)m->N, m->tp);
    if (m->hd % 2)
        MT_FAIL(MT_ERR_CONFIG, "head_dim %lld must be even for RoPE", (long long)m->hd);
    if (mc->mlp_bias && mc->num_experts > 0) /* model_moe.c's experts have no bias */
        MT_FAIL(MT_ERR_UNSUPPORTED, "model.mlp_bias with num_experts %lld: MoE layers with "
                "biases on their experts are not in this release",
                (long long)mc->num_experts);

    mt_status_t st = set_part(m, part);
    if (st != MT_OK) {
        mt_model_free(m);
        return st;
    }
    /* per layer at most: 2 norms, q, k, v, o, q_norm, k_norm, router, gate, up, down
     * and the 7 biases */
    int maxp = 3 + 19 * (int)m->L;
    m->params = calloc((size_t)maxp, sizeof *m->params);
    m->lora = cfg->peft.enabled;
    if (m->lora) {
        m->lora_r = cfg->peft.dim;
        m->lora_scale = (float)(cfg->peft.alpha / (double)cfg->peft.dim);
        m->lora_init = (int)cfg->peft.lora_A_init;
        m->frozen = calloc((size_t)maxp, sizeof *m->frozen);
        bool nyi = mc->num_experts > 0 || m->bf16_storage || m->split_bw;
        if (!m->frozen || nyi) {
            mt_model_free(m);
            if (nyi)
                MT_FAIL(MT_ERR_UNSUPPORTED, "peft: LoRA on MoE models, with bf16 storage "
                        "(MESHTRAIN_BF16_STORAGE=0 keeps float32) or a "
                        "split backward is not supported yet");
            MT_FAIL(MT_ERR_NOMEM, "the frozen base's table");
        }
    }
    m->layers = calloc((size_t)(m->L > 0 ? m->L : 1), sizeof *m->layers);
    m->acts = calloc((size_t)(m->L > 0 ? m->L : 1), sizeof *m->acts);
    size_t tok_bytes = sizeof(int32_t) * (size_t)m->N;
    m->pos = be->device_alloc(tok_bytes);
    m->tok_local = be->device_alloc(tok_bytes);
    m->targets_dev = be->device_alloc(tok_bytes);
    m->doc_mem = be->device_alloc(tok_bytes);
    m->host_i32 = malloc(tok_bytes ? tok_bytes : 1);
    if (m->tp > 1) {
        m->ce_mx = be->device_alloc(sizeof *m->ce_mx * (size_t)m->N);
        m->ce_z = be->device_alloc(sizeof *m->ce_z * (size_t)m->N);
        m->ce_ly = be->device_alloc(sizeof *m->ce_ly * (size_t)m->N);
        if (!m->ce_mx || !m->ce_z || !m->ce_ly) {
            mt_model_free(m);
            MT_FAIL(MT_ERR_NOMEM, "tensor-parallel buffers");
        }
    }
    m->nunits = (int)m->L + 2;
    m->unit_lo = malloc(sizeof *m->unit_lo * (size_t)(m->nunits + 1));
    if (!m->params || !m->layers || !m->acts || !m->pos || !m->tok_local || !m->targets_dev ||
        !m->doc_mem || !m->host_i32 || !m->unit_lo) {
        mt_model_free(m);
        MT_FAIL(MT_ERR_NOMEM, "model tables for %lld layers", (long long)m->L);
    }
    st = mt_rope_init(m, mc); /* the inverse frequencies, in backend memory */
    if (st != MT_OK) {
        mt_model_free(m);
        return st;
    }

    builder_t b = {m, 0, m->lora, 0};
    bool qkv_bias = mt_model_qkv_bias(mc), o_bias = mt_model_o_bias(mc);
    int64_t H = m->H, Q = mc->num_attention_heads * m->hd;
    int64_t KV = mc->num_key_value_heads.value * m->hd, I = mc->intermediate_size;
    char name[MT_PARAM_NAME_MAX];
    if (m->has_embed)
        m->embed = add_param(&b, "model.embed_tokens.weight", Vp, H, false, 0);
    for (int l = 0; l < m->L; l++) {
        mt_layer_params_t *p = &m->layers[l];
        m->unit_lo[l + 1] = b.offset; /* the layer's unit starts here */
#define LP(field, suffix, rows, cols, norm, tp_dim)                                   \
    do {                                                                                \
        snprintf(name, sizeof name, "model.layers.%d.%s", m->layer_id[l], suffix);     \
        p->field = add_param(&b, name, rows, cols, norm, tp_dim);                       \
        if ((cols) > 0 && !(norm))                                                      \
            add_lora(&b, cfg, p->field);                                                \
    } while (0)
#define LB(field, weight, on)                                                         \
    do {                                                                                \
        if (on)                                                                         \
            p->field = add_bias(&b, p->weight);                                         \
    } while (0)
        LP(attn_norm, "input_layernorm.weight", H, 0, true, -1);
        LP(wq, "self_attn.q_proj.weight", Q, H, false, 0);
        LB(bq, wq, qkv_bias);
        LP(wk, "self_attn.k_proj.weight", KV, H, false, 0);
        LB(bk, wk, qkv_bias);
        LP(wv, "self_attn.v_proj.weight", KV, H, false, 0);
        LB(bv, wv, qkv_bias);
        LP(wo, "self_attn.o_proj.weight", H, Q, false, 1);
        LB(bo, wo, o_bias);
        if (m->qk_norm) {
            const int64_t gq = m->qk_norm_whole ? m->nh : 1, gk = m->qk_norm_whole ? m->nkv : 1;
            /* over the whole projection the norm weight is split like the
             * heads, its gradient local; per head every rank holds it whole */
            const int64_t tq = m->qk_norm_whole ? m->tp : 1;
            const int nd = m->qk_norm_whole ? 0 : -1;
            LP(q_norm, "self_attn.q_norm.weight", m->hd * gq * tq, 0, true, nd);
            LP(k_norm, "self_attn.k_norm.weight", m->hd * gk * tq, 0, true, nd);
            p->q_norm->tp_partial_grad = p->k_norm->tp_partial_grad =
                m->tp > 1 && !m->qk_norm_whole;
        }
        LP(mlp_norm, "post_attention_layernorm.weight", H, 0, true, -1);
        /* under sequence parallelism each rank normalises its own tokens */
        p->attn_norm->tp_partial_grad = p->mlp_norm->tp_partial_grad = m->sp;
        if (mt_moe_is_sparse(cfg, m->layer_id[l])) { /* the router; the experts: model_moe.c */
            /* Under TP each rank routes its own tokens through whole
             * weights (model_moe.h): the router and the shared experts are
             * not split, and each TP rank's gradient is a partial sum. */
            mt_moe_router_name(mt_model_arch(mc), m->layer_id[l], name, sizeof name);
            p->router = add_param(&b, name, mc->num_experts, H, false, -1);
            p->router->tp_partial_grad = m->tp > 1;
            if (mc->num_shared_experts > 0) { /* DeepSeek's always-active shared experts */
                int64_t S = mc->num_shared_experts * mc->moe_intermediate_size;
                LP(wgate, "mlp.shared_experts.gate_proj.weight", S, H, false, -1);
                LP(wup, "mlp.shared_experts.up_proj.weight", S, H, false, -1);
                LP(wdown, "mlp.shared_experts.down_proj.weight", H, S, false, -1);
                p->wgate->tp_partial_grad = p->wup->tp_partial_grad = m->tp > 1;
                p->wdown->tp_partial_grad = m->tp > 1;
            }
        } else {
            LP(wgate, "mlp.gate_proj.weight", I, H, false, 0);
            LB(bgate, wgate, mc->mlp_bias);
            LP(wup, "mlp.up_proj.weight", I, H, false, 0);
            LB(bup, wup, mc->mlp_bias);
            LP(wdown, "mlp.down_proj.weight", H, I, false, 1);
            LB(bdown, wdown, mc->mlp_bias);
        }
#undef LB
#undef LP
    }
    int64_t head_lo = b.offset;
    if (m->has_head) {
        m->final_norm = add_param(&b, "model.norm.weight", H, 0, true, -1);
        m->final_norm->tp_partial_grad = m->sp;
        m->lm_head = m->tied ? m->embed : add_param(&b, "lm_head.weight", Vp, H, false, 0);
    }
    m->numel = b.offset;
    /* unit 0 the embedding, l + 1 layer l, L + 1 the head: empty where the
     * rank does not hold them */
    m->unit_lo[0] = 0;
    m->unit_lo[m->L + 1] = head_lo;
    m->frozen_numel = b.foff;
    m->unit_lo[m->L + 2] = m->numel;

    if (!(flags & MT_MODEL_NO_PARAM_ARENA)) /* bf16 storage: bf16 bits */
        m->param_mem = be->device_alloc(mt_act_bytes(m, m->numel));
    if (!(flags & MT_MODEL_NO_GRAD_ARENA))
        m->grad_mem = be->device_alloc(sizeof(float) * (size_t)m->numel);
    int64_t shared = 0;
    for (int c = 0; c < m->nchunks; c++) { /* a slot fits any chunk */
        int64_t sh, n = layout_acts(m, NULL, NULL, c, &sh);
        m->slot_numel = n > m->slot_numel ? n : m->slot_numel;
        shared = sh > shared ? sh : shared;
    }
    m->act_numel = m->slot_numel * m->nslots + shared;
    if (!(flags & MT_MODEL_NO_ACT_ARENA))
        m->act_mem = be->device_alloc(sizeof(float) * (size_t)m->act_numel);
    if ((!m->param_mem && !(flags & MT_MODEL_NO_PARAM_ARENA)) ||
        (!m->grad_mem && !(flags & MT_MODEL_NO_GRAD_ARENA)) ||
        (!m->act_mem && !(flags & MT_MODEL_NO_ACT_ARENA))) {
        int64_t p = m->numel, a = m->act_numel;
        mt_model_free(m);
        MT_FAIL(MT_ERR_NOMEM, "model arenas: %lld parameters and %lld activation floats",
                (long long)p, (long long)a);
    }
    for (int i = 0; i < m->nparams; i++) {
        int64_t off = m->params[i].offset;
        m->params[i].data = m->param_mem ? mt_act_at(m, m->param_mem, off) : NULL;
        m->params[i].grad = m->grad_mem ? m->grad_mem + off : NULL;
    }
    if (m->lora && !(flags & MT_MODEL_NO_ACT_ARENA)) {
        mt_status_t ls = mt_lora_alloc(m);
        if (ls != MT_OK) {
            mt_model_free(m);
            return ls;
        }
    }
    if (qkv_bias || o_bias || mc->mlp_bias) {
        m->ones = be->device_alloc(mt_act_bytes(m, m->N));
        if (!m->ones) {
            mt_model_free(m);
            MT_FAIL(MT_ERR_NOMEM, "the biases' ones vector");
        }
        void *one = malloc(mt_act_bytes(m, m->N) + 1);
        if (!one) {
            mt_model_free(m);
            MT_FAIL(MT_ERR_NOMEM, "the biases' ones vector");
        }
        for (int64_t i = 0; i < m->N; i++) {
            if (m->bf16_storage)
                ((uint16_t *)one)[i] = mt_f32_to_bf16(1.0f);
            else
                ((float *)one)[i] = 1.0f;
        }
        be->copy_to_device(m->ones, one, mt_act_bytes(m, m->N));
        free(one);
    }
    if (m->act_mem)
        mt_model_use_slot(m, 0, 0);
    mt_model_set_packing(m, NULL, NULL); /* positions 0..T-1 in every row */
    if (mc->num_experts > 0) {
        mt_status_t s = mt_moe_init(m, cfg, ep_rank < 0 ? 0 : ep_rank,
                                    ep_rank < 0 ? 1 : (int)cfg->distributed.ep_size,
                                    (flags & MT_MODEL_NO_EXPERT_ARENAS) != 0,
                                    (flags & MT_MODEL_NO_ACT_ARENA) != 0);
        if (s != MT_OK) {
            mt_model_free(m);
            return s;
        }
        mt_moe_use_slot(m, 0);
    }
    return MT_OK;
}

void mt_model_use_slot(mt_model_t *m, int slot, int c)
{
    int64_t sh;
    layout_acts(m, m->act_mem + (int64_t)slot * m->slot_numel,
                m->act_mem + (int64_t)m->nslots * m->slot_numel, c, &sh);
    if (m->moe)
        mt_moe_use_slot(m, slot);
}

void mt_model_free(mt_model_t *m)
{
    free(m->layer_id);
    free(m->chunk_lo);
    mt_moe_free(m);
    free(m->params);
    free(m->frozen);
    free(m->layers);
    free(m->acts);
    free(m->unit_lo);
    free(m->host_i32);
    mt_rope_free(m);
    if (m->be) { /* NULL: nothing of the backend's was allocated */
        void *dev[] = {m->pos,   m->tok_local, m->targets_dev, m->doc_mem,  m->ce_mx,
                       m->ce_z,  m->ce_ly,     m->param_mem,   m->grad_mem, m->act_mem,
                       m->ones,  m->frozen_mem,   m->lora_sink,   m->lora_z,   m->lora_u};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            m->be->device_free(dev[i]);
    }
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------ counts */

void mt_model_zero_grad(mt_model_t *m)
{
    if (m->grad_mem)
        m->be->zero(m->grad_mem, sizeof(float) * (size_t)m->numel);
    if (m->moe)
        mt_moe_zero_grad(m);
}

int64_t mt_model_logical_numel(const mt_model_t *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->nparams; i++)
        n += m->params[i].full_shape[0] * m->params[i].full_shape[1];
    return n + (m->moe ? mt_moe_logical_numel(m) : 0);
}

double mt_model_flops_per_token(const mt_model_t *m)
{
    double mm = 0;
    for (int i = 0; i < m->nparams; i++)
        if (m->params[i].ndim == 2 && &m->params[i] != m->embed)
            mm += (double)m->params[i].numel;
    double mf = 0; /* frozen (LoRA): forward and input gradient, no weight gradient */
    for (int i = 0; i < m->nfrozen; i++)
        if (m->frozen[i].ndim == 2 && &m->frozen[i] != m->embed)
            mf += (double)m->frozen[i].numel;
    if (m->tied && m->has_head) /* lm_head is a matmul even when tied */
        *(m->lora ? &mf : &mm) += (double)(m->V * m->H);
    if (m->moe) /* the experts a token visits */
        mm += mt_moe_flops_per_token(m) / 6.0;
    /* attention's QK^T and PV over this rank's heads, nh * hd wide (the
     * biases are no matmuls: 1-D, left out above) */
    return 6.0 * mm + 4.0 * mf + 6.0 * (double)m->L * (double)m->T * (double)(m->nh * m->hd);
}
