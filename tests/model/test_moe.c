/* test_moe: the mixture-of-experts block (model_moe.c, kernels_cpu_moe.c).
 *
 * 1. Router ties go to the lowest expert index; top-k order and weights.
 * 2. The load-balancing loss of a uniform router is exactly K (E * sum_e
 *    (C_e / R) (1 / E) with sum_e C_e = K R); a capacity factor of 1
 *    drops what it should there, and a large one changes nothing.
 * 3. Gradient check of the whole model with MoE layers against central
 *    finite differences of the objective CE-mean + s * aux, along a random
 *    direction per tensor: router (mlp.gate), every expert's gate/up/down,
 *    and the rest; with and without norm_topk_prob, with a dense layer
 *    (mlp_only_layers), with shared experts, with a capacity factor that
 *    drops tokens, with attention biases and head_dim apart from hidden /
 *    heads, and the aux loss alone (CE scale 0).  The
 *    perturbation is small enough that no token changes experts (checked:
 *    a route change makes the objective non-smooth).  Tolerance: relative
 *    1e-2 or absolute 1e-5 (fp32 forward; h = 1e-2 / |d|, smaller
 *    if a token changes experts).
 * 4. Activation checkpointing gives bit-identical MoE gradients, also
 *    with moe.ignore_router_for_ac (the recompute reuses the routing).
 * 5. Parameter names follow Hugging Face Qwen3-MoE. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_moe.h"
#include "mt_backend.h"
#include "mt_config.h"
#include "mt_model.h"
#include "mt_rng.h"
#include "mt_test.h"
#include "mt_test_model.h"

static int make_cfg(mt_config_t *cfg, const char *extra)
{
    return mt_test_model_cfg(cfg, "model.num_experts=4;model.num_experts_per_tok=2;"
                             "model.moe_intermediate_size=8;model.norm_topk_prob=true",
                             extra, MT_APP_MOE, 1);
}

static void router_ties(void)
{
    const mt_backend_t *be = mt_backend_cpu();
    /* 4 tokens, 4 experts, top 2 */
    float p[16] = {0, 0, 0, 0,  1, 2, 2, 1,  3, 1, 3, 3,  0, 5, 1, 5};
    int32_t idx[8];
    float w[8];
    be->moe_router_forward(p, idx, w, NULL, 4, 4, 2, true);
    int want[8] = {0, 1, 1, 2, 0, 2, 1, 3};
    for (int i = 0; i < 8; i++)
        CHECK(idx[i] == want[i], "tie-break: slot %d got expert %d, want %d", i, idx[i], want[i]);
    CHECK(fabsf(w[0] - 0.5f) < 1e-7f && fabsf(w[1] - 0.5f) < 1e-7f, "renormalised ties %g %g",
          w[0], w[1]);
    CHECK(fabsf(p[0] - 0.25f) < 1e-7f, "softmax of equal logits %g", p[0]);
    float q[4] = {1, 2, 3, 4};
    be->moe_router_forward(q, idx, w, NULL, 1, 4, 2, false);
    CHECK(idx[0] == 3 && idx[1] == 2, "descending order %d %d", idx[0], idx[1]);
    CHECK(fabsf(w[0] - q[3]) == 0 && fabsf(w[1] - q[2]) == 0, "raw weights without norm_topk");
    /* a bias changes the choice, not the weights; ties on p + bias to the lowest index */
    float r[4] = {1, 2, 3, 4}, pr[4], bias[4] = {0.5f, 0, 0, -0.5f};
    be->moe_router_forward(r, idx, w, bias, 1, 4, 2, false);
    memcpy(pr, r, sizeof pr);
    /* p = (0.032, 0.087, 0.237, 0.644) + bias = (0.532, 0.087, 0.237, 0.144) */
    CHECK(idx[0] == 0 && idx[1] == 2 && w[0] == pr[0] && w[1] == pr[2],
          "bias: choices %d %d (w %g)", idx[0], idx[1], w[0]);
    float u[4] = {0, 0, 0, 0}, tie[4] = {0, 0.1f, 0.1f, 0};
    be->moe_router_forward(u, idx, w, tie, 1, 4, 2, false);
    CHECK(idx[0] == 1 && idx[1] == 2 && w[0] == 0.25f, "bias ties: %d %d", idx[0], idx[1]);

    /* the probability sums: each column's rows added in order onto its
     * running total, in double (the p of the first call: rows 0.25 x 4,
     * then softmaxes of the rest) */
    double sums[4] = {0.1, 0.2, 0.3, 0.4}, want_s[4] = {0.1, 0.2, 0.3, 0.4};
    for (int t = 0; t < 4; t++)
        for (int e = 0; e < 4; e++)
            want_s[e] += (double)p[t * 4 + e];
    be->moe_prob_sums(sums, p, 4, 4);
    for (int e = 0; e < 4; e++)
        CHECK(sums[e] == want_s[e], "moe_prob_sums[%d] %.17g, want %.17g", e, sums[e], want_s[e]);
    double total = sums[0] + sums[1] + sums[2] + sums[3];
    CHECK(fabs(total - 5.0) < 1e-6, "probability sums of 4 rows onto 1 add to %.9g, not 5", total);
}

