/* test_model: the whole model's hand-written backward.
 *
 * 1. Gradient check against central finite differences of the model loss,
 *    for every parameter tensor (embedding, attention and MLP projections,
 *    every norm, lm_head), along a random direction restricted to that
 *    tensor:  (L(w + h d) - L(w - h d)) / 2h  versus  <grad, d>.  This
 *    exercises the embedding, RMSNorm, RoPE, attention, SwiGLU and
 *    cross-entropy backward inside the model; tests/backend/test_kernels checks each
 *    kernel alone.  Variants: GQA, qk_norm, tied embeddings, B > 1, padded
 *    vocabulary, head_dim apart from hidden / heads with every linear's
 *    bias (Llama's attention_bias and mlp_bias), Qwen2's q/k/v biases;
 *    the biases set to nonzero values first, so that their forward is
 *    checked too (they start at 0).  Tolerance: relative error 2e-2 (or absolute 2e-5): fp32
 *    forward, h = 1e-2 / |d|, a loss of about 5.5, so the rounding noise of
 *    the difference quotient is about 1e-5 and its truncation error O(h^2).
 * 2. Activation checkpointing gives bit-identical gradients and loss.
 * 3. Gradient accumulation: two half batches with the global-token scale
 *    equal one full batch (to rounding).
 * 4. Overfit: a small model drives the loss on one fixed text batch below
 *    0.5 nats/token within 150 AdamW steps.
 * 5. Initial weights depend on seed and names only; biases start at 0, are
 *    not decayed and follow their weights in the flat order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt_backend.h"
#include "mt_config.h"
#include "mt_model.h"
#include "mt_optim.h"
#include "mt_rng.h"
#include "mt_test.h"
#include "mt_test_model.h"

static int make_cfg_world(mt_config_t *cfg, const char *extra, int64_t world)
{
    return mt_test_model_cfg(cfg, NULL, extra, MT_APP_ANY, world);
}

static int make_cfg(mt_config_t *cfg, const char *extra) { return make_cfg_world(cfg, extra, 1); }

static double loss_of(mt_model_t *m, const int32_t *tok, const int32_t *tgt)
{
    int64_t c;
    double s = mt_model_step(m, tok, tgt, false, 0, &c);
    return s / (double)c;
}

/* Every bias of m set to a nonzero value (0.2 normal), host memory. */
static void set_biases(mt_model_t *m)
{
    for (int i = 0; i < m->nparams; i++)
        for (int64_t j = 0; m->params[i].is_bias && j < m->params[i].numel; j++)
            m->params[i].data[j] = (float)(0.2 * mt_rng_normal(5, (uint32_t)i, (uint64_t)j));
}

static void grad_check(const char *variant, const char *extra, int64_t B, int64_t T, int64_t world)
{
    mt_config_t cfg;
    if (!make_cfg_world(&cfg, extra, world))
        return;
    mt_model_t m;
    if (mt_model_init(&m, &cfg, mt_backend_cpu(), B, T) != MT_OK) {
        CHECK(0, "%s: init: %s", variant, mt_error_message());
        return;
    }
    mt_model_init_weights(&m, 1234);
    set_biases(&m);
    int64_t N = B * T;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)N), *tgt = malloc(sizeof(int32_t) * (size_t)N);
    mt_test_batch(N, m.V_valid, tok, tgt, 11);
    int64_t count;
    mt_model_zero_grad(&m);
    double sum = mt_model_step(&m, tok, tgt, false, 0, &count);
    mt_model_step(&m, tok, tgt, true, 1.0f / (float)count, &count);
    (void)sum;

    float *d = malloc(sizeof(float) * (size_t)m.numel), *w0 = malloc(sizeof(float) * (size_t)m.numel);
    for (int i = 0; i < m.nparams; i++) {
        mt_param_t *p = &m.params[i];
        double dot = 0, norm = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            d[j] = (float)mt_rng_normal(99, (uint32_t)i, (uint64_t)j);
            /* vocabulary padding rows get no gradient: keep them out */
            if ((p == m.embed || p == m.lm_head) && j >= m.V_valid * m.H)
                d[j] = 0;
            dot += (double)d[j] * (double)p->grad[j];
            norm += (double)d[j] * d[j];
        }
        double h = 1e-2 / sqrt(norm);
        memcpy(w0, p->data, sizeof(float) * (size_t)p->numel);
        for (int64_t j = 0; j < p->numel; j++)
            p->data[j] = w0[j] + (float)(h * d[j]);
        double lp = loss_of(&m, tok, tgt);
        for (int64_t j = 0; j < p->numel; j++)
            p->data[j] = w0[j] - (float)(h * d[j]);
        double lm = loss_of(&m, tok, tgt);
        memcpy(p->data, w0, sizeof(float) * (size_t)p->numel);
        double fd = (lp - lm) / (2 * h);
        double err = fabs(fd - dot), scale = fmax(fabs(fd), fabs(dot));
        CHECK(err <= 2e-2 * scale || err <= 2e-5, "%s: %s: analytic %.6e, finite difference %.6e",
              variant, p->name, dot, fd);
    }
    free(d), free(w0), free(tok), free(tgt);
    mt_model_free(&m);
}

