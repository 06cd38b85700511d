/* test_device_discipline: the single-rank model (model.c, model_arena.c,
 * model_moe.c) touches backend memory only through the backend, as a GPU
 * run needs (doc/gpu.md, "Wiring the model onto the device").
 *
 * 1. The guard itself (mt_backend_cpu_guarded): a host read of its memory
 *    outside a backend call kills a forked child with MT_CPU_GUARD_EXIT,
 *    also a read of a model's parameter arena, and in strict mode a host
 *    array handed to a kernel; copies through the backend work, zero-byte
 *    allocations too.
 * 2. The same model on the guarded backend and on the plain CPU backend,
 *    from one config and seed: a training micro-step, an AdamW update (of
 *    the experts too), two accumulated micro-steps and an eval forward
 *    give bit-identical losses, aux losses and routing counts, and
 *    bit-identical parameters, gradients (and balancing biases), copied
 *    out with copy_to_host.  The guard is strict throughout (every tensor a
 *    kernel gets is backend memory: the caller's tokens, targets and
 *    packing arrays are copied in), except for the optimizer, whose state
 *    is host memory (optim.c is not wired yet).  Variants: dense; qk_norm with activation
 *    checkpointing and packed rows; tied embeddings; MoE with a shared
 *    expert and qk_norm, with activation checkpointing off, on, and on
 *    keeping the router; a dense layer with a capacity limit that drops
 *    rows and aux-loss-free bias updates; and the pipeline passes (two
 *    chunks in two slots, split backward) of a dense and a MoE model.
 * Any host access the guard catches ends the program (a non-zero exit)
 * with the faulting address, the allocation and a backtrace. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model_moe.h"
#include "mt_backend.h"
#include "mt_config.h"
#include "mt_model.h"
#include "mt_optim.h"
#include "mt_rng.h"
#include "mt_test.h"
#include "mt_test_model.h"

enum { B = 2, T = 8, N = B * T };

static int make_cfg(mt_config_t *cfg, const char *extra)
{
    return mt_test_model_cfg(cfg, "optimizer.lr=0.01", extra, MT_APP_ANY, 1);
}

/* ------------------------------------------------------------------ the guard */

