/* test_kernels_bf16: the CPU rounding table, mt_backend_cpu_bf16
 * (mt_backend.h "fused rounding").
 *
 *  - the rounding itself (mt_cpu_bf16_if, which round_bf16 and the fused
 *    kernels use) against the scalar conversion on the cases that matter:
 *    ties to even both ways, the carry into the exponent, overflow to
 *    infinity, infinities, signed zeros, subnormals, quiet and signalling
 *    NaNs (which must stay NaN), and a million random bit patterns;
 *  - each of the eight rounding entries writes exactly round_bf16 of what
 *    the plain table's entry writes, bit for bit, at 1 and 2 threads, on
 *    random inputs over a wide range of magnitudes with a NaN among them;
 *    the outputs the contract keeps in fp32 (rmsnorm's rstd and dw,
 *    attention's lse) are the plain table's bits; SwiGLU's backward also
 *    in place;
 *  - the four loss entries (cross_entropy, ce_shard_max / _sum / _finish)
 *    return and write what the plain ones do from the logits rounded, with
 *    dlogits rounded: loss, count, row max, sums and gradient bit for bit,
 *    dlogits apart and in place, and the loss alone (dlogits NULL);
 *  - adamw_bf16_copy (both tables) leaves p, m and v with adamw's bits and
 *    writes round_bf16 of the new p into the compute copy;
 *  - every other entry of the table is the plain table's (one list,
 *    backend_entries.def), so nothing else can differ; neither CPU table
 *    reads bf16 on load (reads_bf16: the model rounds in passes), and
 *    both, and a copy of one, hand MPI their memory unstaged.
 * No MPI. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu_internal.h"
#include "mt_backend.h"
#include "mt_stage.h"
#include "mt_test.h"

static const mt_backend_t *cpu, *bf;

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint64_t next_u64(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

/* sign * 2^e * [1, 2) with e in [-20, 20): outputs land in many binades */
static float wide(void)
{
    uint64_t r = next_u64();
    float m = 1.0f + (float)(r >> 41) / (float)(1 << 23);
    int e = (int)((r >> 8) % 40) - 20;
    return (r & 1 ? -1.0f : 1.0f) * ldexpf(m, e);
}

static float *fill(int64_t n, bool with_nan)
{
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = wide();
    if (with_nan)
        x[n / 3] = NAN;
    return x;
}

static float *dup_of(const float *x, int64_t n)
{
    float *y = malloc(sizeof(float) * (size_t)n);
    memcpy(y, x, sizeof(float) * (size_t)n);
    return y;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* got must be the bits of round_bf16(plain); rounded: how many elements
 * the rounding changed (so the test sees that it rounded at all) */
static void check_rounded(const char *what, const float *got, const float *plain, int64_t n,
                          int threads)
{
    float *want = dup_of(plain, n);
    cpu->round_bf16(want, n);
    int64_t bad = 0, changed = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        if (bits(got[i]) != bits(want[i]) && first < 0)
            first = i;
        bad += bits(got[i]) != bits(want[i]);
        changed += bits(want[i]) != bits(plain[i]);
    }
    CHECK(bad == 0, "%s (%d threads): %lld of %lld elements are not round_bf16 of the plain "
          "entry's (first at %lld: %08x, want %08x)", what, threads, (long long)bad, (long long)n,
          (long long)first, first < 0 ? 0 : bits(got[first]), first < 0 ? 0 : bits(want[first]));
    CHECK(changed > n / 2, "%s: rounding changed only %lld of %lld elements", what,
          (long long)changed, (long long)n);
    free(want);
}

static void check_same(const char *what, const float *got, const float *plain, int64_t n)
{
    CHECK(memcmp(got, plain, sizeof(float) * (size_t)n) == 0, "%s: not the plain entry's bits",
          what);
}

/* ------------------------------------------------------------------ the rounding */

