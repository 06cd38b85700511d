/* model_decode.c: incremental decoding with a KV cache (mt_decode.h).
 *
 * The layer computes what model.c's layer_forward computes, for the n new
 * tokens of a sequence at positions p0 .. p0 + n - 1:
 *   x += o_proj(attention(rope(q_proj(h)), cached keys, cached values))
 *   x += down_proj(silu(gate_proj(h)) * up_proj(h)),  h = rmsnorm(x)
 * where the new rows of k_proj (rotated) and v_proj are written into the
 * cache first, and attention is the block kernel over cache rows
 * [k0, p0 + n): k0 = 0, or the first key the window lets the first new
 * query see.  With a window the cache holds a bounded number of rows
 * (d->cap) from global position d->base on, and keeps only the window's
 * when it fills.  Prompts longer than the buffers go through in chunks of
 * d->chunk rows.  A MoE layer's MLP is the model's own MoE code
 * (model_moe.c) on one token at a time.  Float32 throughout; no MPI, no
 * training state. */
#include "mt_decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_moe.h"
#include "model_rope.h"

/* rows of the activation buffers: a prompt goes through this many at once */
#define DECODE_CHUNK 256

/* With a window W the chunks are at most W rows, so that the cache holds
 * 2 W + chunk rows and moves its last W - 1 rows to the front once every
 * W + chunk tokens or so */
static int64_t chunk_rows(const mt_decode_t *d)
{
    int64_t c = d->max_len < DECODE_CHUNK ? d->max_len : DECODE_CHUNK;
    const int64_t W = d->m->window;
    return W > 0 && W < c ? W : c;
}

void mt_decode_free(mt_decode_t *d)
{
    const mt_backend_t *be = d->m ? d->m->be : NULL;
    if (be) {
        for (int64_t l = 0; d->kc && l < d->m->L; l++) {
            be->device_free(d->kc[l]);
            be->device_free(d->vc[l]);
        }
        void *dev[] = {d->x,   d->h,  d->x_mid, d->q,    d->q_raw,   d->k_raw, d->att,
                       d->g,   d->u,  d->a,     d->logits, d->ones,  d->rstd,  d->qk_rstd,
                       d->lse, d->tok, d->pos,  d->ds};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            be->device_free(dev[i]);
    }
    free(d->kc);
    free(d->vc);
    free(d->host_i32);
    free(d->host_lse);
    memset(d, 0, sizeof *d);
}

void mt_decode_reset(mt_decode_t *d)
{
    d->len = d->base = 0;
}

static void *dalloc(const mt_backend_t *be, int64_t n, size_t elem, bool *ok)
{
    void *p = be->device_alloc((size_t)n * elem);
    if (!p)
        *ok = false;
    return p;
}

