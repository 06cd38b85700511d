/* test_comm_bf16.c: bfloat16 on the wire (src/comm/comm_bf16.c) and its use by
 * the sharded strategies (src/parallel/fsdp.c), on 2, 3 and 4 ranks
 * (tests/comm-bf16-np*.mpi).
 *
 *   1. pack / unpack round to nearest even like safetensors.c, NaN stays NaN;
 *   2. the bf16 all-gather(v) equals the float32 all-gather rounded
 *      afterwards, bit for bit, with uneven (and empty) parts;
 *   3. the sum op rounds every partial sum: checked on one rank with
 *      MPI_Reduce_local against a serial emulation, then over the ranks:
 *      all ranks get the same bits, run twice the same bits, every value
 *      is a bf16 value, within n 2^-8 sum|x| of the exact sum, and on 2
 *      ranks exactly bf16(bf16(a) + bf16(b));
 *   4. mt_fsdp (fsdp2-style sharding, zero 1, HSDP on 4 ranks) on the CPU
 *      backend and on the guarded one (staged collectives): gathered
 *      units are the rounded full weights and the master shards untouched;
 *      reduced gradients are the exact sums for values whose sums are
 *      exact in bf16, float32 reductions are exactly today's (the same
 *      MPI call on the same data), bf16 ones the bf16 collective's bits;
 *      gather_bf16 without sharded parameters is refused.
 *   5. mt_tp_comm (the tensor-parallel collectives over MPI), on the CPU
 *      and the guarded backend: float32 ones are exactly MPI's, the bf16
 *      ones send half the bytes, gather bf16 values exactly, sum to the
 *      bf16 op's bits (on 2 ranks bf16(a + b), the float32 path's sum
 *      rounded), reduce-scatter to the same bits as the sum's part, and
 *      leave the max and double sums alone;
 *   6. mt_stage_allreduce_grad (replicated experts, tp_partial_grad) on
 *      both backends: float32 is MPI's sum, bf16 the bf16 op's bits, and
 *      on 2 ranks across the 2^24-element piece boundary;
 *   7. the MoE row all-to-all (src/parallel/moe_dispatch.c) on both backends, by
 *      the hook and by start + join: uneven (and empty) counts deliver
 *      every row exactly, float32 and bf16 alike for bf16 values, bf16
 *      counting half the row bytes; a value that is not bf16 arrives
 *      rounded.
 * Error counts are combined over the ranks; rank 0 prints the verdict. */
/* MPICH annotates MPI_STATUSES_IGNORE arguments with access sizes that
 * GCC 12 misreads as an overflow of a zero-sized region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mt_bf16.h"
#include "mt_backend.h"
#include "mt_comm_bf16.h"
#include "mt_fsdp.h"
#include "mt_model.h"
#include "mt_stage.h"
#include "mt_test.h"
#include "mt_test_model.h"
#include "mt_tp_comm.h"
#include "moe_dispatch.h"

static int rank, size;

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float rounded(float f) { return mt_bf16_to_f32(mt_f32_to_bf16(f)); }

/* Deterministic value of rank r's element i: wide exponent range, mixed signs. */
static float value(int r, int64_t i, int salt)
{
    uint64_t h = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9ULL ^
                 (uint64_t)salt * 0x94D049BB133111EBULL;
    h ^= h >> 31, h *= 0xD6E8FEB86659FD39ULL, h ^= h >> 28;
    double m = (double)(h >> 11) / 9007199254740992.0; /* [0, 1) */
    int e = (int)(h & 15) - 8;
    return (float)((m - 0.3) * ldexp(1.0, e));
}

