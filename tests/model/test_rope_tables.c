/* test_rope_tables: the model's RoPE tables (model_rope.c).
 *
 * Prints, for a set of configs, every inverse frequency and the cos/sin
 * scale that mt_rope_table computes, one "case" line of parameters
 * before each table, for tests/model/rope_tables.py to recompute from
 * transformers' formulas on its own (tests/model/rope_tables.sh compares
 * them).  The configs: Llama 3.1's own llama3 numbers, linear, dynamic
 * NTK below, at and above max_position_embeddings, yarn as Qwen (factor
 * 4 over 32768), DeepSeek (factor 40 over 4096, attention factor given)
 * and gpt-oss (truncate false) configure it, yarn without
 * original_max_position_embeddings, at factor 1, and with a context so
 * short that the correction range is empty.
 *
 * And checks, here, what the model does with them:
 *  - linear factor 2 at positions 2t is default RoPE at positions t, bit
 *    for bit: the loss and every gradient (the table reaches both rope
 *    kernels of the forward and the backward);
 *  - dynamic NTK: the table follows the micro-batch's largest position
 *    (scaled above max_position_embeddings, the unscaled one at or below
 *    it, which is default RoPE's bits), and is copied to the backend only
 *    when it changes; the other types' tables never are after init;
 *  - the keys a type does not read are refused by name.
 * No MPI. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_rope.h"
#include "mt_backend.h"
#include "mt_config.h"
#include "mt_model.h"
#include "mt_test.h"
#include "mt_test_model.h"

typedef struct {
    const char *name;
    mt_rope_type_t type;
    double theta;
    int64_t head_dim, max_pos;
    double factor, low, high;
    int64_t orig; /* 0: none */
    double beta_fast, beta_slow, attention_factor;
    bool truncate;
    int64_t seq_len;
} rope_case_t;

static const rope_case_t cases[] = {
    {"default", MT_ROPE_DEFAULT, 10000.0, 64, 2048, 1, 1, 4, 0, 32, 1, 0, true, 0},
    {"linear-4", MT_ROPE_LINEAR, 10000.0, 128, 4096, 4.0, 1, 4, 0, 32, 1, 0, true, 0},
    {"llama3.1", MT_ROPE_LLAMA3, 500000.0, 128, 131072, 8.0, 1.0, 4.0, 8192, 32, 1, 0, true, 0},
    /* the parity test's: every band at head_dim 16 */
    {"llama3-small", MT_ROPE_LLAMA3, 10000.0, 16, 4096, 4.0, 1.0, 4.0, 16, 32, 1, 0, true, 0},
    {"dynamic-init", MT_ROPE_DYNAMIC, 10000.0, 64, 2048, 2.0, 1, 4, 0, 32, 1, 0, true, 0},
    {"dynamic-below", MT_ROPE_DYNAMIC, 10000.0, 64, 2048, 2.0, 1, 4, 0, 32, 1, 0, true, 1000},
    {"dynamic-at", MT_ROPE_DYNAMIC, 10000.0, 64, 2048, 2.0, 1, 4, 0, 32, 1, 0, true, 2048},
    {"dynamic-above", MT_ROPE_DYNAMIC, 10000.0, 64, 2048, 2.0, 1, 4, 0, 32, 1, 0, true, 5000},
    {"dynamic-far", MT_ROPE_DYNAMIC, 500000.0, 128, 8192, 3.5, 1, 4, 0, 32, 1, 0, true, 100000},
    {"yarn-qwen", MT_ROPE_YARN, 1000000.0, 128, 131072, 4.0, 1, 4, 32768, 32, 1, 0, true, 0},
    {"yarn-deepseek", MT_ROPE_YARN, 10000.0, 64, 163840, 40.0, 1, 4, 4096, 32, 1, 1.0, true, 0},
    {"yarn-gpt-oss", MT_ROPE_YARN, 150000.0, 64, 131072, 32.0, 1, 4, 4096, 32, 1, 0, false, 0},
    {"yarn-no-orig", MT_ROPE_YARN, 10000.0, 64, 4096, 2.0, 1, 4, 0, 16, 2, 1.25, true, 0},
    {"yarn-factor-1", MT_ROPE_YARN, 10000.0, 32, 4096, 1.0, 1, 4, 2048, 32, 1, 0, true, 0},
    {"yarn-short", MT_ROPE_YARN, 10000.0, 16, 64, 2.0, 1, 4, 4, 32, 1, 0, true, 0},
};