static void test_rounding(void)
{
    static const uint32_t cases[] = {
        0x3f808000u, /* 1 + 2^-8: a tie, the even neighbour is 1 */
        0x3f818000u, /* a tie whose even neighbour is above */
        0x3f80ffffu, 0x3f807fffu, 0x3f7fffffu, /* the carry into the exponent */
        0x7f7fffffu, 0xff7fffffu, /* the largest floats round to infinity */
        0x7f7f7fffu, /* ... and just below stays finite */
        0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,
        0x00000001u, 0x807fffffu, 0x00408000u, /* subnormals */
        0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu, 0xff800001u /* NaNs */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float f;
        memcpy(&f, &cases[i], sizeof f);
        const uint32_t want = (uint32_t)mt_f32_to_bf16(f) << 16;
        const uint32_t got = bits(mt_cpu_bf16_if(f, 1));
        CHECK(got == want, "bf16 of %08x: %08x, want %08x", cases[i], got, want);
        CHECK(bits(mt_cpu_bf16_if(f, 0)) == cases[i], "unrounded %08x changed", cases[i]);
        if (isnan(f))
            CHECK(isnan(mt_cpu_bf16_if(f, 1)), "NaN %08x did not stay NaN", cases[i]);
    }
    int64_t bad = 0;
    for (int i = 0; i < 1000000; i++) {
        const uint32_t u = (uint32_t)next_u64();
        float f;
        memcpy(&f, &u, sizeof f);
        bad += bits(mt_cpu_bf16_if(f, 1)) != (uint32_t)mt_f32_to_bf16(f) << 16;
    }
    CHECK(bad == 0, "%lld random bit patterns round differently", (long long)bad);
}

/* ------------------------------------------------------------------ the entries */

/* Sizes above MT_CPU_PAR_MIN (32768 elements), so the 2-thread pass runs
 * the kernels' threaded loops. */
static void test_norm(int threads)
{
    const int64_t n = 401, dim = 96;
    float *x = fill(n * dim, true), *w = fill(dim, false), *dout = fill(n * dim, false);
    float *o1 = fill(n * dim, false), *o2 = fill(n * dim, false);
    float *r1 = fill(n, false), *r2 = fill(n, false);
    cpu->rmsnorm_forward(o1, r1, x, w, n, dim, 1e-6f);
    bf->rmsnorm_forward(o2, r2, x, w, n, dim, 1e-6f);
    check_rounded("rmsnorm_forward out", o2, o1, n * dim, threads);
    check_same("rmsnorm_forward rstd", r2, r1, n);

    /* the backward without the NaN, whose row would make all of dw NaN; a
     * NaN in dout instead (one row of dx, one column of dw) */
    x[n * dim / 3] = 1.5f;
    cpu->rmsnorm_forward(o1, r1, x, w, n, dim, 1e-6f);
    dout[9 * dim + 3] = NAN;
    float *dw1 = fill(dim, false), *dw2 = dup_of(dw1, dim);
    cpu->rmsnorm_backward(o1, dw1, dout, x, w, r1, n, dim, false);
    bf->rmsnorm_backward(o2, dw2, dout, x, w, r1, n, dim, false);
    check_rounded("rmsnorm_backward dx", o2, o1, n * dim, threads);
    check_same("rmsnorm_backward dw", dw2, dw1, dim);
    /* accumulating into a residual gradient: the sum rounded once */
    float *a1 = fill(n * dim, false), *a2 = dup_of(a1, n * dim);
    cpu->rmsnorm_backward(a1, dw1, dout, x, w, r1, n, dim, true);
    bf->rmsnorm_backward(a2, dw2, dout, x, w, r1, n, dim, true);
    check_rounded("rmsnorm_backward dx accumulated", a2, a1, n * dim, threads);
    check_same("rmsnorm_backward dw, twice", dw2, dw1, dim);
    free(x), free(w), free(dout), free(o1), free(o2), free(r1), free(r2), free(dw1), free(dw2);
    free(a1), free(a2);
}

static void test_rope(int threads)
{
    const int64_t n = 401, nh = 3, hd = 32;
    int32_t pos[401];
    for (int i = 0; i < 401; i++)
        pos[i] = (int32_t)(next_u64() % 5000);
    /* theta 10000 for the forward; 500000, its low half divided by 8 (a
     * scaled table) and scale 1.2 for the backward */
    double inv[16], inv2[16];
    for (int i = 0; i < hd / 2; i++) {
        inv[i] = pow(10000.0, -2.0 * i / (double)hd);
        inv2[i] = pow(500000.0, -2.0 * i / (double)hd) / (i < hd / 4 ? 1.0 : 8.0);
    }
    float *x1 = fill(n * nh * hd, true), *x2 = dup_of(x1, n * nh * hd);
    cpu->rope_forward(x1, pos, n, nh, hd, inv, 1.0);
    bf->rope_forward(x2, pos, n, nh, hd, inv, 1.0);
    check_rounded("rope_forward", x2, x1, n * nh * hd, threads);
    memcpy(x2, x1, sizeof(float) * (size_t)(n * nh * hd));
    cpu->rope_backward(x1, pos, n, nh, hd, inv2, 1.2);
    bf->rope_backward(x2, pos, n, nh, hd, inv2, 1.2);
    check_rounded("rope_backward", x2, x1, n * nh * hd, threads);
    free(x1), free(x2);
}