static void test_pack(void)
{
    /* bf16 spacing at 1 is 2^-7: 1 + 2^-8 and 1 + 3 2^-8 are ties */
    const float x[] = {1.0f, 1.00390625f /* tie: to even 1 */,
                       1.01171875f /* tie: to even 1.015625 */, -3.14159f, 1e-40f, -0.0f,
                       INFINITY, -INFINITY, 3.4e38f /* rounds to infinity */, NAN};
    int n = (int)(sizeof x / sizeof x[0]);
    uint16_t h[16];
    float back[16];
    mt_bf16_pack(h, x, n);
    mt_bf16_unpack(back, h, n);
    for (int i = 0; i < n; i++) {
        CHECK(h[i] == mt_f32_to_bf16(x[i]), "pack %d", i);
        CHECK((bits(back[i]) & 0xffffu) == 0, "unpack %d keeps low bits", i);
    }
    CHECK(back[1] == 1.0f && back[2] == 1.015625f, "ties to even: %.9g %.9g", back[1], back[2]);
    CHECK(isinf(back[8]) && isnan(back[9]), "overflow %g, NaN %g", back[8], back[9]);
}

static void test_allgather(const mt_bf16_comm_t *c)
{
    int *counts = malloc(sizeof(int) * (size_t)size), *displs = malloc(sizeof(int) * (size_t)size);
    int total = 0;
    for (int r = 0; r < size; r++) { /* uneven; the last of 3+ ranks sends nothing */
        counts[r] = size > 2 && r == size - 1 ? 0 : 1000 + 37 * r;
        displs[r] = total, total += counts[r];
    }
    float *f32 = malloc(sizeof(float) * (size_t)total), *got = malloc(sizeof(float) * (size_t)total);
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)total);
    for (int i = 0; i < counts[rank]; i++)
        f32[displs[rank] + i] = value(rank, i, 1);
    mt_bf16_pack(w + displs[rank], f32 + displs[rank], counts[rank]);
    MPI_Allgatherv(MPI_IN_PLACE, counts[rank], c->type, w, counts, displs, c->type, MPI_COMM_WORLD);
    MPI_Allgatherv(MPI_IN_PLACE, counts[rank], MPI_FLOAT, f32, counts, displs, MPI_FLOAT,
                   MPI_COMM_WORLD);
    mt_bf16_unpack(got, w, total);
    int bad = 0;
    for (int i = 0; i < total; i++)
        bad += bits(got[i]) != bits(rounded(f32[i]));
    CHECK(bad == 0, "bf16 all-gather: %d of %d elements differ from float32 gather + rounding",
          bad, total);
    free(counts), free(displs), free(f32), free(got), free(w);
}

/* The op on one rank: MPI_Reduce_local(in, inout) is inout = in + inout,
 * rounded; a chain over four inputs rounds after every step. */
static void test_op_local(const mt_bf16_comm_t *c)
{
    enum { N = 513 };
    uint16_t acc[N], x[N];
    float want[N];
    for (int i = 0; i < N; i++) {
        acc[i] = mt_f32_to_bf16(value(0, i, 2));
        want[i] = mt_bf16_to_f32(acc[i]);
    }
    for (int k = 1; k < 4; k++) {
        for (int i = 0; i < N; i++) {
            x[i] = mt_f32_to_bf16(value(k, i, 2));
            want[i] = rounded(want[i] + mt_bf16_to_f32(x[i]));
        }
        MPI_Reduce_local(x, acc, N, c->type, c->sum);
    }
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += mt_bf16_to_f32(acc[i]) != want[i];
    CHECK(bad == 0, "MPI_Reduce_local chain: %d of %d differ from per-step rounding", bad, N);
    /* 1 + 2^-9 + 2^-9 + 2^-9 rounded per step stays 1; summed in float32
     * and rounded once it would be 1 + 2^-7 */
    uint16_t one = mt_f32_to_bf16(1.0f), tiny = mt_f32_to_bf16(0x1p-9f);
    for (int k = 0; k < 3; k++)
        MPI_Reduce_local(&tiny, &one, 1, c->type, c->sum);
    CHECK(mt_bf16_to_f32(one) == 1.0f, "per-step rounding: 1 + 3 x 2^-9 gave %.9g",
          mt_bf16_to_f32(one));
    CHECK(rounded(1.0f + 3 * 0x1p-9f) == 1.0078125f, "the float32 sum would round up");
}