mt_status_t mt_decode_init(mt_decode_t *d, const mt_model_t *m, int64_t max_len)
{
    memset(d, 0, sizeof *d);
    if (max_len < 1)
        MT_FAIL(MT_ERR_RANGE, "a decoder for %lld positions: at least 1", (long long)max_len);
    /* MoE layers route one token at a time through the model's own MoE
     * code, which works on the model's micro-batch: it must be one token */
    if (m->moe && (m->moe->N != 1 || m->moe->ep != 1 || !m->moe->act || !m->route))
        MT_FAIL(MT_ERR_UNSUPPORTED, "generation with MoE layers needs the model built for "
                "one token at a time (B = T = 1, all experts, activations: its micro-batch "
                "here is %lld tokens)", (long long)m->moe->N);
    if (m->tp > 1 || !m->has_embed || !m->has_head || m->L != m->L_full)
        MT_FAIL(MT_ERR_UNSUPPORTED, "generation needs the whole model on one device (this "
                "one holds a tensor- or pipeline-parallel part)");
    if (m->bf16_storage || m->be->stores_bf16)
        MT_FAIL(MT_ERR_UNSUPPORTED, "generation on a bf16-storage backend table (%s)",
                m->be->name);
    if (!m->param_mem && m->embed->data == NULL)
        MT_FAIL(MT_ERR_RANGE, "generation needs the model's parameters in place");
    const mt_rope_spec_t *rs = &m->rope->spec;
    if (rs->scaling.rope_type == MT_ROPE_DYNAMIC && max_len > rs->max_position_embeddings)
        MT_FAIL(MT_ERR_UNSUPPORTED, "generation of %lld positions with dynamic NTK RoPE "
                "beyond model.max_position_embeddings %lld: its table changes with the length "
                "and the cached keys would keep the old one", (long long)max_len,
                (long long)rs->max_position_embeddings);
    d->m = m;
    d->max_len = max_len;
    const mt_backend_t *be = m->be;
    const int64_t C = chunk_rows(d), H = m->H, Q = m->nh * m->hd, KV = m->nkv * m->hd;
    const int64_t W = m->window;
    d->cap = W > 0 && 2 * W + C < max_len ? 2 * W + C : max_len;
    bool ok = true;
    d->kc = calloc((size_t)m->L, sizeof *d->kc);
    d->vc = calloc((size_t)m->L, sizeof *d->vc);
    d->host_i32 = malloc(sizeof(int32_t) * (size_t)C);
    d->host_lse = malloc(sizeof(float) * (size_t)(C * m->nh));
    if (!d->kc || !d->vc || !d->host_i32 || !d->host_lse) {
        mt_decode_free(d);
        MT_FAIL(MT_ERR_NOMEM, "decoder host buffers");
    }
    for (int64_t l = 0; l < m->L; l++) {
        d->kc[l] = dalloc(be, d->cap * KV, sizeof(float), &ok);
        d->vc[l] = dalloc(be, d->cap * KV, sizeof(float), &ok);
    }
    d->x = dalloc(be, C * H, sizeof(float), &ok);
    d->h = dalloc(be, C * H, sizeof(float), &ok);
    d->x_mid = dalloc(be, C * H, sizeof(float), &ok);
    d->q = dalloc(be, C * Q, sizeof(float), &ok);
    d->q_raw = dalloc(be, C * Q, sizeof(float), &ok);
    d->k_raw = dalloc(be, C * KV, sizeof(float), &ok);
    d->att = dalloc(be, C * Q, sizeof(float), &ok);
    d->g = dalloc(be, C * m->I, sizeof(float), &ok);
    d->u = dalloc(be, C * m->I, sizeof(float), &ok);
    d->a = dalloc(be, C * m->I, sizeof(float), &ok);
    d->logits = dalloc(be, C * m->V, sizeof(float), &ok);
    d->ones = dalloc(be, C, sizeof(float), &ok);
    d->rstd = dalloc(be, C, sizeof(float), &ok);
    d->qk_rstd = dalloc(be, C * m->nh, sizeof(float), &ok);
    d->lse = dalloc(be, C * m->nh, sizeof(float), &ok);
    d->tok = dalloc(be, C, sizeof(int32_t), &ok);
    d->pos = dalloc(be, C, sizeof(int32_t), &ok);
    d->ds = dalloc(be, C, sizeof(int32_t), &ok);
    if (!ok) {
        int64_t n = d->cap;
        mt_decode_free(d);
        MT_FAIL(MT_ERR_NOMEM, "KV cache of %lld positions x %lld layers", (long long)n,
                (long long)m->L);
    }
    float *one = (float *)d->host_lse; /* (scratch: at least C floats) */
    for (int64_t i = 0; i < C; i++)
        one[i] = 1.0f;
    be->copy_to_device(d->ones, one, sizeof(float) * (size_t)C);
    for (int64_t i = 0; i < C * m->nh; i++) /* the running lse a block merges into */
        d->host_lse[i] = -INFINITY;
    return MT_OK;
}

/* y[n,out] = x[n,in] W^T (+ b), as model.c's linear: the bias rows first */
static void lin(const mt_decode_t *d, float *y, const float *x, const mt_param_t *w,
                const mt_param_t *b, int64_t n)
{
    const mt_backend_t *be = d->m->be;
    if (b)
        be->matmul(y, d->ones, b->data, n, b->shape[0], 1, false, false, 0.0f);
    be->matmul(y, x, w->data, n, w->shape[0], w->shape[1], false, true, b ? 1.0f : 0.0f);
}