static void test_swiglu(int threads)
{
    const int64_t n = 50000; /* above MT_CPU_PAR_MIN: the threaded loop */
    float *g = fill(n, true), *u = fill(n, false), *d = fill(n, false);
    for (int64_t i = 0; i < n; i++) /* silu saturates beyond |g| ~ 100 */
        g[i] = fmodf(g[i], 30.0f);
    float *o1 = fill(n, false), *o2 = fill(n, false);
    cpu->swiglu_forward(o1, g, u, n);
    bf->swiglu_forward(o2, g, u, n);
    check_rounded("swiglu_forward", o2, o1, n, threads);

    float *dg1 = fill(n, false), *du1 = fill(n, false);
    float *dg2 = fill(n, false), *du2 = fill(n, false);
    cpu->swiglu_backward(dg1, du1, d, g, u, n);
    bf->swiglu_backward(dg2, du2, d, g, u, n);
    check_rounded("swiglu_backward dgate", dg2, dg1, n, threads);
    check_rounded("swiglu_backward dup", du2, du1, n, threads);
    /* in place, as the model runs it: gate and up become their gradients */
    float *gi = dup_of(g, n), *ui = dup_of(u, n);
    bf->swiglu_backward(gi, ui, d, gi, ui, n);
    check_same("swiglu_backward in place dgate", gi, dg2, n);
    check_same("swiglu_backward in place dup", ui, du2, n);
    free(g), free(u), free(d), free(o1), free(o2), free(dg1), free(du1), free(dg2), free(du2);
    free(gi), free(ui);
}

static void test_attention(int threads)
{
    const int64_t B = 2, T = 24, nh = 4, nkv = 2, hd = 16, nq = B * T * nh * hd,
                  nk = B * T * nkv * hd;
    float *q = fill(nq, false), *k = fill(nk, false), *v = fill(nk, false),
          *dout = fill(nq, false);
    for (int64_t i = 0; i < nq; i++) /* scores of moderate size: a softmax worth the name */
        q[i] = fmodf(q[i], 2.0f);
    for (int64_t i = 0; i < nk; i++)
        k[i] = fmodf(k[i], 2.0f);
    int32_t doc[48];
    for (int64_t i = 0; i < B * T; i++)
        doc[i] = (int32_t)(i % T < 10 ? 0 : 10); /* two documents per row */
    float *o1 = fill(nq, false), *o2 = fill(nq, false), *l1 = fill(B * nh * T, false),
          *l2 = fill(B * nh * T, false);
    cpu->attention_forward(o1, l1, q, k, v, doc, B, T, nh, nkv, hd);
    bf->attention_forward(o2, l2, q, k, v, doc, B, T, nh, nkv, hd);
    check_rounded("attention_forward out", o2, o1, nq, threads);
    check_same("attention_forward lse", l2, l1, B * nh * T);

    float *dq1 = fill(nq, false), *dk1 = fill(nk, false), *dv1 = fill(nk, false);
    float *dq2 = fill(nq, false), *dk2 = fill(nk, false), *dv2 = fill(nk, false);
    cpu->attention_backward(dq1, dk1, dv1, dout, o1, l1, q, k, v, NULL, B, T, nh, nkv, hd);
    bf->attention_backward(dq2, dk2, dv2, dout, o1, l1, q, k, v, NULL, B, T, nh, nkv, hd);
    check_rounded("attention_backward dq", dq2, dq1, nq, threads);
    check_rounded("attention_backward dk", dk2, dk1, nk, threads);
    check_rounded("attention_backward dv", dv2, dv1, nk, threads);
    free(q), free(k), free(v), free(dout), free(o1), free(o2), free(l1), free(l2);
    free(dq1), free(dk1), free(dv1), free(dq2), free(dk2), free(dv2);
}

