/* test_bf16_values: the mixed-precision rule, checked at every kernel call.
 *
 * Under param_dtype bfloat16 "an activation or activation gradient is
 * rounded once, when it is complete, before any other op reads it"
 * (doc/mixed-precision.md).  This test wraps the CPU rounding table
 * (mt_backend_cpu_bf16) with entries that look at their inputs before
 * calling it, runs a forward and backward micro-batch of the tiny model
 * through it and checks, at every call:
 *
 *  1. with the table as the CPU trainer takes it (reads_bf16 false): every
 *     activation input of every entry, the GEMMs' operands (weights
 *     included) and every tensor-parallel message is a bf16 value (its low
 *     16 bits zero).  Two exceptions, by contract: the loss entries read
 *     the logits unrounded (they round them themselves, mt_backend.h), and
 *     a GEMM that adds (beta 1) onto an accumulator, a sum of several
 *     GEMMs rounded once after the last: dh, datt, dtmp, the experts' ye,
 *     and a MoE layer's output with shared experts (the routed combine,
 *     then the shared down projection; doc/mixed-precision.md, "bf16
 *     storage: the plan", lists them).
 *  2. with reads_bf16 set (what the CUDA bf16 table declares): inputs that
 *     are not bf16 values reach only the entries and arguments mt_backend.h
 *     says round on load.  The model (mt_model_round_in) skips a pass
 *     exactly when only such entries read the tensor; a GEMM, an add, a
 *     combine or the wire meeting an unrounded tensor is a bug that the CPU
 *     runs cannot show (there the passes run) and that on the GPU changes
 *     numerics silently.  The check also demands that some unrounded
 *     inputs do arrive at those entries, or the mode tests nothing.
 *
 * A missing or misplaced rounding in model.c or model_moe.c fails here by
 * name (phase, entry, argument, buffer), where a bit-for-bit comparison of
 * two runs of the same model code cannot see it.  A self-test first feeds
 * the wrapped GEMM an unrounded operand and demands a report.
 *
 * One rank: dense, dense with qk_norm, activation checkpointing, split
 * backward (zero-bubble's B and W), every linear's bias (nonzero) with
 * head_dim apart from hidden / heads and with a split backward, MoE with
 * a shared expert (and with checkpointing).  Two ranks (bf16-values-np2):
 * tp 2 with and without sequence parallelism, dense with qk_norm, with
 * biases, and MoE. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_moe.h"
#include "mt_backend.h"
#include "mt_config.h"
#include "mt_model.h"
#include "mt_test.h"
#include "mt_test_model.h"
#include "mt_tp_comm.h"

/* ------------------------------------------------------------ what is where */

typedef struct {
    const char *name;
    int layer; /* -1: not a layer's */
    const float *p;
    int64_t n;
} region_t;

#define MAX_REGIONS 256
static region_t regions[MAX_REGIONS];
static int nregions;

static void add_region(const char *name, int layer, const float *p, int64_t n)
{
    if (p && n > 0 && nregions < MAX_REGIONS)
        regions[nregions++] = (region_t){name, layer, p, n};
}

/* The model's activation buffers (and its weights), by name, for the
 * reports and the accumulator rule. */