/* out = res + a W^T (+ b): the bias rows, the GEMM onto them, then the residual */
static void lin_residual(const mt_decode_t *d, float *out, const float *res, const float *a,
                         const mt_param_t *w, const mt_param_t *b, int64_t n)
{
    lin(d, out, a, w, b, n);
    d->m->be->add(out, res, n * d->m->H);
}

static void qk_norm(const mt_decode_t *d, float *out, const float *x, const float *w,
                    int64_t heads, int64_t n)
{
    const mt_model_t *m = d->m;
    const int64_t g = m->qk_norm_whole ? heads : 1; /* OLMoE: the whole projection */
    m->be->rmsnorm_forward(out, d->qk_rstd, x, w, n * heads / g, m->hd * g, m->eps);
}

/* One layer over n rows at positions p0.. (d->pos, d->ds set) */
static void layer(mt_decode_t *d, int64_t l, int64_t p0, int64_t n, bool windowed, int64_t k0)
{
    const mt_model_t *m = d->m;
    const mt_backend_t *be = m->be;
    const mt_layer_params_t *p = &m->layers[l];
    const int64_t H = m->H, KV = m->nkv * m->hd;
    float *kn = d->kc[l] + (p0 - d->base) * KV, *vn = d->vc[l] + (p0 - d->base) * KV;

    be->rmsnorm_forward(d->h, d->rstd, d->x, p->attn_norm->data, n, H, m->eps);
    if (m->qk_norm) {
        lin(d, d->q_raw, d->h, p->wq, p->bq, n);
        lin(d, d->k_raw, d->h, p->wk, p->bk, n);
        qk_norm(d, d->q, d->q_raw, p->q_norm->data, m->nh, n);
        qk_norm(d, kn, d->k_raw, p->k_norm->data, m->nkv, n);
    } else {
        lin(d, d->q, d->h, p->wq, p->bq, n);
        lin(d, kn, d->h, p->wk, p->bk, n);
    }
    lin(d, vn, d->h, p->wv, p->bv, n);
    be->rope_forward(d->q, d->pos, n, m->nh, m->hd, m->rope->inv_freq, m->rope->scale);
    be->rope_forward(kn, d->pos, n, m->nkv, m->hd, m->rope->inv_freq, m->rope->scale);
    /* attention over the cache: a running (out 0, lse -inf) merged with one block */
    be->zero(d->att, sizeof(float) * (size_t)(n * m->nh * m->hd));
    be->copy_to_device(d->lse, d->host_lse, sizeof(float) * (size_t)(n * m->nh));
    be->attention_block_forward(d->att, d->lse, n, d->q, d->kc[l] + (k0 - d->base) * KV,
                                d->vc[l] + (k0 - d->base) * KV, windowed ? d->ds : NULL, n, p0 + n - k0,
                                p0, k0, m->nh, m->nkv, m->hd);
    lin_residual(d, d->x_mid, d->x, d->att, p->wo, p->bo, n);

    be->rmsnorm_forward(d->h, d->rstd, d->x_mid, p->mlp_norm->data, n, H, m->eps);
    if (p->router) { /* x = x_mid + MoE(h), a token at a time (the model's micro-batch) */
        mt_model_t *mm = (mt_model_t *)m;
        for (int64_t r = 0; r < n; r++) {
            memset(mm->route, 0, sizeof(double) * (size_t)mm->nroute); /* (unused totals) */
            mt_moe_forward(mm, (int)l, d->h + r * H, d->x_mid + r * H, d->x + r * H);
        }
        return;
    }
    lin(d, d->g, d->h, p->wgate, p->bgate, n);
    lin(d, d->u, d->h, p->wup, p->bup, n);
    be->swiglu_forward(d->a, d->g, d->u, n * m->I);
    lin_residual(d, d->x, d->x_mid, d->a, p->wdown, p->bdown, n);
}