/* Gradients with and without activation checkpointing are bit-identical. */
static void ac_identical(const char *extra)
{
    mt_config_t c1, c2;
    char ex[256];
    snprintf(ex, sizeof ex, "%s%sdistributed.activation_checkpointing=true", extra, extra[0] ? ";" : "");
    if (!make_cfg(&c1, extra) || !make_cfg(&c2, ex))
        return;
    mt_model_t a, b;
    mt_model_init(&a, &c1, mt_backend_cpu(), 2, 8);
    mt_model_init(&b, &c2, mt_backend_cpu(), 2, 8);
    CHECK(!a.checkpointing && b.checkpointing, "AC flag");
    CHECK(b.act_numel < a.act_numel || a.L < 3, "AC stores less (%lld vs %lld)",
          (long long)b.act_numel, (long long)a.act_numel);
    mt_model_init_weights(&a, 5);
    mt_model_init_weights(&b, 5);
    int32_t tok[16], tgt[16];
    mt_test_batch(16, a.V_valid, tok, tgt, 21);
    int64_t ca, cb;
    mt_model_zero_grad(&a);
    mt_model_zero_grad(&b);
    double la = mt_model_step(&a, tok, tgt, true, 1.0f / 15, &ca);
    double lb = mt_model_step(&b, tok, tgt, true, 1.0f / 15, &cb);
    CHECK(la == lb, "AC loss %.17g vs %.17g", la, lb);
    CHECK(memcmp(a.grad_mem, b.grad_mem, sizeof(float) * (size_t)a.numel) == 0,
          "activation checkpointing changed gradients (%s)", extra);
    mt_model_free(&a);
    mt_model_free(&b);
}

static void accumulation(void)
{
    mt_config_t c;
    if (!make_cfg(&c, NULL))
        return;
    mt_model_t full, half;
    mt_model_init(&full, &c, mt_backend_cpu(), 2, 8);
    mt_model_init(&half, &c, mt_backend_cpu(), 1, 8);
    mt_model_init_weights(&full, 3);
    mt_model_init_weights(&half, 3);
    CHECK(memcmp(full.param_mem, half.param_mem, sizeof(float) * (size_t)full.numel) == 0,
          "init independent of batch shape");
    int32_t tok[16], tgt[16];
    mt_test_batch(16, full.V_valid, tok, tgt, 31);
    int64_t c1, c2, c3;
    mt_model_zero_grad(&full);
    mt_model_zero_grad(&half);
    double lf = mt_model_step(&full, tok, tgt, true, 1.0f / 15, &c1);
    double l1 = mt_model_step(&half, tok, tgt, true, 1.0f / 15, &c2);
    double l2 = mt_model_step(&half, tok + 8, tgt + 8, true, 1.0f / 15, &c3);
    CHECK(c1 == 15 && c2 + c3 == 15, "token counts");
    CHECK(fabs(lf - (l1 + l2)) <= 1e-5 * fabs(lf), "loss sum %.9g vs %.9g", lf, l1 + l2);
    double maxd = 0, maxg = 0;
    for (int64_t i = 0; i < full.numel; i++) {
        maxd = fmax(maxd, fabs((double)full.grad_mem[i] - half.grad_mem[i]));
        maxg = fmax(maxg, fabs((double)full.grad_mem[i]));
    }
    CHECK(maxd <= 1e-5 * maxg, "accumulated gradients differ by %.3e (max %.3e)", maxd, maxg);
    mt_model_free(&full);
    mt_model_free(&half);
}