/* the plain loss on rounded logits, its gradient rounded after */
static void test_loss(int threads)
{
    const int64_t n = 61, V = 700, v_valid = 650, vl = 3, V2 = 560; /* V2: a TP shard */
    float *l = fill(n * V, false);
    for (int64_t i = 0; i < n * V; i++)
        l[i] = fmodf(l[i], 12.0f);
    int32_t t[61];
    for (int i = 0; i < n; i++)
        t[i] = i == 4 ? -100 : (int32_t)(next_u64() % (uint64_t)v_valid);
    float *lr = dup_of(l, n * V); /* the reference's logits, rounded */
    cpu->round_bf16(lr, n * V);
    float *d1 = fill(n * V, false), *d2 = fill(n * V, false);
    int64_t c1 = -1, c2 = -1;
    double s1 = cpu->cross_entropy(d1, lr, t, n, V, v_valid, 0.25f, &c1);
    float *l2 = dup_of(l, n * V);
    double s2 = bf->cross_entropy(d2, l2, t, n, V, v_valid, 0.25f, &c2);
    CHECK(s1 == s2 && c1 == c2, "cross_entropy (%d threads): loss %.17g count %lld, want %.17g "
          "%lld", threads, s2, (long long)c2, s1, (long long)c1);
    check_rounded("cross_entropy dlogits", d2, d1, n * V, threads);
    float *l3 = dup_of(l, n * V); /* in place, as the model runs it */
    double s3 = bf->cross_entropy(l3, l3, t, n, V, v_valid, 0.25f, &c2);
    CHECK(s3 == s1, "cross_entropy in place: loss %.17g, want %.17g", s3, s1);
    check_same("cross_entropy in place dlogits", l3, d2, n * V);
    memcpy(l3, l, sizeof(float) * (size_t)(n * V));
    s3 = bf->cross_entropy(NULL, l3, t, n, V, v_valid, 0.25f, &c2);
    CHECK(s3 == s1, "cross_entropy, loss alone: %.17g, want %.17g", s3, s1);

    /* a vocabulary shard: columns [vl * 100, +V2) of a V2-wide layout */
    float *a = fill(n * V2, false), *mx1 = fill(n, false), *mx2 = fill(n, false);
    for (int64_t i = 0; i < n * V2; i++)
        a[i] = fmodf(a[i], 12.0f);
    float *ar = dup_of(a, n * V2), *a2 = dup_of(a, n * V2);
    cpu->round_bf16(ar, n * V2);
    double z1[61], y1[61], z2[61], y2[61];
    cpu->ce_shard_max(mx1, ar, n, V2, V2 - 20);
    bf->ce_shard_max(mx2, a2, n, V2, V2 - 20);
    check_same("ce_shard_max", mx2, mx1, n);
    memcpy(a2, a, sizeof(float) * (size_t)(n * V2));
    cpu->ce_shard_sum(z1, y1, ar, t, mx1, n, V2, vl * 100, V2 - 20);
    bf->ce_shard_sum(z2, y2, a2, t, mx1, n, V2, vl * 100, V2 - 20);
    CHECK(memcmp(z1, z2, sizeof z1) == 0 && memcmp(y1, y2, sizeof y1) == 0,
          "ce_shard_sum (%d threads): sums differ", threads);
    float *e1 = fill(n * V2, false), *e2 = fill(n * V2, false);
    memcpy(a2, a, sizeof(float) * (size_t)(n * V2));
    s1 = cpu->ce_shard_finish(e1, ar, t, mx1, z1, y1, n, V2, vl * 100, V2 - 20, 0.5f, &c1);
    s2 = bf->ce_shard_finish(e2, a2, t, mx1, z1, y1, n, V2, vl * 100, V2 - 20, 0.5f, &c2);
    CHECK(s1 == s2 && c1 == c2, "ce_shard_finish: loss %.17g, want %.17g", s2, s1);
    check_rounded("ce_shard_finish dlogits", e2, e1, n * V2, threads);
    memcpy(a2, a, sizeof(float) * (size_t)(n * V2)); /* in place, as the model runs it */
    s2 = bf->ce_shard_finish(a2, a2, t, mx1, z1, y1, n, V2, vl * 100, V2 - 20, 0.5f, &c2);
    CHECK(s1 == s2, "ce_shard_finish in place: loss %.17g, want %.17g", s2, s1);
    check_same("ce_shard_finish in place dlogits", a2, e2, n * V2);
    free(l), free(lr), free(d1), free(d2), free(l2), free(l3), free(a), free(mx1), free(mx2);
    free(ar), free(a2), free(e1), free(e2);
}