/* n <= chunk rows at p0; logits of rows [r0, n) to host out [n - r0, V_valid] */
static void chunk_forward(mt_decode_t *d, const int32_t *tokens, int64_t n, float *out,
                          int64_t r0)
{
    const mt_model_t *m = d->m;
    const mt_backend_t *be = m->be;
    const int64_t p0 = d->len, H = m->H, W = m->window;
    if (m->moe)
        m->moe->training = false;
    be->copy_to_device(d->tok, tokens, sizeof(int32_t) * (size_t)n);
    be->embedding_forward(d->x, d->tok, m->embed->data, n, H);
    for (int64_t i = 0; i < n; i++)
        d->host_i32[i] = (int32_t)(p0 + i);
    be->copy_to_device(d->pos, d->host_i32, sizeof(int32_t) * (size_t)n);
    /* the window: query p0 + i sees keys > p0 + i - W; cache rows before
     * the first query's window are not read at all */
    int64_t k0 = 0;
    bool windowed = W > 0 && p0 + n > W;
    if (windowed) {
        k0 = p0 - W + 1 > 0 ? p0 - W + 1 : 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t lo = p0 + i - W + 1;
            d->host_i32[i] = (int32_t)(lo > k0 ? lo : k0);
        }
        be->copy_to_device(d->ds, d->host_i32, sizeof(int32_t) * (size_t)n);
    }
    if (p0 + n - d->base > d->cap) { /* keep rows [k0, p0): the window's, at the front */
        const int64_t KV = m->nkv * m->hd, shift = k0 - d->base;
        for (int64_t l = 0; l < m->L; l++)
            for (int64_t r = 0; r < p0 - k0; r++) { /* forward, a row at a time: no overlap */
                be->copy(d->kc[l] + r * KV, d->kc[l] + (r + shift) * KV, sizeof(float) * (size_t)KV);
                be->copy(d->vc[l] + r * KV, d->vc[l] + (r + shift) * KV, sizeof(float) * (size_t)KV);
            }
        d->base = k0;
    }
    for (int64_t l = 0; l < m->L; l++)
        layer(d, l, p0, n, windowed, k0);
    d->len += n;
    if (!out || r0 >= n)
        return;
    const int64_t rows = n - r0;
    be->rmsnorm_forward(d->h, d->rstd, d->x + r0 * H, m->final_norm->data, rows, H, m->eps);
    be->matmul(d->logits, d->h, m->lm_head->data, rows, m->V, H, false, true, 0.0f);
    for (int64_t i = 0; i < rows; i++) /* the real vocabulary's columns */
        be->copy_to_host(out + i * m->V_valid, d->logits + i * m->V,
                         sizeof(float) * (size_t)m->V_valid);
}

mt_status_t mt_decode_forward(mt_decode_t *d, const int32_t *tokens, int64_t n, float *logits,
                              bool all_rows)
{
    const mt_model_t *m = d->m;
    if (n < 1)
        MT_FAIL(MT_ERR_RANGE, "decoding %lld tokens: at least 1", (long long)n);
    if (d->len + n > d->max_len)
        MT_FAIL(MT_ERR_RANGE, "the sequence would hold %lld tokens; the decoder was made for "
                "%lld", (long long)(d->len + n), (long long)d->max_len);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->V_valid)
            MT_FAIL(MT_ERR_RANGE, "token %lld of the input is id %d, outside the model's "
                    "vocabulary [0, %lld)", (long long)i, tokens[i], (long long)m->V_valid);
    const int64_t C = chunk_rows(d);
    for (int64_t c0 = 0; c0 < n; c0 += C) {
        const int64_t k = n - c0 < C ? n - c0 : C;
        const bool last = c0 + k == n;
        float *out = !logits ? NULL : all_rows ? logits + c0 * m->V_valid : last ? logits : NULL;
        chunk_forward(d, tokens + c0, k, out, all_rows ? 0 : k - 1);
    }
    m->be->synchronize();
    return MT_OK;
}