static void spec_of(const rope_case_t *c, mt_model_config_t *mc)
{
    memset(mc, 0, sizeof *mc);
    mc->rope_theta = c->theta;
    mc->max_position_embeddings = c->max_pos;
    mt_rope_scaling_t *r = &mc->rope_scaling;
    r->rope_type = c->type, r->factor = c->factor;
    r->low_freq_factor = c->low, r->high_freq_factor = c->high;
    r->original_max_position_embeddings.set = c->orig > 0;
    r->original_max_position_embeddings.value = c->orig;
    r->beta_fast = c->beta_fast, r->beta_slow = c->beta_slow;
    r->attention_factor = c->attention_factor, r->truncate = c->truncate;
}

static void print_tables(void)
{
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const rope_case_t *c = &cases[k];
        mt_model_config_t mc;
        spec_of(c, &mc);
        mt_rope_spec_t spec;
        if (mt_rope_spec(&mc, c->head_dim, &spec) != MT_OK) {
            CHECK(0, "%s: %s", c->name, mt_error_message());
            continue;
        }
        double *inv = malloc(sizeof(double) * (size_t)(c->head_dim / 2)), att = -1;
        mt_rope_table(&spec, c->seq_len, inv, &att);
        printf("case %s type=%s theta=%.17g head_dim=%lld max_pos=%lld factor=%.17g "
               "low=%.17g high=%.17g orig=%lld beta_fast=%.17g beta_slow=%.17g "
               "attention_factor=%.17g truncate=%d seq_len=%lld\n",
               c->name, mt_rope_type_name(c->type), c->theta, (long long)c->head_dim,
               (long long)c->max_pos, c->factor, c->low, c->high, (long long)c->orig,
               c->beta_fast, c->beta_slow, c->attention_factor, c->truncate,
               (long long)c->seq_len);
        printf("att %.17g\n", att);
        for (int64_t i = 0; i < c->head_dim / 2; i++)
            printf("inv %lld %.17g\n", (long long)i, inv[i]);
        free(inv);
    }
}

/* ---- the model with its table */

static int copies; /* copy_to_device calls onto the table */
static const double *watched;
static const mt_backend_t *cpu;
static void counting_copy(void *dst, const void *src, size_t bytes)
{
    if (watched && dst == watched)
        copies++;
    cpu->copy_to_device(dst, src, bytes);
}

static int model_of(mt_model_t *m, const mt_backend_t *be, const char *rope, int64_t B,
                    int64_t T)
{
    mt_config_t cfg;
    if (!mt_test_model_cfg(&cfg, NULL, rope, MT_APP_ANY, 1))
        return 0;
    if (mt_model_init(m, &cfg, be, B, T) != MT_OK) {
        CHECK(0, "%s: init: %s", rope, mt_error_message());
        return 0;
    }
    mt_model_init_weights(m, 77);
    return 1;
}