static void map_model(const mt_model_t *m)
{
    nregions = 0;
    int64_t N = m->N, Ns = m->Ns, H = m->H, Q = m->nh * m->hd, KV = m->nkv * m->hd, I = m->I;
    for (int l = -1; l < m->L; l++) {
        const mt_layer_acts_t *a = l < 0 ? &m->scratch : &m->acts[l];
        add_region("x", l, a->x, Ns * H);
        add_region("h1", l, a->h1, Ns * H);
        add_region("q_raw", l, a->q_raw, N * Q);
        add_region("k_raw", l, a->k_raw, N * KV);
        add_region("q", l, a->q, N * Q);
        add_region("k", l, a->k, N * KV);
        add_region("v", l, a->v, N * KV);
        add_region("att", l, a->att, N * Q);
        add_region("x_mid", l, a->x_mid, Ns * H);
        add_region("h2", l, a->h2, Ns * H);
        add_region("g", l, a->g, N * I);
        add_region("u", l, a->u, N * I);
        add_region("a", l, a->a, N * I);
        add_region("w_dmlp", l, a->w_dmlp, N * H);
        add_region("w_datt", l, a->w_datt, N * H);
        add_region("w_dq", l, a->w_dq, N * Q);
        add_region("w_dk", l, a->w_dk, N * KV);
        add_region("w_dv", l, a->w_dv, N * KV);
    }
    add_region("x_final", -1, m->x_final, Ns * H);
    add_region("dres", -1, m->dres, Ns * H);
    add_region("xf", -1, m->xf, N * H);
    add_region("logits", -1, m->logits, m->head_chunk * m->V);
    add_region("dtmp", -1, m->dtmp, Ns * H);
    add_region("dh_local", -1, m->dh_local, Ns * H);
    add_region("gather", -1, m->gather, N * H);
    add_region("dh", -1, m->dh, N * H);
    add_region("datt", -1, m->datt, N * (Q > H ? Q : H));
    add_region("dq", -1, m->dq, N * Q);
    add_region("dk", -1, m->dk, N * KV);
    add_region("dv", -1, m->dv, N * KV);
    add_region("dI", -1, m->dI, N * I);
    add_region("weights", -1, m->param_mem, m->numel);
    if (m->moe) {
        const mt_moe_t *x = m->moe;
        add_region("moe.weights", -1, x->param_mem, x->numel);
        add_region("moe.sendbuf", -1, x->sendbuf, x->N * x->K * H);
        add_region("moe.recvbuf", -1, x->recvbuf, x->scap * H);
        add_region("moe.ye", -1, x->ye, x->scap * H);
        add_region("moe.da", -1, x->da, x->scap * x->Im);
        add_region("moe.dlogits", -1, x->dlogits, x->N * x->E);
    }
}

static const region_t *region_of(const float *p)
{
    for (int i = 0; i < nregions; i++)
        if (p >= regions[i].p && p < regions[i].p + regions[i].n)
            return &regions[i];
    return NULL;
}

/* ------------------------------------------------------------ the checks */

static const mt_backend_t *inner;   /* the CPU rounding table */
static mt_backend_t checked;        /* it, with the wrappers below */
static const char *run_label = "", *phase = "";
static bool accumulators_with_x;    /* a MoE layer with shared experts writes x by a sum */
static long inspected, unrounded_on_load;
static bool self_testing; /* the detector's own test: count, do not print */
static long reports;

#define MAX_SEEN 512
static char seen[MAX_SEEN][192];
static int nseen;

static int64_t count_unrounded(const float *x, int64_t n)
{
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        c += (u & 0xffffu) != 0;
    }
    return c;
}

/* One input of one call: n floats at p, read by entry as arg.  on_load:
 * mt_backend.h lists this argument among those an entry with reads_bf16
 * rounds as it loads them. */
static void inspect(const char *entry, const char *arg, const float *p, int64_t n, bool on_load)
{
    if (!p || n <= 0)
        return;
    inspected++;
    mt_test_checks++;
    int64_t bad = count_unrounded(p, n);
    if (!bad)
        return;
    if (on_load && checked.reads_bf16) {
        unrounded_on_load++;
        return;
    }
    const region_t *r = region_of(p);
    char where[64], key[192];
    if (r)
        snprintf(where, sizeof where, "%s[%d]+%lld", r->name, r->layer, (long long)(p - r->p));
    else
        snprintf(where, sizeof where, "an unnamed buffer");
    snprintf(key, sizeof key, "%s %s %s %s %s", run_label, phase, entry, arg, where);
    for (int i = 0; i < nseen; i++)
        if (!strcmp(seen[i], key))
            return;
    if (nseen < MAX_SEEN)
        snprintf(seen[nseen++], sizeof seen[0], "%s", key);
    reports++;
    if (self_testing)
        return;
    mt_test_failures++;
    fprintf(stderr, "%s, %s: %s reads %s from %s with %lld of %lld elements not bf16 values\n",
            run_label, phase, entry, arg, where, (long long)bad, (long long)n);
}