/* Checks on a bf16 sum over all ranks of value(r, base + i, salt). */
static int check_sum(const float *got, int64_t n, int64_t base, int salt, const char *what)
{
    int bad_rep = 0, bad_tol = 0, bad_two = 0;
    for (int64_t i = 0; i < n; i++) {
        double exact = 0, mag = 0;
        float two = 0;
        for (int r = 0; r < size; r++) {
            float x = value(r, base + i, salt);
            exact += (double)x, mag += fabs((double)x);
            two = r == 0 ? rounded(x) : rounded(two + rounded(x));
        }
        bad_rep += (bits(got[i]) & 0xffffu) != 0;
        bad_tol += fabs((double)got[i] - exact) > size * 0x1p-8 * mag * 1.01;
        bad_two += size == 2 && bits(got[i]) != bits(two);
    }
    CHECK(bad_rep == 0, "%s: %d values are not bf16 values", what, bad_rep);
    CHECK(bad_tol == 0, "%s: %d values off the exact sum by more than n 2^-8 sum|x|", what,
          bad_tol);
    CHECK(bad_two == 0, "%s: %d values differ from bf16(bf16(a) + bf16(b))", what, bad_two);
    return bad_rep + bad_tol + bad_two;
}

static void test_sums(const mt_bf16_comm_t *c)
{
    enum { N = 4099 }; /* not a multiple of anything MPI might split by */
    uint16_t *w = malloc(sizeof(uint16_t) * N), *w2 = malloc(sizeof(uint16_t) * N);
    uint16_t *w0 = malloc(sizeof(uint16_t) * N);
    float *x = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++)
        x[i] = value(rank, i, 3);
    mt_bf16_pack(w, x, N);
    memcpy(w2, w, sizeof(uint16_t) * N);
    MPI_Allreduce(MPI_IN_PLACE, w, N, c->type, c->sum, MPI_COMM_WORLD);
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, w2, N, c->type, c->sum, MPI_COMM_WORLD, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    mt_bf16_unpack(got, w, N);
    check_sum(got, N, 0, 3, "all-reduce");
    /* the same bits on every rank: compare with rank 0's */
    memcpy(w0, w, sizeof(uint16_t) * N);
    MPI_Bcast(w0, N, MPI_UINT16_T, 0, MPI_COMM_WORLD);
    CHECK(memcmp(w0, w, sizeof(uint16_t) * N) == 0, "all-reduce: ranks got different bits");
    mt_bf16_pack(w0, x, N); /* x still holds this rank's inputs */
    MPI_Allreduce(MPI_IN_PLACE, w0, N, c->type, c->sum, MPI_COMM_WORLD);
    CHECK(memcmp(w0, w, sizeof(uint16_t) * N) == 0, "all-reduce run twice: different bits");
    mt_bf16_unpack(got, w2, N); /* the non-blocking one may pick its own algorithm */
    check_sum(got, N, 0, 3, "non-blocking all-reduce");

    /* reduce-scatter with uneven counts */
    int *counts = malloc(sizeof(int) * (size_t)size);
    int64_t at = 0, mine = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = N / size + (r == 0 ? N % size : 0) - (r == 1 ? 5 : 0) + (r == 0 ? 5 : 0);
        if (r == rank)
            mine = at;
        at += counts[r];
    }
    for (int i = 0; i < N; i++)
        x[i] = value(rank, i, 4);
    mt_bf16_pack(w, x, N);
    MPI_Ireduce_scatter(w, w2, counts, c->type, c->sum, MPI_COMM_WORLD, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    mt_bf16_unpack(got, w2, counts[rank]);
    check_sum(got, counts[rank], mine, 4, "reduce-scatter");
    free(counts), free(w), free(w2), free(w0), free(x), free(got);
}

/* ---- through mt_fsdp ---- */

/* Gradient value of world rank r at flat element i: exact mode takes
 * multiples of 2^-6 of magnitude < 1/2, whose sums over 4 ranks are exact
 * in bf16 and float32 in any order. */
static float grad_value(int r, int64_t i, bool exact)
{
    if (exact)
        return (float)((int)((i * 7 + r * 13) % 64) - 32) * 0x1p-6f;
    return value(r, i, 5);
}

typedef struct {
    const char *name;
    const mt_backend_t *be;
    bool shard, hsdp, gather_bf16, reduce_bf16, exact;
} fsdp_case_t;