/* linear factor 2 at positions 2t = default at t, bit for bit */
static void linear_is_stretched_positions(void)
{
    const int64_t B = 2, T = 8, N = B * T;
    mt_model_t a, b;
    if (!model_of(&a, mt_backend_cpu(), "model.rope_scaling.rope_type=linear;"
                                        "model.rope_scaling.factor=2.0", B, T) ||
        !model_of(&b, mt_backend_cpu(), NULL, B, T))
        return;
    int32_t tok[16], tgt[16], pa[16], pb[16];
    mt_test_batch(N, a.V_valid, tok, tgt, 5);
    for (int64_t i = 0; i < N; i++)
        pb[i] = (int32_t)(i % T), pa[i] = 2 * pb[i];
    mt_model_set_packing(&a, pa, NULL);
    mt_model_set_packing(&b, pb, NULL);
    mt_model_zero_grad(&a), mt_model_zero_grad(&b);
    int64_t ca, cb;
    double la = mt_model_step(&a, tok, tgt, true, 0.1f, &ca);
    double lb = mt_model_step(&b, tok, tgt, true, 0.1f, &cb);
    CHECK(la == lb && ca == cb, "linear factor 2 at 2t: loss %.17g, default at t: %.17g", la, lb);
    CHECK(memcmp(a.grad_mem, b.grad_mem, sizeof(float) * (size_t)a.numel) == 0,
          "linear factor 2 at 2t: gradients differ from default RoPE's at t");
    /* and the positions matter: default at 2t is another loss */
    mt_model_set_packing(&b, pa, NULL);
    double l2 = mt_model_step(&b, tok, tgt, false, 0, &cb);
    CHECK(l2 != lb, "default RoPE at 2t gives the loss at t (%.17g)", l2);
    mt_model_free(&a), mt_model_free(&b);
}

static bool table_is(mt_model_t *m, const mt_rope_spec_t *spec, int64_t seq_len)
{
    const int64_t half = spec->head_dim / 2;
    double want[64], got[64], att;
    mt_rope_table(spec, seq_len, want, &att);
    m->be->copy_to_host(got, m->rope->inv_freq, sizeof(double) * (size_t)half);
    return memcmp(want, got, sizeof(double) * (size_t)half) == 0 && m->rope->scale == att;
}

static void dynamic_follows_the_batch(void)
{
    static mt_backend_t counting;
    cpu = mt_backend_cpu();
    counting = *cpu;
    counting.copy_to_device = counting_copy;
    const int64_t B = 2, T = 8, N = B * T;
    mt_model_t m, d;
    /* max_position_embeddings 6: rows of 8 are beyond it */
    if (!model_of(&m, &counting, "model.rope_scaling.rope_type=dynamic;"
                                 "model.rope_scaling.factor=2.0;model.max_position_embeddings=6",
                  B, T) ||
        !model_of(&d, cpu, "model.max_position_embeddings=6", B, T))
        return;
    mt_rope_spec_t spec = m.rope->spec;
    watched = m.rope->inv_freq, copies = 0;
    CHECK(table_is(&m, &spec, 8), "dynamic: plain rows of 8: not the table for seq_len 8");
    int32_t pos[16];
    for (int64_t i = 0; i < N; i++)
        pos[i] = (int32_t)(i % 4); /* packed documents of 4: seq_len 4 */
    mt_model_set_packing(&m, pos, NULL);
    CHECK(table_is(&m, &spec, 6) && copies == 1, "dynamic: seq_len 4 <= 6: not the unscaled "
          "table (copies %d)", copies);
    const int64_t half = m.hd / 2;
    double dyn[64], def[64];
    m.be->copy_to_host(dyn, m.rope->inv_freq, sizeof(double) * (size_t)half);
    d.be->copy_to_host(def, d.rope->inv_freq, sizeof(double) * (size_t)half);
    CHECK(memcmp(dyn, def, sizeof(double) * (size_t)half) == 0,
          "dynamic at or below max_position_embeddings is not default RoPE's table");
    mt_model_set_packing(&m, pos, NULL);
    CHECK(copies == 1, "dynamic: the same seq_len again copied the table (%d copies)", copies);
    pos[3] = 10; /* seq_len 11 */
    mt_model_set_packing(&m, pos, NULL);
    CHECK(table_is(&m, &spec, 11) && copies == 2, "dynamic: seq_len 11: not its table "
          "(copies %d)", copies);
    double big[64];
    m.be->copy_to_host(big, m.rope->inv_freq, sizeof(double) * (size_t)half);
    CHECK(big[half - 1] < dyn[half - 1], "dynamic: seq_len 11 does not lower the frequencies "
          "(%g vs %g)", big[half - 1], dyn[half - 1]);
    mt_model_set_packing(&m, NULL, NULL);
    CHECK(table_is(&m, &spec, 8) && copies == 3, "dynamic: back to plain rows: not the table "
          "for 8 (copies %d)", copies);
    /* the loss follows the table: plain rows now differ from default RoPE */
    int32_t tok[16], tgt[16];
    mt_test_batch(N, m.V_valid, tok, tgt, 9);
    int64_t c;
    double lm = mt_model_step(&m, tok, tgt, false, 0, &c);
    double ld = mt_model_step(&d, tok, tgt, false, 0, &c);
    CHECK(lm != ld, "dynamic above max_position_embeddings trains as default RoPE (%.17g)", lm);
    mt_model_set_packing(&m, pos, NULL);
    pos[3] = 3;
    mt_model_set_packing(&m, pos, NULL); /* seq_len 4 again */
    mt_model_set_packing(&d, pos, NULL);
    lm = mt_model_step(&m, tok, tgt, false, 0, &c);
    ld = mt_model_step(&d, tok, tgt, false, 0, &c);
    CHECK(lm == ld, "dynamic below max_position_embeddings: %.17g, default RoPE: %.17g", lm, ld);
    watched = NULL;
    mt_model_free(&m), mt_model_free(&d);

    /* the fixed tables are copied once, at init */
    mt_model_t l;
    if (!model_of(&l, &counting, "model.rope_scaling.rope_type=llama3;"
                                 "model.rope_scaling.factor=4.0;"
                                 "model.rope_scaling.original_max_position_embeddings=4",
                  B, T))
        return;
    watched = l.rope->inv_freq, copies = 0;
    mt_model_set_packing(&l, pos, NULL);
    mt_model_set_packing(&l, NULL, NULL);
    CHECK(copies == 0, "llama3: set_packing copied the table (%d copies)", copies);
    watched = NULL;
    mt_model_free(&l);
}