/* A beta-1 GEMM's C: an accumulator may hold a partial sum (above). */
static void inspect_accumulator(const float *c, int64_t n)
{
    const region_t *r = region_of(c);
    if (!r) /* the gradient arenas: fp32 by rule */
        return;
    static const char *const sums[] = {"dh", "datt", "dtmp", "moe.ye"};
    for (size_t i = 0; i < sizeof sums / sizeof sums[0]; i++)
        if (!strcmp(r->name, sums[i]))
            return;
    if (accumulators_with_x && (!strcmp(r->name, "x") || !strcmp(r->name, "x_final")))
        return;
    inspect("matmul (beta 1)", "C", c, n, false);
}

static void w_matmul(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                     bool ta, bool tb, float beta)
{
    inspect("matmul", "A", a, m * k, false);
    inspect("matmul", "B", b, k * n, false);
    if (beta != 0.0f)
        inspect_accumulator(c, m * n);
    inner->matmul(c, a, b, m, n, k, ta, tb, beta);
}

/* c = r + a b: the residual r, read as it was by the copy into c that
 * came first (w_copy) before matmul_add */
static void w_matmul_add(float *c, const float *r, const float *a, const float *b, int64_t m,
                         int64_t n, int64_t k, bool ta, bool tb)
{
    inspect("matmul_add", "A", a, m * k, false);
    inspect("matmul_add", "B", b, k * n, false);
    inspect("matmul_add", "r", r, m * n, false);
    inner->matmul_add(c, r, a, b, m, n, k, ta, tb);
}

/* a float32 result (weight gradients, the router's logits, the summed
 * input gradient of the column-parallel layers): its operands are
 * activations all the same */
static void w_matmul_f32out(float *c, const float *a, const float *b, int64_t m, int64_t n,
                            int64_t k, bool ta, bool tb, float beta)
{
    inspect("matmul_f32out", "A", a, m * k, false);
    inspect("matmul_f32out", "B", b, k * n, false);
    inner->matmul_f32out(c, a, b, m, n, k, ta, tb, beta);
}

static void w_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t n,
                              int64_t dim, float eps)
{
    inspect("rmsnorm_forward", "x", x, n * dim, true);
    inspect("rmsnorm_forward", "w", w, dim, false);
    inner->rmsnorm_forward(out, rstd, x, w, n, dim, eps);
}

static void w_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                               const float *w, const float *rstd, int64_t n, int64_t dim,
                               bool acc)
{
    inspect("rmsnorm_backward", "dout", dout, n * dim, true);
    inspect("rmsnorm_backward", "x", x, n * dim, true);
    if (acc)
        inspect("rmsnorm_backward", "dx (accumulated)", dx, n * dim, true);
    inner->rmsnorm_backward(dx, dw, dout, x, w, rstd, n, dim, acc);
}

static void w_rope_forward(float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                           const double *inv_freq, double scale)
{
    inspect("rope_forward", "x", x, n * nh * hd, true);
    inner->rope_forward(x, pos, n, nh, hd, inv_freq, scale);
}

static void w_rope_backward(float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                            const double *inv_freq, double scale)
{
    inspect("rope_backward", "dx", x, n * nh * hd, true);
    inner->rope_backward(x, pos, n, nh, hd, inv_freq, scale);
}

static void w_swiglu_forward(float *out, const float *g, const float *u, int64_t n)
{
    inspect("swiglu_forward", "gate", g, n, true);
    inspect("swiglu_forward", "up", u, n, true);
    inner->swiglu_forward(out, g, u, n);
}

static void w_swiglu_backward(float *dg, float *du, const float *dout, const float *g,
                              const float *u, int64_t n)
{
    inspect("swiglu_backward", "dout", dout, n, true);
    inspect("swiglu_backward", "gate", g, n, true);
    inspect("swiglu_backward", "up", u, n, true);
    inner->swiglu_backward(dg, du, dout, g, u, n);
}