static void overfit(void)
{
    mt_config_t c;
    if (!make_cfg(&c, "model.vocab_size=258;model.hidden_size=64;model.intermediate_size=128;"
                      "model.num_attention_heads=4;model.num_key_value_heads=2;"
                      "model.initializer_range=0.02;optimizer.lr=0.01;optimizer.weight_decay=0.0"))
        return;
    mt_model_t m;
    mt_adamw_t opt;
    const int64_t B = 2, T = 32;
    mt_model_init(&m, &c, mt_backend_cpu(), B, T);
    mt_model_init_weights(&m, 42);
    mt_adamw_init(&opt, m.be, m.numel);
    mt_segment_t all = mt_segment_whole(&m);
    const char *text = "meshtrain trains transformer language models on supercomputers. "
                       "every rank computes the same training run as one process.";
    int32_t tok[64], tgt[64];
    for (int64_t i = 0; i < B * T; i++) {
        tok[i] = (unsigned char)text[i];
        tgt[i] = (unsigned char)text[i + 1];
    }
    double first = 0, last = 0;
    for (int step = 1; step <= 150; step++) {
        int64_t cnt;
        mt_model_zero_grad(&m);
        double s = mt_model_step(&m, tok, tgt, true, 1.0f / (float)(B * T), &cnt);
        double loss = s / (double)cnt;
        if (step == 1)
            first = loss;
        last = loss;
        double coef = mt_clip_coef(sqrt(mt_grad_sumsq(&m, &all, 1)), 1.0);
        if (coef < 1)
            mt_grad_scale(&m, &all, 1, (float)coef);
        mt_adamw_step(&opt, &m, &all, 1, &c.optimizer, 0.01, 1.0f);
    }
    CHECK(first > 5.0 && last < 0.5, "overfit: loss %.4f -> %.4f (expected > 5 -> < 0.5)", first, last);
    printf("overfit: loss %.4f -> %.4f in 150 steps\n", first, last);
    mt_adamw_free(&opt);
    mt_model_free(&m);
}

static void init_depends_on_names(void)
{
    mt_config_t c;
    if (!make_cfg(&c, NULL))
        return;
    mt_model_t m;
    mt_model_init(&m, &c, mt_backend_cpu(), 1, 8);
    mt_model_init_weights(&m, 77);
    mt_param_t *q = mt_model_param(&m, "model.layers.1.self_attn.q_proj.weight");
    mt_param_t *n = mt_model_param(&m, "model.layers.0.input_layernorm.weight");
    CHECK(q && n, "HF names present");
    if (q && n) {
        /* element e of a tensor is std * normal(seed, stream(name), e) */
        float want = (float)(0.2 * mt_rng_normal(77, mt_rng_stream(q->name), 5));
        CHECK(q->data[5] == want, "q_proj[5] = %g, expected %g", q->data[5], want);
        CHECK(n->data[0] == 1.0f && n->no_decay, "norms start at 1 and are not decayed");
    }
    CHECK(mt_model_param(&m, "lm_head.weight") != NULL, "untied lm_head");
    mt_model_free(&m);
    /* Philox4x32-10 known-answer test (Random123 kat vector: zero counter and key). */
    uint32_t ctr[4] = {0, 0, 0, 0}, key[2] = {0, 0}, out[4];
    mt_philox4x32(ctr, key, out);
    CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu &&
              out[3] == 0x9b00dbd8u, "philox zero KAT: %08x %08x %08x %08x", out[0], out[1],
          out[2], out[3]);
}

/* The biases: which exist per architecture, their names, shapes and
 * places (right after their weights), initial zeros, no weight decay, TP
 * layout; and mlp_bias with experts refused by name. */