static void refusals(void)
{
    mt_config_t cfg;
    mt_model_t m;
    const char *bad[][2] = {
        {"model.rope_scaling.rope_type=dynamic;model.rope_scaling.factor=2.0;"
         "model.rope_scaling.original_max_position_embeddings=4",
         "model.rope_scaling.original_max_position_embeddings is read by rope_type llama3 and "
         "yarn only, not by dynamic"},
        {"model.rope_scaling.rope_type=linear;model.rope_scaling.factor=2.0;"
         "model.rope_scaling.original_max_position_embeddings=4", "not by linear"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        if (!mt_test_model_cfg(&cfg, NULL, bad[k][0], MT_APP_ANY, 1))
            continue;
        mt_status_t s = mt_model_init(&m, &cfg, mt_backend_cpu(), 1, 8);
        CHECK(s == MT_ERR_CONFIG, "%s: init gave %d", bad[k][0], (int)s);
        if (s == MT_OK)
            mt_model_free(&m);
        else
            CHECK_CONTAINS(mt_error_message(), bad[k][1]);
    }
    mt_model_config_t mc;
    memset(&mc, 0, sizeof mc);
    mc.rope_theta = 10000, mc.max_position_embeddings = 8;
    mc.rope_scaling.rope_type = MT_ROPE_DYNAMIC, mc.rope_scaling.factor = 2;
    mt_rope_spec_t spec;
    CHECK(mt_rope_spec(&mc, 2, &spec) == MT_ERR_UNSUPPORTED, "dynamic at head_dim 2 accepted");
    CHECK_CONTAINS(mt_error_message(), "needs head_dim > 2");
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--tables") == 0) {
        print_tables();
        return mt_test_failures ? 1 : 0;
    }
    linear_is_stretched_positions();
    dynamic_follows_the_batch();
    refusals();
    return mt_test_exit("test_rope_tables");
}