static void w_attention_forward(float *out, float *lse, const float *q, const float *k,
                                const float *v, const int32_t *ds, int64_t B, int64_t T,
                                int64_t nh, int64_t nkv, int64_t hd)
{
    inspect("attention_forward", "q", q, B * T * nh * hd, true);
    inspect("attention_forward", "k", k, B * T * nkv * hd, true);
    inspect("attention_forward", "v", v, B * T * nkv * hd, true);
    inner->attention_forward(out, lse, q, k, v, ds, B, T, nh, nkv, hd);
}

static void w_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                 const float *out, const float *lse, const float *q,
                                 const float *k, const float *v, const int32_t *ds, int64_t B,
                                 int64_t T, int64_t nh, int64_t nkv, int64_t hd)
{
    inspect("attention_backward", "dout", dout, B * T * nh * hd, true);
    inspect("attention_backward", "out", out, B * T * nh * hd, true);
    inspect("attention_backward", "q", q, B * T * nh * hd, true);
    inspect("attention_backward", "k", k, B * T * nkv * hd, true);
    inspect("attention_backward", "v", v, B * T * nkv * hd, true);
    inner->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, ds, B, T, nh, nkv, hd);
}

static void w_add(float *y, const float *x, int64_t n)
{
    inspect("add", "y", y, n, false);
    inspect("add", "x", x, n, false);
    inner->add(y, x, n);
}

static void w_embedding_backward(float *dtable, const float *dout, const int32_t *tok, int64_t n,
                                 int64_t dim)
{
    inspect("embedding_backward", "dout", dout, n * dim, false);
    inner->embedding_backward(dtable, dout, tok, n, dim);
}

static void w_moe_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t n,
                              int64_t width)
{
    /* src's rows that are gathered; the buffer may hold more */
    for (int64_t i = 0; i < n; i++)
        if (rows[i] >= 0)
            inspect("moe_gather_rows", "src row", src + rows[i] * width, width, false);
    inner->moe_gather_rows(dst, src, rows, n, width);
}

static void w_moe_combine(float *out, const float *res, const float *y, const int32_t *slot_row,
                          const float *w, int64_t n, int64_t k, int64_t width)
{
    inspect("moe_combine", "res", res, n * width, false);
    for (int64_t i = 0; i < n * k; i++)
        if (slot_row[i] >= 0)
            inspect("moe_combine", "y row", y + slot_row[i] * width, width, false);
    inner->moe_combine(out, res, y, slot_row, w, n, k, width);
}

static void w_moe_combine_backward(float *dw, float *dy, const float *dout, const float *y,
                                   const int32_t *slot_row, const float *w, int64_t n, int64_t k,
                                   int64_t width)
{
    inspect("moe_combine_backward", "dout", dout, n * width, false);
    for (int64_t i = 0; i < n * k; i++)
        if (slot_row[i] >= 0)
            inspect("moe_combine_backward", "y row", y + slot_row[i] * width, width, false);
    inner->moe_combine_backward(dw, dy, dout, y, slot_row, w, n, k, width);
}

static void w_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    /* the kept layer inputs and the bf16 messages: exact only on bf16 values */
    inspect("to_bf16", "src", src, n, false);
    inner->to_bf16(dst, src, n);
}

static void w_copy(void *dst, const void *src, size_t bytes)
{
    const region_t *r = region_of(src);
    if (r && bytes % sizeof(float) == 0 && strcmp(r->name, "weights") != 0)
        inspect("copy", "src", src, (int64_t)(bytes / sizeof(float)), false);
    inner->copy(dst, src, bytes);
}