static void biases(void)
{
    mt_config_t c;
    mt_model_t m;
    if (!make_cfg(&c, "model.head_dim=6;model.attention_bias=true;model.mlp_bias=true"))
        return;
    CHECK(mt_model_init(&m, &c, mt_backend_cpu(), 1, 8) == MT_OK, "%s", mt_error_message());
    mt_model_init_weights(&m, 3);
    static const char *const lin[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                      "mlp.down_proj"};
    const int64_t rows[] = {24, 12, 12, 16, 24, 24, 16};
    int nbias = 0;
    for (int i = 0; i < m.nparams; i++)
        nbias += m.params[i].is_bias;
    CHECK(nbias == 14, "attention_bias + mlp_bias: %d biases in 2 layers, expected 14", nbias);
    for (int k = 0; k < 7; k++) {
        char wn[96], bn[96];
        snprintf(wn, sizeof wn, "model.layers.1.%s.weight", lin[k]);
        snprintf(bn, sizeof bn, "model.layers.1.%s.bias", lin[k]);
        mt_param_t *w = mt_model_param(&m, wn), *b = mt_model_param(&m, bn);
        CHECK(w && b, "%s and %s", wn, bn);
        if (!w || !b)
            continue;
        CHECK(w->shape[0] == rows[k] && b->ndim == 1 && b->shape[0] == rows[k] &&
                  b->offset == w->offset + w->numel && b->no_decay && !b->is_norm,
              "%s: [%lld] at %lld after its weight [%lld, %lld] at %lld, not decayed", bn,
              (long long)b->shape[0], (long long)b->offset, (long long)w->shape[0],
              (long long)w->shape[1], (long long)w->offset);
        float mx = 0;
        for (int64_t j = 0; j < b->numel; j++)
            mx = fmaxf(mx, fabsf(b->data[j]));
        CHECK(mx == 0.0f, "%s starts at 0 (max |b| %g)", bn, mx);
    }
    mt_param_t *o = mt_model_param(&m, "model.layers.0.self_attn.o_proj.weight");
    CHECK(o && o->shape[0] == 16 && o->shape[1] == 24, "o_proj [H, nh * head_dim] = [16, 24]");
    mt_model_free(&m);

    /* tp 2: q's bias split with its rows, o's and down's whole on every rank */
    if (make_cfg_world(&c, "model.attention_bias=true;model.mlp_bias=true;"
                           "distributed.tp_size=2", 2)) {
        CHECK(mt_model_init_ex(&m, &c, mt_backend_cpu(), 1, 8, 0, 1) == MT_OK, "%s",
              mt_error_message());
        mt_param_t *bq = mt_model_param(&m, "model.layers.0.self_attn.q_proj.bias");
        mt_param_t *bo = mt_model_param(&m, "model.layers.0.self_attn.o_proj.bias");
        mt_param_t *bd = mt_model_param(&m, "model.layers.0.mlp.down_proj.bias");
        CHECK(bq && bq->tp_dim == 0 && bq->shape[0] == 8 && bq->tp_off == 8 &&
                  bq->full_shape[0] == 16, "tp rank 1: q_proj.bias rows [8, 16) of 16");
        CHECK(bo && bd && bo->tp_dim == -1 && bd->tp_dim == -1 && bo->shape[0] == 16 &&
                  !bo->tp_partial_grad && !bd->tp_partial_grad,
              "row-parallel biases whole, their gradients whole on every TP rank");
        mt_model_free(&m);
    }
    /* Qwen2: q, k, v biases only */
    if (make_cfg(&c, "model.architecture=Qwen2ForCausalLM")) {
        CHECK(mt_model_init(&m, &c, mt_backend_cpu(), 1, 8) == MT_OK, "%s", mt_error_message());
        CHECK(mt_model_param(&m, "model.layers.0.self_attn.v_proj.bias") &&
                  !mt_model_param(&m, "model.layers.0.self_attn.o_proj.bias") &&
                  !mt_model_param(&m, "model.layers.0.mlp.up_proj.bias") && m.nparams == 3 + 2 * 12,
              "Qwen2: q/k/v biases alone (%d parameters)", m.nparams);
        mt_model_free(&m);
    }
    /* plain Llama: none */
    if (make_cfg(&c, NULL)) {
        CHECK(mt_model_init(&m, &c, mt_backend_cpu(), 1, 8) == MT_OK, "%s", mt_error_message());
        CHECK(m.nparams == 3 + 2 * 9 && m.ones == NULL, "Llama: no biases (%d parameters)",
              m.nparams);
        mt_model_free(&m);
    }
    /* experts have no biases: mlp_bias with them is refused by name */
    if (mt_test_model_cfg(&c, NULL, "model.num_experts=4;model.num_experts_per_tok=2;"
                          "model.moe_intermediate_size=8;model.mlp_bias=true", MT_APP_ANY, 1)) {
        mt_status_t st = mt_model_init(&m, &c, mt_backend_cpu(), 1, 8);
        CHECK(st != MT_OK && strstr(mt_error_message(), "model.mlp_bias"),
              "mlp_bias with experts refused by name: %s", mt_error_message());
        if (st == MT_OK)
            mt_model_free(&m);
    }
}