static void run_fsdp(const fsdp_case_t *k)
{
    mt_config_t cfg;
    if (!mt_test_model_cfg(&cfg, NULL, NULL, MT_APP_DENSE, 1))
        return;
    const mt_backend_t *be = k->be;
    mt_model_t m;
    unsigned flags = k->shard ? MT_MODEL_NO_PARAM_ARENA | MT_MODEL_NO_GRAD_ARENA : 0;
    if (mt_model_init_ex(&m, &cfg, be, 2, 8, flags, 0) != MT_OK) {
        CHECK(0, "%s: model: %s", k->name, mt_error_message());
        return;
    }
    MPI_Comm shard = MPI_COMM_WORLD, rep = MPI_COMM_NULL;
    if (k->hsdp) {
        MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &shard);
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &rep);
    }
    mt_fsdp_options_t o;
    memset(&o, 0, sizeof o);
    o.shard_params = o.shard_grads = k->shard;
    o.reshard_after_forward = o.prefetch = o.overlap_reduce = true;
    o.accum = 1;
    o.gather_bf16 = k->gather_bf16, o.reduce_bf16 = k->reduce_bf16;
    mt_fsdp_t f;
    if (mt_fsdp_init(&f, &m, shard, rep, &o) != MT_OK) {
        CHECK(0, "%s: mt_fsdp_init: %s", k->name, mt_error_message());
        mt_fsdp_free(&f), mt_model_free(&m);
        return;
    }
    const uint64_t seed = 1234;
    mt_fsdp_init_weights(&f, seed);
    int64_t N = m.numel;
    float *ref = malloc(sizeof(float) * (size_t)N), *host = malloc(sizeof(float) * (size_t)N);
    mt_model_init_range(&m, seed, 0, N, ref);
    mt_fsdp_begin(&f, 0);

    int bad_gather = 0, bad_master = 0;
    for (int u = 0; u < f.nunits; u++) {
        m.unit_hook(m.hook_ctx, u, MT_UNIT_PRE_FORWARD);
        int64_t lo = m.unit_lo[u], n = m.unit_lo[u + 1] - lo;
        be->copy_to_host(host, f.p_at[u], sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            bad_gather += bits(host[i]) != bits(k->gather_bf16 ? rounded(ref[lo + i]) : ref[lo + i]);
        m.unit_hook(m.hook_ctx, u, MT_UNIT_POST_FORWARD);
    }
    for (int u = 0; u < f.nunits; u++) {
        const mt_segment_t *s = &f.seg[u];
        be->copy_to_host(host, s->param, sizeof(float) * (size_t)s->count);
        for (int64_t i = 0; i < s->count; i++)
            bad_master += bits(host[i]) != bits(ref[s->offset + i]);
    }
    CHECK(bad_gather == 0, "%s: %d gathered parameters are not the %s weights", k->name,
          bad_gather, k->gather_bf16 ? "rounded" : "float32");
    CHECK(bad_master == 0, "%s: %d master (owned) parameters changed", k->name, bad_master);

    /* backward: every unit's gradient is this rank's grad_value */
    for (int u = f.nunits - 1; u >= 0; u--) {
        m.unit_hook(m.hook_ctx, u, MT_UNIT_PRE_BACKWARD);
        int64_t lo = m.unit_lo[u], n = m.unit_lo[u + 1] - lo;
        for (int64_t i = 0; i < n; i++)
            host[i] = grad_value(rank, lo + i, k->exact);
        be->copy_to_device(f.g_at[u], host, sizeof(float) * (size_t)n);
        m.unit_hook(m.hook_ctx, u, MT_UNIT_POST_BACKWARD);
    }
    CHECK(mt_fsdp_finish(&f) == MT_OK, "%s: finish: %s", k->name, mt_error_message());

    /* the expected reduced gradients of this rank's rows */
    int bad = 0, bad_rep = 0;
    float *want = malloc(sizeof(float) * (size_t)N);
    if (k->exact) {
        for (int u = 0; u < f.nunits; u++)
            for (int64_t i = 0; i < f.seg[u].count; i++) {
                float sum = 0;
                for (int r = 0; r < size; r++)
                    sum += grad_value(r, f.seg[u].offset + i, true);
                want[(k->shard ? f.seg[u].state : f.seg[u].offset) + i] = sum;
            }
    } else { /* the same collectives on host copies: float32 today's, bf16 the helper's */
        mt_bf16_comm_t c;
        mt_bf16_comm_init(&c);
        uint16_t *w = malloc(sizeof(uint16_t) * (size_t)N), *wo = malloc(sizeof(uint16_t) * (size_t)N);
        float *g = malloc(sizeof(float) * (size_t)N);
        for (int64_t i = 0; i < N; i++)
            g[i] = grad_value(rank, i, false);
        mt_bf16_pack(w, g, N);
        MPI_Request *req = malloc(sizeof *req * (size_t)f.nunits);
        for (int u = f.nunits - 1; u >= 0; u--) { /* the trainer's order: backward */
            const mt_segment_t *s = &f.seg[u];
            int64_t lo = m.unit_lo[u];
            int cnt = (int)(m.unit_lo[u + 1] - lo);
            if (!k->shard && k->reduce_bf16)
                MPI_Iallreduce(MPI_IN_PLACE, w + lo, cnt, c.type, c.sum, shard, &req[u]);
            else if (!k->shard)
                MPI_Iallreduce(MPI_IN_PLACE, g + lo, cnt, MPI_FLOAT, MPI_SUM, shard, &req[u]);
            else if (k->reduce_bf16)
                MPI_Ireduce_scatter(w + lo, wo + s->state, f.counts + u * f.nshard, c.type, c.sum,
                                    shard, &req[u]);
            else
                MPI_Ireduce_scatter(g + lo, want + s->state, f.counts + u * f.nshard, MPI_FLOAT,
                                    MPI_SUM, shard, &req[u]);
        }
        MPI_Waitall(f.nunits, req, MPI_STATUSES_IGNORE);
        if (!k->shard)
            k->reduce_bf16 ? mt_bf16_unpack(want, w, N) : (void)memcpy(want, g, sizeof(float) * (size_t)N);
        else if (k->reduce_bf16)
            mt_bf16_unpack(want, wo, f.owned);
        free(req), free(w), free(wo), free(g);
        mt_bf16_comm_free(&c);
    }
    for (int u = 0; u < f.nunits; u++) {
        const mt_segment_t *s = &f.seg[u];
        be->copy_to_host(host, s->grad, sizeof(float) * (size_t)s->count);
        const float *w = want + (k->shard ? s->state : s->offset);
        for (int64_t i = 0; i < s->count; i++) {
            bad += bits(host[i]) != bits(w[i]);
            bad_rep += k->reduce_bf16 && (bits(host[i]) & 0xffffu) != 0;
        }
    }
    CHECK(bad == 0, "%s: %d reduced gradients differ from the %s", k->name, bad,
          k->exact ? "exact sums" : "same collective on the host");
    CHECK(bad_rep == 0, "%s: %d reduced gradients are not bf16 values", k->name, bad_rep);
    free(ref), free(host), free(want);
    mt_fsdp_free(&f);
    mt_model_free(&m);
    if (k->hsdp)
        MPI_Comm_free(&shard), MPI_Comm_free(&rep);
}