static double objective(mt_model_t *m, const int32_t *tok, const int32_t *tgt, double ce_w,
                        double aux_w)
{
    int64_t c;
    double s = mt_model_step(m, tok, tgt, false, 0, &c);
    return ce_w * s / (double)c + aux_w * m->moe->aux;
}

/* Tokens per expert in every layer after the last forward: a route
 * change shows up here (a swap of two tokens would not, but is rare). */
static void counts_of(mt_model_t *m, int64_t *out)
{
    memcpy(out, m->moe->counts, sizeof(int64_t) * (size_t)(m->L * m->moe->E));
}

static int check_tensor(const char *variant, mt_model_t *m, mt_param_t *p, uint32_t stream,
                        const int32_t *tok, const int32_t *tgt, double ce_w, double aux_w)
{
    int64_t nc = m->L * m->moe->E;
    int64_t *c0 = malloc(sizeof(int64_t) * (size_t)nc), *c1 = malloc(sizeof(int64_t) * (size_t)nc);
    float *d = malloc(sizeof(float) * (size_t)p->numel), *w0 = malloc(sizeof(float) * (size_t)p->numel);
    double dot = 0, norm = 0;
    for (int64_t j = 0; j < p->numel; j++) {
        d[j] = (float)mt_rng_normal(99, stream, (uint64_t)j);
        if ((p == m->embed || p == m->lm_head) && j >= m->V_valid * m->H)
            d[j] = 0;
        dot += (double)d[j] * (double)p->grad[j];
        norm += (double)d[j] * d[j];
    }
    objective(m, tok, tgt, ce_w, aux_w);
    counts_of(m, c0);
    memcpy(w0, p->data, sizeof(float) * (size_t)p->numel);
    /* the largest step (least rounding noise) that keeps every route */
    double fd = 0;
    int same = 0;
    for (double step = 1e-2; step >= 1e-3 && !same; step /= 3) {
        double h = step / sqrt(norm);
        fd = 0, same = 1;
        for (int sign = 1; sign >= -1; sign -= 2) {
            for (int64_t j = 0; j < p->numel; j++)
                p->data[j] = w0[j] + (float)(sign * h * d[j]);
            fd += sign * objective(m, tok, tgt, ce_w, aux_w);
            counts_of(m, c1);
            same &= memcmp(c0, c1, sizeof(int64_t) * (size_t)nc) == 0;
        }
        fd /= 2 * h;
    }
    memcpy(p->data, w0, sizeof(float) * (size_t)p->numel);
    double err = fabs(fd - dot), scale = fmax(fabs(fd), fabs(dot));
    /* 1e-4 absolute: the central difference of a float32 objective (a
     * loss near 5) carries a few 1e-5 of rounding noise at these steps,
     * and which OpenBLAS kernel runs (SkylakeX, Haswell) moves it; a
     * directional derivative below 1e-2 is checked to that floor */
    if (same)
        CHECK(err <= 1e-2 * scale || err <= 1e-4, "%s: %s: analytic %.6e, finite difference %.6e",
              variant, p->name, dot, fd);
    free(c0), free(c1), free(d), free(w0);
    return same;
}