static void make_checked(bool reads)
{
    inner = mt_backend_cpu_bf16();
    checked = *inner;
    checked.name = "cpu_bf16 (checked)";
    checked.reads_bf16 = reads;
    checked.matmul = w_matmul;
    checked.matmul_f32out = w_matmul_f32out;
    checked.matmul_add = w_matmul_add;
    checked.rmsnorm_forward = w_rmsnorm_forward;
    checked.rmsnorm_backward = w_rmsnorm_backward;
    checked.rope_forward = w_rope_forward;
    checked.rope_backward = w_rope_backward;
    checked.swiglu_forward = w_swiglu_forward;
    checked.swiglu_backward = w_swiglu_backward;
    checked.attention_forward = w_attention_forward;
    checked.attention_backward = w_attention_backward;
    checked.add = w_add;
    checked.embedding_backward = w_embedding_backward;
    checked.moe_gather_rows = w_moe_gather_rows;
    checked.moe_combine = w_moe_combine;
    checked.moe_combine_backward = w_moe_combine_backward;
    checked.to_bf16 = w_to_bf16;
    checked.copy = w_copy;
}

/* ------------------------------------------------------------ tensor parallelism */

static mt_tp_comm_t tpc;
static int tp_size = 1;

static void tp_checked(void *ctx, const void *in, void *out, int64_t n, mt_tp_op_t op)
{
    (void)ctx;
    if (op == MT_TP_SUM_FLOAT || op == MT_TP_GATHER_FLOAT)
        inspect("tp message", op == MT_TP_SUM_FLOAT ? "sum" : "gather", in, n, false);
    else if (op == MT_TP_SCATTER_FLOAT) /* n: the rows that come back; in holds tp times that */
        inspect("tp message", "reduce-scatter", in, n * tp_size, false);
    mt_tp_comm_run(&tpc, in, out, n, op);
}

/* ------------------------------------------------------------ the runs */

static void run(const char *label, const char *extra, bool moe, bool reads, bool split, int tp_rank)
{
    mt_config_t cfg;
    const char *base = moe ? "model.num_experts=4;model.num_experts_per_tok=2;"
                             "model.moe_intermediate_size=8;model.norm_topk_prob=true;"
                             "distributed.mp_policy.param_dtype=bfloat16"
                           : "distributed.mp_policy.param_dtype=bfloat16";
    if (!mt_test_model_cfg(&cfg, base, extra, moe ? MT_APP_MOE : MT_APP_DENSE, tp_size))
        return;
    make_checked(reads);
    static char lab[128];
    snprintf(lab, sizeof lab, "%s (reads_bf16 %d)", label, (int)reads);
    run_label = lab;
    mt_model_t m;
    mt_model_part_t part = {0};
    mt_model_part_t *pp = NULL;
    static int lo[1] = {0}, hi[1];
    if (split) { /* one stage of everything, with zero-bubble's split backward */
        hi[0] = (int)cfg.model.num_hidden_layers;
        part.nchunks = 1, part.layer_lo = lo, part.layer_hi = hi;
        part.embed = part.head = true;
        part.nslots = 1;
        part.split_backward = true;
        pp = &part;
    }
    mt_status_t s = mt_model_init_part(&m, &cfg, &checked, 2, 8, 0, tp_rank, pp);
    CHECK(s == MT_OK, "%s: model init: %s", lab, mt_error_message());
    if (s != MT_OK)
        return;
    mt_model_init_weights(&m, 1);
    for (int i = 0; i < m.nparams; i++) /* nonzero biases (they start at 0) */
        for (int64_t j = 0; m.params[i].is_bias && j < m.params[i].numel; j++)
            m.params[i].data[j] = (float)(0.2 * mt_rng_normal(3, (uint32_t)i, (uint64_t)j));
    /* what the parallelize layer does: the weights the kernels read are
     * bf16 values (src/train/train_mp.c) */
    inner->round_bf16(m.param_mem, m.numel);
    if (m.moe && m.moe->param_mem)
        inner->round_bf16(m.moe->param_mem, m.moe->numel);
    accumulators_with_x = m.moe && m.moe->Is > 0;
    if (tp_rank >= 0)
        m.tp_allreduce = tp_checked, m.tp_ctx = NULL;
    int32_t tok[16], tgt[16];
    mt_test_batch(16, 37, tok, tgt, 11);
    int64_t count;
    map_model(&m);
    phase = "forward";
    mt_model_forward_chunk(&m, 0, tok, tgt, true, 1.0f / 15, &count);
    map_model(&m);
    phase = "backward";
    mt_model_backward_chunk(&m, 0, tok, split);
    if (split) {
        phase = "weight gradients";
        mt_model_weight_chunk(&m, 0);
    }
    mt_model_free(&m);
}