static void test_fsdp(void)
{
    const mt_backend_t *cpu = mt_backend_cpu(), *guarded = mt_backend_cpu_guarded();
    bool hsdp = size == 4;
    const fsdp_case_t cases[] = {
        {"fsdp float32 (today's)", cpu, true, false, false, false, false},
        {"fsdp float32 exact", cpu, true, false, false, false, true},
        {"fsdp bf16 gather + reduce", cpu, true, false, true, true, false},
        {"fsdp bf16 exact", cpu, true, false, true, true, true},
        {"fsdp bf16 reduce only", cpu, true, false, false, true, false},
        {"zero 1 float32 (today's)", cpu, false, false, false, false, false},
        {"zero 1 bf16 reduce", cpu, false, false, false, true, false},
        {"fsdp bf16 staged", guarded, true, false, true, true, false},
        {"fsdp bf16 staged exact", guarded, true, false, true, true, true},
        {"zero 1 bf16 staged", guarded, false, false, false, true, true},
        {"hsdp bf16 exact", cpu, true, true, true, true, true},
        {"hsdp bf16 staged exact", guarded, true, true, true, true, true},
        {"hsdp float32 exact", cpu, true, true, false, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!cases[i].hsdp || hsdp)
            run_fsdp(&cases[i]);

    /* bf16 gathers of unsharded (master) parameters are refused */
    mt_config_t cfg;
    mt_model_t m;
    if (mt_test_model_cfg(&cfg, NULL, NULL, MT_APP_DENSE, 1) &&
        mt_model_init_ex(&m, &cfg, cpu, 2, 8, 0, 0) == MT_OK) {
        mt_fsdp_options_t o;
        memset(&o, 0, sizeof o);
        o.accum = 1, o.gather_bf16 = true;
        mt_fsdp_t f;
        CHECK(mt_fsdp_init(&f, &m, MPI_COMM_WORLD, MPI_COMM_NULL, &o) == MT_ERR_RANGE,
              "gather_bf16 without sharded parameters accepted");
        CHECK_CONTAINS(mt_error_message(), "master");
        mt_fsdp_free(&f);
        mt_model_free(&m);
    }
}

/* One TP collective through mt_tp_comm on be: the input is host data
 * copied into be's memory, the output comes back to host memory. */
static void tp_run(mt_tp_comm_t *c, const float *in, float *out, int64_t n, mt_tp_op_t op,
                   bool in_place)
{
    const mt_backend_t *be = c->be;
    int64_t ni = op == MT_TP_SCATTER_FLOAT ? n * size : n, no = op == MT_TP_GATHER_FLOAT ? n * size : n;
    size_t el = op == MT_TP_SUM_DOUBLE ? 8 : 4;
    void *di = be->device_alloc(el * (size_t)ni), *dout = in_place ? di : be->device_alloc(el * (size_t)no);
    be->copy_to_device(di, in, el * (size_t)ni);
    CHECK(mt_tp_comm_run(c, di, dout, n, op) == MT_OK, "tp collective %d: %s", (int)op,
          mt_error_message());
    be->copy_to_host(out, dout, el * (size_t)no);
    be->device_free(di);
    if (!in_place)
        be->device_free(dout);
}

static void test_tp_comm(const mt_backend_t *be, const mt_bf16_comm_t *wire)
{
    const int64_t n = 777;
    const char *bn = be->name;
    float *a = malloc(sizeof(float) * (size_t)(n * size)), *got = malloc(sizeof(float) * (size_t)(n * size));
    float *ref = malloc(sizeof(float) * (size_t)(n * size));
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(n * size));
    mt_tp_comm_t f32, b16;
    CHECK(mt_tp_comm_init(&f32, MPI_COMM_WORLD, be, false) == MT_OK, "init");
    CHECK(mt_tp_comm_init(&b16, MPI_COMM_WORLD, be, true) == MT_OK, "init bf16");
    for (int64_t i = 0; i < n * size; i++) /* bf16 values, as bf16 compute's activations */
        a[i] = rounded(value(rank, i, 5));
    int bad = 0;

    /* float32: MPI's own results */
    tp_run(&f32, a, got, n, MT_TP_SUM_FLOAT, true);
    MPI_Allreduce(a, ref, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int64_t i = 0; i < n; i++)
        bad += bits(got[i]) != bits(ref[i]);
    CHECK(bad == 0, "%s float32 TP sum: %d elements differ from MPI_Allreduce", bn, bad);
    CHECK(f32.bytes_sent == 4 * n, "%s float32 TP sum sent %lld bytes", bn, (long long)f32.bytes_sent);

    /* bf16 gather: exact on bf16 values, half the bytes */
    tp_run(&b16, a, got, n, MT_TP_GATHER_FLOAT, false);
    MPI_Allgather(a, (int)n, MPI_FLOAT, ref, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
    bad = 0;
    for (int64_t i = 0; i < n * size; i++)
        bad += bits(got[i]) != bits(ref[i]);
    CHECK(bad == 0, "%s bf16 TP gather: %d elements differ", bn, bad);
    CHECK(b16.bytes_sent == 2 * n, "%s bf16 TP gather sent %lld bytes, not %lld", bn,
          (long long)b16.bytes_sent, (long long)(2 * n));

    /* bf16 sum: the op's bits; on two ranks the float32 sum rounded once */
    tp_run(&b16, a, got, n, MT_TP_SUM_FLOAT, true);
    mt_bf16_pack(w, a, n);
    MPI_Allreduce(MPI_IN_PLACE, w, (int)n, wire->type, wire->sum, MPI_COMM_WORLD);
    mt_bf16_unpack(ref, w, n);
    float *f32sum = malloc(sizeof(float) * (size_t)n);
    MPI_Allreduce(a, f32sum, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int bad2 = 0;
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        bad += bits(got[i]) != bits(ref[i]);
        bad2 += size == 2 && bits(got[i]) != bits(rounded(f32sum[i]));
    }
    CHECK(bad == 0, "%s bf16 TP sum: %d elements differ from the bf16 op", bn, bad);
    CHECK(bad2 == 0, "%s bf16 TP sum on 2 ranks: %d elements differ from bf16(a + b)", bn, bad2);

    /* bf16 reduce-scatter: this rank's part of the same sum */
    float *sc = malloc(sizeof(float) * (size_t)n);
    tp_run(&b16, a, sc, n, MT_TP_SCATTER_FLOAT, false);
    mt_bf16_pack(w, a, n * size);
    MPI_Allreduce(MPI_IN_PLACE, w, (int)(n * size), wire->type, wire->sum, MPI_COMM_WORLD);
    mt_bf16_unpack(ref, w, n * size);
    bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += bits(sc[i]) != bits(ref[rank * n + i]);
    CHECK(bad == 0, "%s bf16 TP reduce-scatter: %d elements differ from the sum's part", bn, bad);

    /* the max stays float32 (not rounded) */
    int64_t sent = b16.bytes_sent;
    for (int64_t i = 0; i < n; i++)
        a[i] = value(rank, i, 6); /* not bf16 values */
    tp_run(&b16, a, got, n, MT_TP_MAX_FLOAT, true);
    MPI_Allreduce(a, ref, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += bits(got[i]) != bits(ref[i]);
    CHECK(bad == 0 && b16.bytes_sent - sent == 4 * n, "%s bf16 TP max: %d differ, %lld bytes",
          bn, bad, (long long)(b16.bytes_sent - sent));
    mt_tp_comm_free(&f32), mt_tp_comm_free(&b16);
    free(a), free(got), free(ref), free(w), free(f32sum), free(sc);
}

static void test_grad_sum(const mt_backend_t *be, const mt_bf16_comm_t *wire, int64_t n)
{
    float *a = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
    float *ref = malloc(sizeof(float) * (size_t)n);
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        a[i] = value(rank, i % 100003, (int)(i / 100003) + 7);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        mt_stage_buf_t st = {0};
        float *d = be->device_alloc(sizeof(float) * (size_t)n);
        be->copy_to_device(d, a, sizeof(float) * (size_t)n);
        CHECK(mt_stage_allreduce_grad(be, &st, d, n, MPI_COMM_WORLD, bf16) == MT_OK, "%s",
              mt_error_message());
        be->copy_to_host(got, d, sizeof(float) * (size_t)n);
        be->device_free(d);
        mt_stage_buf_free(&st);
        if (bf16) {
            mt_bf16_pack(w, a, n);
            MPI_Allreduce(MPI_IN_PLACE, w, (int)n, wire->type, wire->sum, MPI_COMM_WORLD);
            mt_bf16_unpack(ref, w, n);
        } else {
            MPI_Allreduce(a, ref, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += bits(got[i]) != bits(ref[i]);
        CHECK(bad == 0, "%s gradient sum of %lld (%s): %lld elements differ", be->name,
              (long long)n, bf16 ? "bf16" : "float32", (long long)bad);
    }
    free(a), free(got), free(ref), free(w);
}

/* Rank r sends (r + d) % 3 rows of width w to rank d: row j of them
 * holds value(r, (d * 7 + j) * w + i) (bf16 values when round). */
static void test_moe_rows(const mt_backend_t *be)
{
    const int64_t w = 37;
    int64_t *sc = calloc((size_t)size, sizeof *sc), *rc = calloc((size_t)size, sizeof *rc);
    int64_t ns = 0, nr = 0;
    for (int d = 0; d < size; d++)
        sc[d] = (rank + d) % 3, rc[d] = (d + rank) % 3, ns += sc[d], nr += rc[d];
    float *hs = malloc(sizeof(float) * (size_t)(ns * w + 1));
    float *hr = malloc(sizeof(float) * (size_t)(nr * w + 1));
    for (int round = 1; round >= 0; round--)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int async = 0; async < 2; async++) {
                if (!round && !bf16)
                    continue;
                for (int64_t d = 0, k = 0; d < size; d++)
                    for (int64_t j = 0; j < sc[d]; j++)
                        for (int64_t i = 0; i < w; i++, k++) {
                            float v = value(rank, (d * 7 + j) * w + i, 9);
                            hs[k] = round ? rounded(v) : v;
                        }
                mt_moe_dispatch_t md;
                CHECK(mt_moe_dispatch_init(&md, MPI_COMM_WORLD, be, bf16) == MT_OK, "%s",
                      mt_error_message());
                float *ds = be->device_alloc(sizeof(float) * (size_t)(ns * w + 1));
                float *dr = be->device_alloc(sizeof(float) * (size_t)(nr * w + 1));
                be->copy_to_device(ds, hs, sizeof(float) * (size_t)(ns * w));
                if (async)
                    mt_moe_dispatch_join(&md, mt_moe_dispatch_start(&md, ds, sc, dr, rc, w));
                else
                    mt_moe_dispatch_hook(&md, MT_EP_ROWS, ds, sc, dr, rc, w);
                be->copy_to_host(hr, dr, sizeof(float) * (size_t)(nr * w));
                int64_t bad = 0, off = 0;
                for (int64_t s = 0, k = 0; s < size; s++) /* from rank s: its rows for me */
                    for (int64_t j = 0; j < rc[s]; j++)
                        for (int64_t i = 0; i < w; i++, k++) {
                            float v = value((int)s, (rank * 7 + j) * w + i, 9);
                            float want = round || bf16 ? rounded(v) : v;
                            bad += bits(hr[k]) != bits(want);
                        }
                for (int d = 0; d < size; d++)
                    off += d != rank ? sc[d] * w : 0;
                CHECK(bad == 0, "%s MoE rows (%s, %s, %s values): %lld elements differ", be->name,
                      bf16 ? "bf16" : "float32", async ? "start + join" : "hook",
                      round ? "bf16" : "other", (long long)bad);
                CHECK(md.bytes_sent == (bf16 ? 2 : 4) * off, "%s MoE rows (%s): %lld bytes sent, "
                      "want %lld", be->name, bf16 ? "bf16" : "float32", (long long)md.bytes_sent,
                      (long long)((bf16 ? 2 : 4) * off));
                be->device_free(ds), be->device_free(dr);
                mt_moe_dispatch_free(&md);
            }
    free(sc), free(rc), free(hs), free(hr);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mt_bf16_comm_t c;
    CHECK(mt_bf16_comm_init(&c) == MT_OK, "init: %s", mt_error_message());
    int tsize = 0;
    MPI_Type_size(c.type, &tsize);
    CHECK(tsize == 2, "the wire type is %d bytes", tsize);
    test_pack();
    test_allgather(&c);
    test_op_local(&c);
    test_sums(&c);
    test_tp_comm(mt_backend_cpu(), &c);
    test_tp_comm(mt_backend_cpu_guarded(), &c);
    test_grad_sum(mt_backend_cpu(), &c, 4099);
    test_grad_sum(mt_backend_cpu_guarded(), &c, 4099);
    if (size == 2) /* two pieces */
        test_grad_sum(mt_backend_cpu(), &c, ((int64_t)1 << 24) + 5);
    mt_bf16_comm_free(&c);
    mt_bf16_comm_free(&c); /* twice is fine */
    test_fsdp();
    test_moe_rows(mt_backend_cpu());
    test_moe_rows(mt_backend_cpu_guarded());
    int rc = mt_test_exit_mpi("test_comm_bf16", MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