/* adamw_bf16_copy: adamw's bits in p, m, v, and round_bf16 of p in work */
static void test_adamw_copy(int threads)
{
    const int64_t n = 70001;
    float *p = fill(n, false), *g = fill(n, false), *m = fill(n, false), *v = fill(n, false);
    for (int64_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    float *p2 = dup_of(p, n), *m2 = dup_of(m, n), *v2 = dup_of(v, n), *w = fill(n, false);
    cpu->adamw(p, g, 1.0f, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 9);
    bf->adamw_bf16_copy(p2, w, g, 1.0f, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 9);
    check_same("adamw_bf16_copy p", p2, p, n);
    check_same("adamw_bf16_copy m", m2, m, n);
    check_same("adamw_bf16_copy v", v2, v, n);
    check_rounded("adamw_bf16_copy work", w, p, n, threads);
    free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2), free(w);
}

/* every entry that does not round is the plain table's own function */
static void test_table(void)
{
    CHECK(strcmp(bf->name, "cpu_bf16") == 0, "name %s", bf->name);
    CHECK(bf->rounds_bf16 && !cpu->rounds_bf16, "rounds_bf16: cpu %d, cpu_bf16 %d",
          cpu->rounds_bf16, bf->rounds_bf16);
    /* the CPU's model rounds GEMM outputs in passes (mt_backend.h) */
    CHECK(!bf->reads_bf16 && !cpu->reads_bf16, "reads_bf16: cpu %d, cpu_bf16 %d",
          cpu->reads_bf16, bf->reads_bf16);
    /* MPI takes the CPU tables' memory as it is, a copy's too (the trainer's
     * MESHTRAIN_BF16_PASSES table), not the guarded table's */
    mt_backend_t copy = *bf;
    copy.rounds_bf16 = false;
    CHECK(!mt_stage_needed(cpu) && !mt_stage_needed(bf) && !mt_stage_needed(&copy) &&
              mt_stage_needed(mt_backend_cpu_guarded()),
          "mt_stage_needed: cpu %d cpu_bf16 %d copy %d guarded %d", mt_stage_needed(cpu),
          mt_stage_needed(bf), mt_stage_needed(&copy), mt_stage_needed(mt_backend_cpu_guarded()));
    static const char *const rounding[] = {
        "rmsnorm_forward", "rmsnorm_backward", "rope_forward",  "rope_backward",
        "swiglu_forward",  "swiglu_backward",  "attention_forward", "attention_backward",
        "cross_entropy",   "ce_shard_max",     "ce_shard_sum",  "ce_shard_finish",
        "rmsnorm_forward_sums", "rmsnorm_backward_sums"};
    int nround = 0;
#define ENTRY(name)                                                                        \
    do {                                                                                   \
        bool r = false;                                                                    \
        for (size_t i = 0; i < sizeof rounding / sizeof rounding[0]; i++)                  \
            r = r || strcmp(rounding[i], #name) == 0;                                      \
        nround += r;                                                                       \
        CHECK(bf->name != NULL, #name " is empty");                                        \
        CHECK(r ? bf->name != cpu->name : bf->name == cpu->name,                           \
              #name ": %s the plain table's", r ? "should not be" : "should be");          \
    } while (0);
#define MT_BACKEND_VOID(name, ...) ENTRY(name)
#define MT_BACKEND_DOUBLE(name, ...) ENTRY(name)
#include "backend_entries.def"
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE
#undef ENTRY
    CHECK(nround == 14, "%d rounding entries listed in backend_entries.def, want 14", nround);
    CHECK(bf->device_alloc == cpu->device_alloc && bf->device_free == cpu->device_free,
          "device memory differs from the plain table's");
}

int main(void)
{
    cpu = mt_backend_cpu();
    bf = mt_backend_cpu_bf16();
    test_rounding();
    test_table();
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        test_norm(threads);
        test_rope(threads);
        test_swiglu(threads);
        test_attention(threads);
        test_loss(threads);
        test_adamw_copy(threads);
    }
    return mt_test_exit("test_kernels_bf16");
}