static void grad_check(const char *variant, const char *extra, double ce_w, double aux_w)
{
    mt_config_t cfg;
    if (!make_cfg(&cfg, extra))
        return;
    mt_model_t m;
    if (mt_model_init(&m, &cfg, mt_backend_cpu(), 2, 8) != MT_OK) {
        CHECK(0, "%s: init: %s", variant, mt_error_message());
        return;
    }
    mt_model_init_weights(&m, 1234);
    int32_t tok[16], tgt[16];
    mt_test_batch(16, m.V_valid, tok, tgt, 11);
    int64_t count;
    mt_model_step(&m, tok, tgt, false, 0, &count);
    mt_model_zero_grad(&m);
    m.moe->aux_scale = (float)aux_w;
    mt_model_step(&m, tok, tgt, true, (float)(ce_w / (double)count), &count);
    int checked = 0, skipped = 0, router = 0, experts = 0;
    for (int i = 0; i < m.nparams; i++) {
        int ok = check_tensor(variant, &m, &m.params[i], (uint32_t)i, tok, tgt, ce_w, aux_w);
        checked += ok, skipped += !ok;
        router += ok && strstr(m.params[i].name, "mlp.gate.weight") != NULL;
    }
    for (int i = 0; i < m.moe->nxp; i++) {
        int ok = check_tensor(variant, &m, &m.moe->xp[i], (uint32_t)(1000 + i), tok, tgt, ce_w,
                              aux_w);
        checked += ok, skipped += !ok, experts += ok;
    }
    CHECK(router >= 1 && experts >= 3 * m.moe->El && skipped <= 2,
          "%s: %d tensors checked (%d routers, %d experts), %d skipped for a route change",
          variant, checked, router, experts, skipped);
    printf("%s: %d tensors checked, %d skipped (route change)\n", variant, checked, skipped);
    mt_model_free(&m);
}

static void aux_uniform(void)
{
    mt_config_t cfg;
    if (!make_cfg(&cfg, NULL))
        return;
    mt_model_t m;
    mt_model_init(&m, &cfg, mt_backend_cpu(), 2, 8);
    mt_model_init_weights(&m, 3);
    for (int l = 0; l < m.L; l++)
        memset(m.layers[l].router->data, 0, sizeof(float) * (size_t)m.layers[l].router->numel);
    int32_t tok[16], tgt[16];
    mt_test_batch(16, m.V_valid, tok, tgt, 5);
    int64_t c;
    mt_model_step(&m, tok, tgt, false, 0, &c);
    CHECK(fabs(m.moe->aux - 2.0) < 1e-12, "uniform router: aux %.17g, want K = 2", m.moe->aux);
    /* ties everywhere: experts 0 and 1 get every token */
    CHECK(m.moe->counts[0] == 16 && m.moe->counts[1] == 16 && m.moe->counts[2] == 0 &&
              m.moe->counts[3] == 0, "uniform router counts %lld %lld %lld %lld",
          (long long)m.moe->counts[0], (long long)m.moe->counts[1], (long long)m.moe->counts[2],
          (long long)m.moe->counts[3]);
    mt_model_free(&m);

    /* capacity factor 1: cap = ceil(16 x 2 / 4) = 8 of the 16 rows that
     * experts 0 and 1 each get; a large factor changes nothing */
    mt_config_t c1, c2;
    if (!make_cfg(&c1, "model.moe_capacity_factor=1.0") ||
        !make_cfg(&c2, "model.moe_capacity_factor=10.0"))
        return;
    mt_model_t a, b, d;
    mt_model_init(&a, &c1, mt_backend_cpu(), 2, 8);
    mt_model_init(&b, &c2, mt_backend_cpu(), 2, 8);
    mt_model_init(&d, &cfg, mt_backend_cpu(), 2, 8);
    mt_model_init_weights(&a, 3);
    mt_model_init_weights(&b, 3);
    mt_model_init_weights(&d, 3);
    for (int l = 0; l < a.L; l++)
        memset(a.layers[l].router->data, 0, sizeof(float) * (size_t)a.layers[l].router->numel);
    mt_model_step(&a, tok, tgt, false, 0, &c);
    CHECK(a.moe->cap == 8 && a.moe->dropped[0] == 16 && a.moe->dropped[1] == 16,
          "capacity 1.0: cap %lld, dropped %lld %lld", (long long)a.moe->cap,
          (long long)a.moe->dropped[0], (long long)a.moe->dropped[1]);
    double lb = mt_model_step(&b, tok, tgt, false, 0, &c);
    double ld = mt_model_step(&d, tok, tgt, false, 0, &c);
    CHECK(lb == ld && b.moe->dropped[0] == 0 && b.moe->dropped[1] == 0,
          "capacity 10 is dropless: %.17g vs %.17g", lb, ld);
    mt_model_free(&a);
    mt_model_free(&b);
    mt_model_free(&d);
}