/* A packed row of two documents computes what the two documents compute
 * alone: the loss sum and every gradient (block-diagonal causal mask and
 * positions restarting at the second document). */
static void packing(const char *extra)
{
    mt_config_t c;
    if (!make_cfg(&c, extra))
        return;
    const int64_t a = 5, b = 7, T = a + b;
    mt_model_t row, one, two;
    mt_model_init(&row, &c, mt_backend_cpu(), 1, T);
    mt_model_init(&one, &c, mt_backend_cpu(), 1, a);
    mt_model_init(&two, &c, mt_backend_cpu(), 1, b);
    mt_model_init_weights(&row, 9);
    mt_model_init_weights(&one, 9);
    mt_model_init_weights(&two, 9);
    int32_t tok[12], tgt[12], pos[12], doc[12];
    mt_test_batch(T, row.V_valid, tok, tgt, 33);
    tgt[a - 1] = tgt[T - 1] = -100; /* each document's last token */
    for (int64_t i = 0; i < T; i++)
        pos[i] = (int32_t)(i < a ? i : i - a), doc[i] = (int32_t)(i < a ? 0 : a);
    int64_t cr, c1, c2;
    mt_model_zero_grad(&row), mt_model_zero_grad(&one), mt_model_zero_grad(&two);
    mt_model_set_packing(&row, pos, doc);
    double lr = mt_model_step(&row, tok, tgt, true, 0.1f, &cr);
    double l1 = mt_model_step(&one, tok, tgt, true, 0.1f, &c1);
    double l2 = mt_model_step(&two, tok + a, tgt + a, true, 0.1f, &c2);
    CHECK(cr == c1 + c2, "packed counts %lld = %lld + %lld", (long long)cr,
          (long long)c1, (long long)c2);
    CHECK(fabs(lr - (l1 + l2)) <= 1e-5 * fabs(lr), "packed loss %.9g vs %.9g + %.9g (%s)", lr,
          l1, l2, extra ? extra : "");
    double maxd = 0, maxg = 0;
    for (int64_t i = 0; i < row.numel; i++) {
        double g = (double)one.grad_mem[i] + (double)two.grad_mem[i];
        maxd = fmax(maxd, fabs((double)row.grad_mem[i] - g));
        maxg = fmax(maxg, fabs(g));
    }
    CHECK(maxd <= 1e-5 * maxg, "packed gradients differ by %.3g (max %.3g) (%s)", maxd, maxg,
          extra ? extra : "");
    /* and back to plain rows: the second document now sees the first */
    mt_model_set_packing(&row, NULL, NULL);
    double lp = mt_model_step(&row, tok, tgt, false, 0, &cr);
    CHECK(fabs(lp - lr) > 1e-4 * fabs(lr), "unpacked row should differ (%.9g vs %.9g)", lp, lr);
    mt_model_free(&row), mt_model_free(&one), mt_model_free(&two);
}

int main(void)
{
    packing(NULL);
    packing("model.qk_norm=true;distributed.activation_checkpointing=true");
    grad_check("gqa", NULL, 2, 8, 1);
    grad_check("mha, qk_norm", "model.num_key_value_heads=4;model.qk_norm=true", 1, 8, 1);
    grad_check("tied, mqa", "model.tie_word_embeddings=true;model.num_key_value_heads=1", 2, 6, 1);
    /* validated for tp 2, so the vocabulary of 37 is padded to 38 */
    grad_check("padded vocab", "distributed.tp_size=2", 1, 8, 2);
    /* q 4 heads x 6 = 24 wide against hidden 16 */
    grad_check("head_dim 6, attention_bias, mlp_bias",
               "model.head_dim=6;model.attention_bias=true;model.mlp_bias=true", 2, 8, 1);
    grad_check("qwen2 biases", "model.architecture=Qwen2ForCausalLM", 1, 8, 1);
    grad_check("qk_norm after q/k biases, head_dim 6",
               "model.qk_norm=true;model.attention_bias=true;model.head_dim=6", 1, 8, 1);
    biases();
    ac_identical("");
    ac_identical("model.qk_norm=true;model.num_hidden_layers=3");
    ac_identical("model.head_dim=6;model.attention_bias=true;model.mlp_bias=true");
    accumulation();
    overfit();
    init_depends_on_names();
    return mt_test_exit("test_model");
}