/* Run fn in a child; true when the guard stopped it. */
static bool guard_kills(void (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        _exit(0); /* not caught */
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return false;
    return WIFEXITED(st) && WEXITSTATUS(st) == MT_CPU_GUARD_EXIT;
}

static void read_raw(void)
{
    const mt_backend_t *be = mt_backend_cpu_guarded();
    volatile float *p = be->device_alloc(64 * sizeof(float));
    float f = p[3];
    printf("read %g: not caught\n", (double)f);
}

static void read_param(void)
{
    mt_config_t cfg;
    mt_model_t m;
    if (!make_cfg(&cfg, NULL) || mt_model_init(&m, &cfg, mt_backend_cpu_guarded(), B, T) != MT_OK)
        _exit(2);
    mt_model_init_weights(&m, 1);
    volatile float *w = m.param_mem;
    printf("read %g: not caught\n", (double)w[0]);
}

static void host_tensor(void)
{
    const mt_backend_t *be = mt_backend_cpu_guarded();
    float x[4] = {1, 2, 3, 4};
    mt_cpu_guard_strict(true);
    be->scale(x, 2.0f, 4);
    printf("scaled a host array: not caught\n");
}

static void guard_itself(void)
{
    const mt_backend_t *be = mt_backend_cpu_guarded();
    float in[5] = {1, 2, 3, 4, 5}, out[5] = {0};
    float *d = be->device_alloc(sizeof in);
    CHECK(d != NULL, "device_alloc");
    be->copy_to_host(out, d, sizeof out);
    CHECK(out[0] == 0 && out[4] == 0, "device_alloc zeroes");
    be->copy_to_device(d, in, sizeof in);
    be->scale(d, 2.0f, 5); /* a kernel on backend memory */
    be->copy_to_host(out, d, sizeof out);
    CHECK(out[0] == 2 && out[4] == 10, "through the backend: %g %g", out[0], out[4]);
    void *z = be->device_alloc(0);
    CHECK(z != NULL, "zero bytes");
    be->device_free(z);
    be->device_free(d);
    be->device_free(NULL);
    float x[2] = {1, 2};
    be->scale(x, 2.0f, 2); /* a host array is legal when not strict */
    CHECK(x[0] == 2 && x[1] == 4, "a kernel on host memory");
    printf("three deliberate host accesses follow; the guard's reports of them are expected:\n");
    CHECK(guard_kills(read_raw), "a host read of guarded memory was not caught");
    CHECK(guard_kills(read_param), "a host read of the parameter arena was not caught");
    CHECK(guard_kills(host_tensor), "strict: a host array given to a kernel was not caught");
}

/* ------------------------------------------------------------------ guarded vs plain */

/* The same bytes in two models' backend memory (n floats). */
static void same_floats(const char *variant, const char *what, const mt_model_t *a,
                        const float *da, const mt_model_t *b, const float *db, int64_t n)
{
    if (n == 0 || (!da && !db))
        return;
    float *ha = malloc(sizeof(float) * (size_t)n), *hb = malloc(sizeof(float) * (size_t)n);
    a->be->copy_to_host(ha, da, sizeof(float) * (size_t)n);
    b->be->copy_to_host(hb, db, sizeof(float) * (size_t)n);
    int64_t i = 0;
    while (i < n && memcmp(ha + i, hb + i, sizeof(float)) == 0)
        i++;
    CHECK(i == n, "%s: %s differ first at element %lld of %lld: %.9g vs %.9g", variant, what,
          (long long)i, (long long)n, (double)ha[i < n ? i : 0], (double)hb[i < n ? i : 0]);
    free(ha), free(hb);
}

static void same_state(const char *variant, const char *when, const mt_model_t *g,
                       const mt_model_t *p)
{
    char what[128];
    snprintf(what, sizeof what, "parameters %s", when);
    same_floats(variant, what, g, g->param_mem, p, p->param_mem, g->numel);
    snprintf(what, sizeof what, "gradients %s", when);
    same_floats(variant, what, g, g->grad_mem, p, p->grad_mem, g->numel);
    if (!g->moe)
        return;
    const mt_moe_t *x = g->moe, *y = p->moe;
    snprintf(what, sizeof what, "expert parameters %s", when);
    same_floats(variant, what, g, x->param_mem, p, y->param_mem, x->numel);
    snprintf(what, sizeof what, "expert gradients %s", when);
    same_floats(variant, what, g, x->grad_mem, p, y->grad_mem, x->numel);
    snprintf(what, sizeof what, "balancing biases %s", when);
    same_floats(variant, what, g, x->bias, p, y->bias, x->bias ? g->L * x->E : 0);
    CHECK(x->aux == y->aux, "%s: aux %s %.17g vs %.17g", variant, when, x->aux, y->aux);
    CHECK(memcmp(x->counts, y->counts, sizeof(int64_t) * (size_t)(g->L * x->E)) == 0 &&
              memcmp(x->dropped, y->dropped, sizeof(int64_t) * (size_t)g->L) == 0,
          "%s: routing counts %s", variant, when);
}

/* One AdamW update of the layers and the experts. */
static void update(mt_model_t *m, const mt_config_t *cfg, mt_adamw_t opt[2])
{
    mt_cpu_guard_strict(false); /* the AdamW state is host memory */
    mt_segment_t s = mt_segment_whole(m);
    mt_adamw_step(&opt[0], m, &s, 1, &cfg->optimizer, cfg->optimizer.lr, 1.0f);
    if (m->moe) {
        int64_t *unit_lo = malloc(sizeof(int64_t) * (size_t)(m->L + 3));
        mt_model_t v = mt_moe_param_view(m, unit_lo);
        mt_segment_t e = mt_segment_whole(&v);
        mt_adamw_step(&opt[1], &v, &e, 1, &cfg->optimizer, cfg->optimizer.lr, 1.0f);
        free(unit_lo);
    }
    mt_cpu_guard_strict(true);
}

/* A micro-step: the whole model, or (pipe) its two chunks in two slots
 * with a split backward, handing activations and gradients over as the
 * pipeline does on one rank (pp_exec.c). */
static double micro_step(mt_model_t *m, bool pipe, const int32_t *tok, const int32_t *tgt,
                         bool backward, float scale, int64_t *count)
{
    if (!pipe)
        return mt_model_step(m, tok, tgt, backward, scale, count);
    size_t act = sizeof(float) * (size_t)(m->Ns * m->H), nr = sizeof(double) * (size_t)m->nroute;
    mt_model_use_slot(m, 0, 0);
    mt_model_forward_chunk(m, 0, tok, tgt, backward, scale, count);
    float *out = m->x_final;
    const double *route = m->route;
    mt_model_use_slot(m, 1, 1);
    m->be->copy(mt_model_stage_input(m, 1), out, act);
    if (nr)
        memcpy(m->route, route, nr);
    double loss = mt_model_forward_chunk(m, 1, tok, tgt, backward, scale, count);
    if (!backward)
        return loss;
    mt_model_backward_chunk(m, 1, tok, true);
    float *g = m->dres;
    route = m->route;
    mt_model_use_slot(m, 0, 0);
    m->be->copy(m->dres, g, act);
    if (nr)
        memcpy(m->route, route, nr);
    mt_model_backward_chunk(m, 0, tok, true);
    mt_model_use_slot(m, 1, 1);
    mt_model_weight_chunk(m, 1);
    mt_model_use_slot(m, 0, 0);
    mt_model_weight_chunk(m, 0);
    return loss;
}

static void compare(const char *variant, const char *extra, bool packed, bool pipe)
{
    mt_config_t cfg;
    if (!make_cfg(&cfg, extra))
        return;
    static const int lo[2] = {0, 1}, hi[2] = {1, 2};
    mt_model_part_t part = {2, lo, hi, true, true, 2, true};
    mt_cpu_guard_strict(true);
    mt_model_t g, p; /* guarded, plain */
    mt_status_t sg = mt_model_init_ep(&g, &cfg, mt_backend_cpu_guarded(), B, T, 0, -1, -1,
                                      pipe ? &part : NULL);
    mt_status_t sp = mt_model_init_ep(&p, &cfg, mt_backend_cpu(), B, T, 0, -1, -1,
                                      pipe ? &part : NULL);
    CHECK(sg == MT_OK && sp == MT_OK, "%s: init: %s", variant, mt_error_message());
    if (sg != MT_OK || sp != MT_OK)
        return;
    mt_model_t *both[2] = {&g, &p};
    mt_adamw_t opt[2][2];
    double loss[2][4];
    int64_t count[2][4];
    int32_t tok[N], tgt[N], pos[N], doc[N];
    for (int i = 0; i < N; i++) /* rows of two documents, 3 and 5 tokens */
        pos[i] = i % T < 3 ? i % T : i % T - 3, doc[i] = i % T < 3 ? 0 : 3;
    for (int k = 0; k < 2; k++) { /* the same calls on both, in lockstep */
        mt_model_t *m = both[k];
        mt_model_init_weights(m, 77);
        mt_adamw_init(&opt[k][0], m->be, m->numel);
        mt_adamw_init(&opt[k][1], m->be, m->moe ? m->moe->numel : 0);
        if (m->moe)
            m->moe->aux_scale = 0.01f;
        if (packed)
            mt_model_set_packing(m, pos, doc);
        mt_model_zero_grad(m);
        mt_test_batch(N, m->V_valid, tok, tgt, 11);
        loss[k][0] = micro_step(m, pipe, tok, tgt, true, 1.0f / 15, &count[k][0]);
    }
    same_state(variant, "after a micro-step", &g, &p);
    for (int k = 0; k < 2; k++) {
        mt_model_t *m = both[k];
        update(m, &cfg, opt[k]);
        if (m->moe && m->moe->bias)
            mt_moe_update_bias(m, m->moe->load, 0.001);
        mt_model_zero_grad(m);
        for (int s = 1; s < 3; s++) { /* two accumulated micro-steps */
            mt_test_batch(N, m->V_valid, tok, tgt, 11 + 2 * (uint32_t)s);
            loss[k][s] = micro_step(m, pipe, tok, tgt, true, 1.0f / 30, &count[k][s]);
        }
    }
    same_state(variant, "after an update and two micro-steps", &g, &p);
    for (int k = 0; k < 2; k++) {
        mt_test_batch(N, both[k]->V_valid, tok, tgt, 41);
        loss[k][3] = micro_step(both[k], pipe, tok, tgt, false, 0.0f, &count[k][3]); /* eval */
    }
    for (int s = 0; s < 4; s++)
        CHECK(loss[0][s] == loss[1][s] && count[0][s] == count[1][s],
              "%s: loss %d: guarded %.17g (%lld) vs plain %.17g (%lld)", variant, s, loss[0][s],
              (long long)count[0][s], loss[1][s], (long long)count[1][s]);
    same_state(variant, "after an eval forward", &g, &p);
    printf("%s: losses %.9g %.9g %.9g, eval %.9g: guarded == plain\n", variant, loss[0][0],
           loss[0][1], loss[0][2], loss[0][3]);
    for (int k = 0; k < 2; k++) {
        mt_adamw_free(&opt[k][0]), mt_adamw_free(&opt[k][1]);
        mt_model_free(both[k]);
    }
    mt_cpu_guard_strict(false);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* a caught access _exits: keep what passed */
    guard_itself();
    compare("dense", NULL, false, false);
    compare("dense, qk_norm, AC, packed", "model.qk_norm=true;"
            "distributed.activation_checkpointing=true", true, false);
    compare("dense, tied", "model.tie_word_embeddings=true", false, false);
    const char *moe = "model.num_experts=4;model.num_experts_per_tok=2;"
                      "model.moe_intermediate_size=8;model.norm_topk_prob=true;"
                      "model.num_shared_experts=1;model.qk_norm=true";
    char buf[512];
    compare("moe, shared expert, qk_norm", moe, false, false);
    snprintf(buf, sizeof buf, "%s;distributed.activation_checkpointing=true", moe);
    compare("moe, AC", buf, true, false);
    snprintf(buf, sizeof buf, "%s;distributed.activation_checkpointing=true;"
             "distributed.moe.ignore_router_for_ac=true", moe);
    compare("moe, AC keeping the router", buf, false, false);
    snprintf(buf, sizeof buf, "%s;model.mlp_only_layers=0;model.moe_capacity_factor=0.75;"
             "model.moe_router_bias_update_rate=0.001", moe);
    compare("moe, dense layer 0, capacity 0.75, bias", buf, false, false);
    compare("dense, pipeline chunks, split backward", NULL, false, true);
    compare("biases, head_dim 6, pipeline chunks, split backward",
            "model.head_dim=6;model.attention_bias=true;model.mlp_bias=true", false, true);
    compare("moe, pipeline chunks, split backward", moe, false, true);
    const char *lora = "model.pretrained_model_name_or_path=base;peft.dim=2;peft.alpha=4";
    compare("lora, biases, qk_norm, AC, packed", "model.pretrained_model_name_or_path=base;"
            "peft.dim=2;model.attention_bias=true;model.mlp_bias=true;model.qk_norm=true;"
            "distributed.activation_checkpointing=true", true, false);
    snprintf(buf, sizeof buf, "%s;model.tie_word_embeddings=true", lora);
    compare("lora, tied", buf, false, false);
    return mt_test_exit("test_device_discipline");
}