static void ac_identical(void)
{
    mt_config_t c1, c2;
    if (!make_cfg(&c1, NULL) || !make_cfg(&c2, "distributed.activation_checkpointing=true"))
        return;
    mt_model_t a, b;
    mt_model_init(&a, &c1, mt_backend_cpu(), 2, 8);
    mt_model_init(&b, &c2, mt_backend_cpu(), 2, 8);
    mt_model_init_weights(&a, 5);
    mt_model_init_weights(&b, 5);
    a.moe->aux_scale = b.moe->aux_scale = 0.01f;
    int32_t tok[16], tgt[16];
    mt_test_batch(16, a.V_valid, tok, tgt, 21);
    int64_t ca, cb;
    mt_model_zero_grad(&a);
    mt_model_zero_grad(&b);
    double la = mt_model_step(&a, tok, tgt, true, 1.0f / 15, &ca);
    double lb = mt_model_step(&b, tok, tgt, true, 1.0f / 15, &cb);
    CHECK(la == lb && a.moe->aux == b.moe->aux, "AC loss %.17g vs %.17g", la, lb);
    CHECK(memcmp(a.grad_mem, b.grad_mem, sizeof(float) * (size_t)a.numel) == 0,
          "activation checkpointing changed the gradients");
    CHECK(memcmp(a.moe->grad_mem, b.moe->grad_mem, sizeof(float) * (size_t)a.moe->numel) == 0,
          "activation checkpointing changed the expert gradients");
    /* ignore_router_for_ac: the recompute reuses the kept routing; the
     * same numbers */
    mt_config_t c3;
    if (!make_cfg(&c3, "distributed.activation_checkpointing=true;"
                       "distributed.ep_size=1;distributed.moe.ignore_router_for_ac=true"))
        return;
    mt_model_t k;
    mt_model_init(&k, &c3, mt_backend_cpu(), 2, 8);
    CHECK(k.moe->keep_router, "each layer keeps its router outputs");
    mt_model_init_weights(&k, 5);
    k.moe->aux_scale = 0.01f;
    int64_t ck;
    mt_model_zero_grad(&k);
    double lk = mt_model_step(&k, tok, tgt, true, 1.0f / 15, &ck);
    CHECK(lk == la && k.moe->aux == a.moe->aux, "kept router: loss %.17g vs %.17g", lk, la);
    CHECK(memcmp(a.grad_mem, k.grad_mem, sizeof(float) * (size_t)a.numel) == 0 &&
              memcmp(a.moe->grad_mem, k.moe->grad_mem, sizeof(float) * (size_t)a.moe->numel) == 0,
          "ignore_router_for_ac changed the gradients");
    mt_model_free(&k);
    mt_model_free(&a);
    mt_model_free(&b);
}

static void names(void)
{
    mt_config_t cfg;
    if (!make_cfg(&cfg, "model.mlp_only_layers=0"))
        return;
    mt_model_t m;
    mt_model_init(&m, &cfg, mt_backend_cpu(), 1, 8);
    CHECK(mt_model_param(&m, "model.layers.0.mlp.gate_proj.weight") != NULL, "layer 0 dense");
    CHECK(mt_model_param(&m, "model.layers.0.mlp.gate.weight") == NULL, "layer 0 has no router");
    mt_param_t *r = mt_model_param(&m, "model.layers.1.mlp.gate.weight");
    CHECK(r && r->shape[0] == 4 && r->shape[1] == 16, "router [E, H]");
    CHECK(m.moe->nxp == 12 && m.moe->nmoe == 1, "%d expert tensors", m.moe->nxp);
    CHECK(strcmp(m.moe->xp[11].name, "model.layers.1.mlp.experts.3.down_proj.weight") == 0 &&
              m.moe->xp[11].shape[0] == 16 && m.moe->xp[11].shape[1] == 8,
          "expert name %s", m.moe->xp[11].name);
    mt_model_free(&m);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    router_ties();
    aux_uniform();
    names();
    grad_check("norm_topk, CE + aux", NULL, 1.0, 0.1);
    grad_check("no norm_topk, CE + aux", "model.norm_topk_prob=false", 1.0, 0.1);
    grad_check("aux alone", NULL, 0.0, 1.0);
    grad_check("dense layer 0, top 1 of 4", "model.mlp_only_layers=0;model.num_experts_per_tok=1",
               1.0, 0.1);
    grad_check("2 shared experts", "model.num_shared_experts=2", 1.0, 0.1);
    grad_check("capacity factor 0.75 (drops)", "model.moe_capacity_factor=0.75", 1.0, 0.1);
    /* attention is the dense model's, biases and any head_dim included */
    grad_check("attention biases, head_dim 6", "model.attention_bias=true;model.head_dim=6", 1.0,
               0.1);
    ac_identical();
    int rc = mt_test_exit("test_moe");
    MPI_Finalize();
    return rc;
}