/* The detector itself: an unrounded GEMM operand must be reported. */
static void self_test(void)
{
    make_checked(false);
    nregions = 0;
    run_label = "self-test", phase = "direct call";
    float a[4] = {1.0f, 2.0f, 3.0f, 1.0f + 1.0f / 1024.0f}, b[4] = {1, 0, 0, 1}, c[4];
    self_testing = true;
    w_matmul(c, a, b, 2, 2, 2, false, false, 0.0f);
    self_testing = false;
    CHECK(reports == 1, "an unrounded GEMM operand gave %ld reports, not 1", reports);
    reports = 0, nseen = 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    self_test();
    long on_load_seen = 0;
    for (int reads = 0; reads < 2; reads++) {
        unrounded_on_load = 0;
        if (world == 1) {
            run("dense", "", false, reads, false, -1);
            run("dense qk_norm", "model.qk_norm=true", false, reads, false, -1);
            run("dense, checkpointing", "distributed.activation_checkpointing=true", false, reads,
                false, -1);
            run("dense, split backward", "", false, reads, true, -1);
            run("dense, biases, head_dim 6",
                "model.head_dim=6;model.attention_bias=true;model.mlp_bias=true", false, reads,
                false, -1);
            run("biases, split backward", "model.attention_bias=true;model.mlp_bias=true", false,
                reads, true, -1);
            run("moe, shared expert", "model.num_shared_experts=1", true, reads, false, -1);
            run("moe, checkpointing",
                "model.num_shared_experts=1;distributed.activation_checkpointing=true", true,
                reads, false, -1);
            run("moe qk_norm", "model.qk_norm=true", true, reads, false, -1);
        } else if (world == 2) {
            tp_size = 2;
            if (reads == 0)
                CHECK(mt_tp_comm_init(&tpc, MPI_COMM_WORLD, mt_backend_cpu(), true) == MT_OK,
                      "tp comm: %s", mt_error_message());
            run("tp 2 dense qk_norm", "distributed.tp_size=2;model.qk_norm=true", false, reads,
                false, rank);
            run("tp 2 + SP dense", "distributed.tp_size=2;distributed.sequence_parallel=true",
                false, reads, false, rank);
            run("tp 2 biases", "distributed.tp_size=2;model.attention_bias=true;model.mlp_bias=true",
                false, reads, false, rank);
            run("tp 2 + SP biases, head_dim 6",
                "distributed.tp_size=2;distributed.sequence_parallel=true;model.head_dim=6;"
                "model.attention_bias=true;model.mlp_bias=true",
                false, reads, false, rank);
            run("tp 2 moe", "distributed.tp_size=2;model.num_shared_experts=1", true, reads, false,
                rank);
            run("tp 2 + SP moe",
                "distributed.tp_size=2;distributed.sequence_parallel=true;"
                "model.num_shared_experts=1",
                true, reads, false, rank);
        } else {
            CHECK(0, "runs on 1 or 2 ranks, not %d", world);
        }
        if (reads)
            on_load_seen = unrounded_on_load;
    }
    /* with reads_bf16 the model must leave some GEMM outputs to the loads */
    CHECK(on_load_seen > 0, "reads_bf16: no unrounded input reached an entry that rounds on load");
    CHECK(inspected > 1000, "only %ld inputs inspected", inspected);
    if (world == 2)
        mt_tp_comm_free(&tpc);
    int rc = mt_test_exit_mpi("test_bf16_values", MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
