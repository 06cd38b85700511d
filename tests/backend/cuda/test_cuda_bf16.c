/* test_cuda_bf16: the bf16-numerics CUDA table (mt_backend_cuda_bf16)
 * against the CPU backend, under mp_policy.param_dtype bfloat16:
 *  - the table is the cuda one except name, matmul, attention and the
 *    entries that round (rounds_bf16 and reads_bf16: RMSNorm, RoPE,
 *    SwiGLU, the loss);
 *  - given inputs that are not bf16 values (as a GEMM leaves them), those
 *    entries write the bytes of the cuda table's entry on the rounded
 *    inputs followed by its round_bf16 pass (rstd and dw: no pass),
 *    SwiGLU's backward also in place, with a NaN among the inputs; the
 *    loss entries (cross_entropy,
 *    ce_shard_*) give the cuda table's loss, count, row max and sums from
 *    rounded logits, and its dlogits rounded (apart, in place, alone);
 *  - matmul (cuBLAS, CUBLAS_COMPUTE_32F_FAST_16BF): the four transpose
 *    combinations, beta 0 (C NaN: must not be read) and 1, odd sizes,
 *    k = 0, and two runs giving the same bytes;
 *  - attention forward/backward (tensor-core FlashAttention, each kind:
 *    mma.sync, cuda_attention_mma.cu, and WMMA, cuda_attention_tc.cu,
 *    through mt_cuda_attention_tc_select): plain causal, GQA, documents, T not a
 *    multiple of the 64-row tile, one token, head dims 64 and 128,
 *    sliding windows below, at and above the tile (with documents, and on
 *    the fp32 fallback); the
 *    backward from the CPU's out/lse (each half alone) and from the GPU's
 *    own (the chain training runs); forward and backward twice, same
 *    bytes; q, k, v, dout and out that are not bf16 values give the
 *    bytes of their bf16 values (reads_bf16); out, dq, dk and dv are
 *    bf16 values (rounded as they are stored) and exactly the unrounded
 *    kernels' (mt_cuda_attention_tc_* with round false) on the bf16
 *    values, after round_bf16; head dim 48 falls back to the
 *    fp32 kernels and must equal mt_backend_cuda()'s bits (out, dq, dk,
 *    dv) rounded by its round_bf16.
 *  - bf16 storage (mt_backend_cuda_bf16_storage): test_cuda_storage.c.
 * The bf16-storage checks are test_cuda_storage.c's (their counts come
 * back through tc_counts_t).  Exits 77 (skip) without a CUDA device (the
 * build machines): there it proves that the test builds and links.
 *
 * Bounds (normwise, max |gpu - cpu| / max |cpu|; u = 2^-8 = 3.9e-3 is
 * bf16's unit roundoff, fp32's is 6e-8):
 *  - matmul 1e-4: the products of bf16 values are exact in fp32 and the
 *    sums are fp32 (tensor-core accumulation may truncate instead of
 *    rounding: a few fp32 ulps per addition, k <= 257 here), so the
 *    difference is fp32 summation order, 1e-5-ish; 1e-4 still catches a
 *    bf16-rounded result (>= u/2 = 2e-3) or a wrong transpose (O(1));
 *  - attention out, dq, dk, dv 1.6e-2 = 4u (the rounding of the outputs
 *    as they are stored is one more u at most): P (for P V and P^T dO) and
 *    dS (for dS K and dS^T Q) are rounded to bf16, at most u relative
 *    per term; independent errors over a row's terms give ~u/sqrt(3) =
 *    2.3e-3 of the result for random inputs (the host emulation of
 *    the kernels, tests/emu/cuda, measures 1e-3 to 3.2e-3), and 4u leaves room
 *    for the tails and for cancellation in dS; a missed or extra key
 *    tile is O(1/T) of a row and larger than that at these T;
 *  - lse 1e-4: the scores and the row sum are fp32 (l adds the fp32 P);
 *  - fallback (hd 48): bitwise equal to the fp32 CUDA table and its
 *    rounding pass; against the CPU's fp32 4e-3 (out, dq, dk, dv: the
 *    fp32 kernels' 2e-5 and the rounding's u) and 2e-5 (lse).
 * Set MT_TEST_VERBOSE=1 to print every measured error. */
#include "test_cuda_kernels.h"

mt_cuda_arena_t tc_arena;
const mt_backend_t *tc_cpu, *tc_gpu;
int tc_verbose;

#define MM_TOL 1e-4
#define ATT_TOL 1.6e-2
#define LSE_TOL 1e-4

static void test_table(void)
{
    const mt_backend_t *c = mt_backend_cuda(), *b = mt_backend_cuda_bf16();
    CHECK(b != NULL && b != c, "mt_backend_cuda_bf16 is its own table");
    CHECK(strcmp(b->name, "cuda_bf16") == 0, "name %s", b->name);
    CHECK(b->rounds_bf16 && !c->rounds_bf16, "rounds_bf16: cuda %d, cuda_bf16 %d",
          c->rounds_bf16, b->rounds_bf16);
    CHECK(b->reads_bf16 && !c->reads_bf16, "reads_bf16: cuda %d, cuda_bf16 %d", c->reads_bf16,
          b->reads_bf16);
    CHECK(b->matmul != c->matmul && b->attention_forward != c->attention_forward &&
              b->attention_backward != c->attention_backward,
          "matmul and attention are replaced");
    CHECK(b->rmsnorm_forward != c->rmsnorm_forward &&
              b->rmsnorm_backward != c->rmsnorm_backward && b->rope_forward != c->rope_forward &&
              b->rope_backward != c->rope_backward && b->swiglu_forward != c->swiglu_forward &&
              b->swiglu_backward != c->swiglu_backward && b->cross_entropy != c->cross_entropy &&
              b->ce_shard_max != c->ce_shard_max && b->ce_shard_sum != c->ce_shard_sum &&
              b->ce_shard_finish != c->ce_shard_finish &&
              b->rmsnorm_rowsums != c->rmsnorm_rowsums &&
              b->rmsnorm_forward_sums != c->rmsnorm_forward_sums &&
              b->rmsnorm_backward_sums != c->rmsnorm_backward_sums,
          "the rounding entries are replaced");
    mt_backend_t x = *c, y = *b;
    x.name = y.name = NULL;
    x.matmul = y.matmul = NULL;
    x.matmul_f32out = y.matmul_f32out = NULL; /* matmul on float32 storage: checked below */
    x.matmul_add = y.matmul_add = NULL;       /* the table's matmul after a copy */
    x.attention_forward = y.attention_forward = NULL;
    x.attention_backward = y.attention_backward = NULL;
    x.rmsnorm_forward = y.rmsnorm_forward = NULL;
    x.rmsnorm_backward = y.rmsnorm_backward = NULL;
    x.rmsnorm_rowsums = y.rmsnorm_rowsums = NULL;
    x.rmsnorm_forward_sums = y.rmsnorm_forward_sums = NULL;
    x.rmsnorm_backward_sums = y.rmsnorm_backward_sums = NULL;
    x.rope_forward = y.rope_forward = NULL;
    x.rope_backward = y.rope_backward = NULL;
    x.swiglu_forward = y.swiglu_forward = NULL;
    x.swiglu_backward = y.swiglu_backward = NULL;
    x.cross_entropy = y.cross_entropy = NULL;
    x.ce_shard_max = y.ce_shard_max = NULL;
    x.ce_shard_sum = y.ce_shard_sum = NULL;
    x.ce_shard_finish = y.ce_shard_finish = NULL;
    x.rounds_bf16 = y.rounds_bf16 = false;
    x.reads_bf16 = y.reads_bf16 = false;
    CHECK(memcmp(&x, &y, sizeof x) == 0, "every other entry is the cuda table's");
    CHECK(b->matmul_f32out == b->matmul && c->matmul_f32out == c->matmul && !b->stores_bf16 &&
              !c->stores_bf16,
          "float32 storage: matmul_f32out is matmul");
}

/* the bf16 table's d_got against the cuda table's d_plain rounded by the
 * cuda table's own round_bf16 pass (d_plain is rounded in place) */
static void check_rounded(const char *what, const float *d_got, float *d_plain, int64_t n)
{
    mt_backend_cuda()->round_bf16(d_plain, n);
    float *g = tc_down(d_got, F(n)), *w = tc_down(d_plain, F(n));
    CHECK_SAME_BYTES(what, g, w, F(n));
    free(g), free(w);
}

/* a device copy of host x as the model would hand it over before the
 * roundings moved into the loads: rounded by the cuda table's pass */
static float *up_rounded(const float *x, int64_t n)
{
    float *d = tc_up(x, F(n));
    mt_backend_cuda()->round_bf16(d, n);
    return d;
}

/* RMSNorm, RoPE and SwiGLU read their activation inputs as bf16 values
 * and round in their stores: from inputs that are not bf16 values, the
 * bytes of the cuda table's kernel on the rounded inputs and then its
 * rounding pass */
static void test_rounding_entries(uint64_t *s)
{
    const mt_backend_t *c = mt_backend_cuda(), *b = tc_gpu;
    const int64_t n = 300, dim = 136, nh = 3, hd = 64, ntok = 41, ne = 70001;
    float *x = tc_rand(s, n * dim, 3.0f), *w = tc_rand(s, dim, 2.0f);
    float *dout = tc_rand(s, n * dim, 1.0f);
    x[5 * dim + 7] = NAN; /* a NaN row: NaN out, both ways */
    float *d_x = tc_up(x, F(n * dim)), *d_xr = up_rounded(x, n * dim), *d_w = tc_up(w, F(dim));
    float *d_dout = tc_up(dout, F(n * dim)), *d_doutr = up_rounded(dout, n * dim);
    float *o1 = tc_dev(F(n * dim)), *o2 = tc_dev(F(n * dim)), *r1 = tc_dev(F(n)),
          *r2 = tc_dev(F(n)), *dw1 = tc_dev(F(dim)), *dw2 = tc_dev(F(dim));
    c->rmsnorm_forward(o1, r1, d_xr, d_w, n, dim, 1e-6f);
    b->rmsnorm_forward(o2, r2, d_x, d_w, n, dim, 1e-6f);
    check_same("rmsnorm_forward rstd, bf16 table", r2, r1, n);
    check_rounded("rmsnorm_forward out, bf16 table", o2, o1, n * dim);
    /* the backward without the NaN row, whose rstd would make all of dw
     * NaN; a NaN in dout instead (one row of dx, one column of dw) */
    x[5 * dim + 7] = 1.5f;
    c->copy_to_device(d_x, x, F(n * dim));
    c->copy_to_device(d_xr, x, F(n * dim));
    c->round_bf16(d_xr, n * dim);
    c->rmsnorm_forward(o1, r1, d_xr, d_w, n, dim, 1e-6f);
    dout[9 * dim + 3] = NAN;
    c->copy_to_device(d_dout, dout, F(n * dim));
    c->copy_to_device(d_doutr, dout, F(n * dim));
    c->round_bf16(d_doutr, n * dim);
    c->zero(dw1, F(dim)), c->zero(dw2, F(dim));
    c->rmsnorm_backward(o1, dw1, d_doutr, d_xr, d_w, r1, n, dim, false);
    b->rmsnorm_backward(o2, dw2, d_dout, d_x, d_w, r1, n, dim, false);
    check_same("rmsnorm_backward dw, bf16 table", dw2, dw1, dim);
    check_rounded("rmsnorm_backward dx, bf16 table", o2, o1, n * dim);
    float *acc = tc_rand(s, n * dim, 2.0f); /* accumulating: the sum rounded once */
    float *a1 = up_rounded(acc, n * dim), *a2 = tc_up(acc, F(n * dim));
    c->rmsnorm_backward(a1, dw1, d_doutr, d_xr, d_w, r1, n, dim, true);
    b->rmsnorm_backward(a2, dw2, d_dout, d_x, d_w, r1, n, dim, true);
    check_rounded("rmsnorm_backward dx accumulated, bf16 table", a2, a1, n * dim);
    free(acc), free(dout);

    int32_t pos[41];
    for (int i = 0; i < ntok; i++)
        pos[i] = (int32_t)(tc_rng_next(s) % 9000);
    int32_t *d_pos = tc_up(pos, sizeof pos);
    /* theta 10000 forward; backward with 500000's table, its low half
     * divided by 8, and scale 1.1 */
    double *inv = malloc(sizeof(double) * (size_t)hd);
    for (int64_t i = 0; i < hd / 2; i++) {
        inv[i] = pow(10000.0, -2.0 * (double)i / (double)hd);
        inv[hd / 2 + i] = pow(500000.0, -2.0 * (double)i / (double)hd) / (2 * i < hd / 2 ? 8 : 1);
    }
    double *d_inv = tc_up(inv, sizeof(double) * (size_t)hd);
    for (int dir = 0; dir < 2; dir++) {
        float *q = tc_rand(s, ntok * nh * hd, 4.0f);
        float *q1 = up_rounded(q, ntok * nh * hd), *q2 = tc_up(q, F(ntok * nh * hd));
        if (dir == 0) {
            c->rope_forward(q1, d_pos, ntok, nh, hd, d_inv, 1.0);
            b->rope_forward(q2, d_pos, ntok, nh, hd, d_inv, 1.0);
            check_rounded("rope_forward, bf16 table", q2, q1, ntok * nh * hd);
        } else {
            c->rope_backward(q1, d_pos, ntok, nh, hd, d_inv + hd / 2, 1.1);
            b->rope_backward(q2, d_pos, ntok, nh, hd, d_inv + hd / 2, 1.1);
            check_rounded("rope_backward, bf16 table", q2, q1, ntok * nh * hd);
        }
        free(q);
    }
    free(inv);

    float *g = tc_rand(s, ne, 8.0f), *u = tc_rand(s, ne, 2.0f), *d = tc_rand(s, ne, 1.0f);
    g[ne / 2] = NAN;
    float *d_g = tc_up(g, F(ne)), *d_u = tc_up(u, F(ne)), *d_d = tc_up(d, F(ne));
    float *d_gr = up_rounded(g, ne), *d_ur = up_rounded(u, ne), *d_dr = up_rounded(d, ne);
    float *s1 = tc_dev(F(ne)), *s2 = tc_dev(F(ne)), *t1 = tc_dev(F(ne)), *t2 = tc_dev(F(ne));
    c->swiglu_forward(s1, d_gr, d_ur, ne);
    b->swiglu_forward(s2, d_g, d_u, ne);
    check_rounded("swiglu_forward, bf16 table", s2, s1, ne);
    c->swiglu_backward(s1, t1, d_dr, d_gr, d_ur, ne);
    b->swiglu_backward(s2, t2, d_d, d_g, d_u, ne);
    float *gi = tc_dev(F(ne)), *ui = tc_dev(F(ne)); /* in place, as the model runs it */
    c->copy(gi, d_g, F(ne)), c->copy(ui, d_u, F(ne));
    b->swiglu_backward(gi, ui, d_d, gi, ui, ne);
    check_same("swiglu_backward in place dgate, bf16 table", gi, s2, ne);
    check_same("swiglu_backward in place dup, bf16 table", ui, t2, ne);
    check_rounded("swiglu_backward dgate, bf16 table", s2, s1, ne);
    check_rounded("swiglu_backward dup, bf16 table", t2, t1, ne);
    free(x), free(w), free(g), free(u), free(d);
    mt_cuda_arena_reset(&tc_arena);
}

/* The loss reads its logits as bf16 values and writes its gradient
 * rounded: the cuda table's loss on pre-rounded logits, its dlogits then
 * rounded by a pass */
static void test_loss_rounding(uint64_t *s)
{
    const mt_backend_t *c = mt_backend_cuda(), *b = tc_gpu;
    const int64_t n = 37, V = 1000, vv = 990, vs = 400; /* vs: a vocabulary shard's width */
    float *l = tc_rand(s, n * V, 9.0f);
    int32_t t[37];
    for (int i = 0; i < n; i++)
        t[i] = i == 3 ? -100 : (int32_t)(tc_rng_next(s) % (uint64_t)vv);
    int32_t *d_t = tc_up(t, sizeof t);
    float *d_lr = tc_up(l, F(n * V)); /* the reference's logits: rounded first */
    c->round_bf16(d_lr, n * V);
    float *d1 = tc_dev(F(n * V)), *d2 = tc_dev(F(n * V)), *d_l = tc_up(l, F(n * V));
    int64_t c1 = -1, c2 = -2;
    double s1 = c->cross_entropy(d1, d_lr, d_t, n, V, vv, 0.5f, &c1);
    double s2 = b->cross_entropy(d2, d_l, d_t, n, V, vv, 0.5f, &c2);
    CHECK(s1 == s2 && c1 == c2, "cross_entropy, bf16 table: loss %.17g count %lld, want %.17g %lld",
          s2, (long long)c2, s1, (long long)c1);
    float *d_l3 = tc_up(l, F(n * V)); /* in place, as the model runs it */
    double s3 = b->cross_entropy(d_l3, d_l3, d_t, n, V, vv, 0.5f, &c2);
    CHECK(s3 == s1, "cross_entropy in place, bf16 table: loss %.17g, want %.17g", s3, s1);
    check_same("cross_entropy in place dlogits, bf16 table", d_l3, d2, n * V);
    c->copy(d_l3, d_l, F(n * V));
    s3 = b->cross_entropy(NULL, d_l3, d_t, n, V, vv, 0.5f, &c2);
    CHECK(s3 == s1, "cross_entropy loss alone, bf16 table: %.17g, want %.17g", s3, s1);
    check_rounded("cross_entropy dlogits, bf16 table", d2, d1, n * V);

    float *m1 = tc_dev(F(n)), *m2 = tc_dev(F(n));
    double *z1 = tc_dev((size_t)n * 8), *y1 = tc_dev((size_t)n * 8);
    double *z2 = tc_dev((size_t)n * 8), *y2 = tc_dev((size_t)n * 8);
    c->ce_shard_max(m1, d_lr, n, vs, vs - 7);
    b->ce_shard_max(m2, d_l, n, vs, vs - 7);
    check_same("ce_shard_max, bf16 table", m2, m1, n);
    c->ce_shard_sum(z1, y1, d_lr, d_t, m1, n, vs, 300, vs - 7);
    b->ce_shard_sum(z2, y2, d_l, d_t, m1, n, vs, 300, vs - 7);
    double *hz1 = tc_down(z1, (size_t)n * 8), *hz2 = tc_down(z2, (size_t)n * 8);
    double *hy1 = tc_down(y1, (size_t)n * 8), *hy2 = tc_down(y2, (size_t)n * 8);
    CHECK_SAME_BYTES("ce_shard_sum z, bf16 table", hz2, hz1, (size_t)n * 8);
    CHECK_SAME_BYTES("ce_shard_sum ly, bf16 table", hy2, hy1, (size_t)n * 8);
    s1 = c->ce_shard_finish(d1, d_lr, d_t, m1, z1, y1, n, vs, 300, vs - 7, 0.5f, &c1);
    s2 = b->ce_shard_finish(d2, d_l, d_t, m1, z1, y1, n, vs, 300, vs - 7, 0.5f, &c2);
    CHECK(s1 == s2 && c1 == c2, "ce_shard_finish, bf16 table: loss %.17g, want %.17g", s2, s1);
    c->copy(d_l3, d_l, F(n * vs)); /* in place, as the model runs it */
    s3 = b->ce_shard_finish(d_l3, d_l3, d_t, m1, z1, y1, n, vs, 300, vs - 7, 0.5f, &c2);
    CHECK(s3 == s1, "ce_shard_finish in place, bf16 table: loss %.17g, want %.17g", s3, s1);
    check_same("ce_shard_finish in place dlogits, bf16 table", d_l3, d2, n * vs);
    check_rounded("ce_shard_finish dlogits, bf16 table", d2, d1, n * vs);
    free(l), free(hz1), free(hz2), free(hy1), free(hy2);
    mt_cuda_arena_reset(&tc_arena);
}

/* every element a bf16 value (NaN aside): the kernel rounded its store */
static void check_bf16_values(const char *what, const char *tag, const float *x, int64_t n)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad += (u & 0xffffu) != 0 && !isnan(x[i]);
    }
    CHECK(bad == 0, "%s %s: %lld of %lld elements are not bf16 values", what, tag,
          (long long)bad, (long long)n);
}

static void test_matmul(uint64_t *s)
{
    const int64_t shapes[2][3] = {{67, 45, 33}, {130, 77, 257}};
    for (int sh = 0; sh < 2; sh++) {
        const int64_t m = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2];
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    float *a = rand_bf16(s, m * k, 1.0f), *b = rand_bf16(s, k * n, 1.0f);
                    float *c = rand_bf16(s, m * n, 1.0f);
                    if (!acc) /* beta 0 must not read C, even NaN */
                        for (int64_t i = 0; i < m * n; i++)
                            c[i] = NAN;
                    float *da = tc_up(a, F(m * k)), *db = tc_up(b, F(k * n));
                    float *dc = tc_up(c, F(m * n)), *dc2 = tc_up(c, F(m * n));
                    tc_cpu->matmul(c, a, b, m, n, k, ta, tb, acc ? 1.0f : 0.0f);
                    tc_gpu->matmul(dc, da, db, m, n, k, ta, tb, acc ? 1.0f : 0.0f);
                    tc_gpu->matmul(dc2, da, db, m, n, k, ta, tb, acc ? 1.0f : 0.0f);
                    float *g = tc_down(dc, F(m * n)), *g2 = tc_down(dc2, F(m * n));
                    char what[96];
                    snprintf(what, sizeof what, "matmul_fast_bf16 %lldx%lldx%lld ta=%d tb=%d b=%d",
                             (long long)m, (long long)n, (long long)k, ta, tb, acc);
                    CHECK_CLOSE(what, g, c, m * n, MM_TOL);
                    CHECK_SAME_BYTES(what, g, g2, F(m * n));
                    free(a), free(b), free(c), free(g), free(g2);
                    mt_cuda_arena_reset(&tc_arena);
                }
    }
    /* k = 0: C = beta C */
    float c[6] = {1, 2, 3, 4, 5, 6}, ref[6] = {2, 4, 6, 8, 10, 12};
    float *dc = tc_up(c, sizeof c);
    tc_gpu->matmul(dc, dc, dc, 2, 3, 0, false, false, 2.0f);
    float *g = tc_down(dc, sizeof c);
    CHECK_CLOSE("matmul_fast_bf16 k=0", g, ref, 6, 0.0);
    free(g);
    mt_cuda_arena_reset(&tc_arena);
}

static void check_att(const char *name, const char *tag, const float *got, const float *ref,
                      int64_t n, double tol)
{
    char what[256];
    snprintf(what, sizeof what, "%s %s", name, tag);
    CHECK_CLOSE_FLOOR(what, got, ref, n, tol, 1e-3); /* one token: dq = dk = 0 */
}

/* a device copy of x, one float past a 16-byte boundary when misalign */
static float *up_maybe_misaligned(const float *x, int64_t n, int misalign)
{
    if (!misalign)
        return tc_up(x, F(n));
    float *x1 = malloc(F(n + 1));
    x1[0] = 0.0f;
    memcpy(x1 + 1, x, F(n));
    float *d = (float *)tc_up(x1, F(n + 1)) + 1;
    free(x1);
    return d;
}

/* misalign: q one float past a 16-byte boundary, so the tensor-core
 * kernels take their scalar loads instead of float4 */
/* which tensor-core kernels run (test_attention), for the messages */
static const char *att_kind = "";

static void attention_case(uint64_t *s, int64_t B, int64_t T, int64_t nh, int64_t nkv,
                           int64_t hd, int docs, int misalign, int64_t W)
{
    char tag[136];
    snprintf(tag, sizeof tag, "B=%lld T=%lld nh=%lld nkv=%lld hd=%lld%s W=%lld%s%s", (long long)B,
             (long long)T, (long long)nh, (long long)nkv, (long long)hd, docs ? " docs" : "",
             (long long)W, misalign ? " scalar loads" : "", att_kind);
    if (tc_verbose)
        printf(" bf16 attention %s\n", tag);
    const bool tc = hd == 64 || hd == 128; /* else the fp32 fallback */
    const double tol = tc ? ATT_TOL : 4e-3, ltol = tc ? LSE_TOL : 2e-5;
    const int64_t nq = B * T * nh * hd, nk = B * T * nkv * hd, nl = B * nh * T;
    /* qu.. as a GEMM leaves them, q.. their bf16 values */
    float *qu = tc_rand(s, nq, 1.0f), *ku = tc_rand(s, nk, 1.0f), *vu = tc_rand(s, nk, 1.0f);
    float *doutu = tc_rand(s, nq, 1.0f);
    float *q = bf16_copy(qu, nq), *k = bf16_copy(ku, nk), *v = bf16_copy(vu, nk);
    float *dout = bf16_copy(doutu, nq);
    int32_t *doc = docs ? tc_make_docs(s, B, T) : NULL;
    if (W > 0) /* a sliding window: first visible keys (the model's) */
        doc = tc_window(doc, B, T, W);
    float *out = malloc(F(nq)), *lse = malloc(F(nl)), *dq = malloc(F(nq)), *dk = malloc(F(nk));
    float *dv = malloc(F(nk));
    tc_cpu->attention_forward(out, lse, q, k, v, doc, B, T, nh, nkv, hd);
    float *out_r = bf16_copy(out, nq); /* the backward's out: the forward's, as stored */
    tc_cpu->attention_backward(dq, dk, dv, dout, out_r, lse, q, k, v, doc, B, T, nh, nkv, hd);

    float *d_k = tc_up(k, F(nk)), *d_v = tc_up(v, F(nk));
    float *d_q = up_maybe_misaligned(q, nq, misalign);
    float *d_dout = tc_up(dout, F(nq));
    int32_t *d_doc = doc ? tc_up(doc, (size_t)(B * T) * 4) : NULL;
    float *d_out = tc_dev(F(nq)), *d_lse = tc_dev(F(nl)), *d_dq = tc_dev(F(nq));
    float *d_dk = tc_dev(F(nk)), *d_dv = tc_dev(F(nk));
    tc_gpu->attention_forward(d_out, d_lse, d_q, d_k, d_v, d_doc, B, T, nh, nkv, hd);
    /* backward from the CPU's out and lse: each half checked alone */
    float *c_out = tc_up(out_r, F(nq)), *c_lse = tc_up(lse, F(nl));
    tc_gpu->attention_backward(d_dq, d_dk, d_dv, d_dout, c_out, c_lse, d_q, d_k, d_v, d_doc, B, T,
                               nh, nkv, hd);
    float *g_out = tc_down(d_out, F(nq)), *g_lse = tc_down(d_lse, F(nl));
    float *g_dq = tc_down(d_dq, F(nq)), *g_dk = tc_down(d_dk, F(nk)), *g_dv = tc_down(d_dv, F(nk));
    check_att("bf16 attention out", tag, g_out, out, nq, tol);
    check_att("bf16 attention lse", tag, g_lse, lse, nl, ltol);
    check_att("bf16 attention dq", tag, g_dq, dq, nq, tol);
    check_att("bf16 attention dk", tag, g_dk, dk, nk, tol);
    check_att("bf16 attention dv", tag, g_dv, dv, nk, tol);
    check_bf16_values("bf16 attention out", tag, g_out, nq);
    check_bf16_values("bf16 attention dq", tag, g_dq, nq);
    check_bf16_values("bf16 attention dk", tag, g_dk, nk);
    check_bf16_values("bf16 attention dv", tag, g_dv, nk);

    /* determinism: forward and backward again, same bytes */
    char what[160];
    snprintf(what, sizeof what, "bf16 attention twice %s", tag);
    tc_gpu->attention_forward(d_out, d_lse, d_q, d_k, d_v, d_doc, B, T, nh, nkv, hd);
    tc_gpu->attention_backward(d_dq, d_dk, d_dv, d_dout, c_out, c_lse, d_q, d_k, d_v, d_doc, B, T,
                               nh, nkv, hd);
    float *h_out = tc_down(d_out, F(nq)), *h_lse = tc_down(d_lse, F(nl));
    float *h_dq = tc_down(d_dq, F(nq)), *h_dk = tc_down(d_dk, F(nk)), *h_dv = tc_down(d_dv, F(nk));
    CHECK_SAME_BYTES(what, h_out, g_out, F(nq));
    CHECK_SAME_BYTES(what, h_lse, g_lse, F(nl));
    CHECK_SAME_BYTES(what, h_dq, g_dq, F(nq));
    CHECK_SAME_BYTES(what, h_dk, g_dk, F(nk));
    CHECK_SAME_BYTES(what, h_dv, g_dv, F(nk));

    /* inputs that are not bf16 values (q, k, v, dout as their GEMMs leave
     * them, out as the CPU's fp32 forward left it): read as their bf16
     * values, the same bytes (mt_backend_t.reads_bf16) */
    snprintf(what, sizeof what, "bf16 attention from unrounded inputs %s", tag);
    float *u_q = up_maybe_misaligned(qu, nq, misalign), *u_k = tc_up(ku, F(nk));
    float *u_v = tc_up(vu, F(nk));
    float *u_dout = tc_up(doutu, F(nq)), *u_out = tc_up(out, F(nq));
    tc_gpu->attention_forward(d_out, d_lse, u_q, u_k, u_v, d_doc, B, T, nh, nkv, hd);
    tc_gpu->attention_backward(d_dq, d_dk, d_dv, u_dout, u_out, c_lse, u_q, u_k, u_v, d_doc, B, T,
                               nh, nkv, hd);
    float *uo = tc_down(d_out, F(nq)), *ul = tc_down(d_lse, F(nl)), *uq = tc_down(d_dq, F(nq));
    float *uk = tc_down(d_dk, F(nk)), *uv = tc_down(d_dv, F(nk));
    CHECK_SAME_BYTES(what, uo, g_out, F(nq));
    CHECK_SAME_BYTES(what, ul, g_lse, F(nl));
    CHECK_SAME_BYTES(what, uq, g_dq, F(nq));
    CHECK_SAME_BYTES(what, uk, g_dk, F(nk));
    CHECK_SAME_BYTES(what, uv, g_dv, F(nk));
    free(uo), free(ul), free(uq), free(uk), free(uv);
    tc_gpu->attention_forward(d_out, d_lse, d_q, d_k, d_v, d_doc, B, T, nh, nkv, hd);

    /* the chain training runs: the backward from the GPU's own out, lse */
    tc_gpu->attention_backward(d_dq, d_dk, d_dv, d_dout, d_out, d_lse, d_q, d_k, d_v, d_doc, B,
                               T, nh, nkv, hd);
    float *x_dq = tc_down(d_dq, F(nq)), *x_dk = tc_down(d_dk, F(nk)), *x_dv = tc_down(d_dv, F(nk));
    check_att("bf16 attention chain dq", tag, x_dq, dq, nq, tol);
    check_att("bf16 attention chain dk", tag, x_dk, dk, nk, tol);
    check_att("bf16 attention chain dv", tag, x_dv, dv, nk, tol);

    /* the rounding: the unrounded kernel's bytes (tensor cores) or the fp32
     * table's (the fallback), then the cuda table's round_bf16 pass */
    const mt_backend_t *f32 = mt_backend_cuda();
    if (tc) {
        mt_cuda_attention_tc_forward(d_out, d_lse, d_q, d_k, d_v, d_doc, B, T, nh, nkv, hd, false);
        mt_cuda_attention_tc_backward(d_dq, d_dk, d_dv, d_dout, c_out, c_lse, d_q, d_k, d_v,
                                      d_doc, B, T, nh, nkv, hd, false);
    } else {
        f32->attention_forward(d_out, d_lse, d_q, d_k, d_v, d_doc, B, T, nh, nkv, hd);
        f32->attention_backward(d_dq, d_dk, d_dv, d_dout, c_out, c_lse, d_q, d_k, d_v, d_doc, B,
                                T, nh, nkv, hd);
    }
    f32->round_bf16(d_out, nq);
    f32->round_bf16(d_dq, nq);
    f32->round_bf16(d_dk, nk);
    f32->round_bf16(d_dv, nk);
    float *f_out = tc_down(d_out, F(nq)), *f_dq = tc_down(d_dq, F(nq));
    float *f_dk = tc_down(d_dk, F(nk)), *f_dv = tc_down(d_dv, F(nk));
    snprintf(what, sizeof what, "bf16 attention = %s + round_bf16 %s",
             tc ? "unrounded tensor-core kernels" : "fp32 table", tag);
    CHECK_SAME_BYTES(what, f_out, g_out, F(nq));
    CHECK_SAME_BYTES(what, f_dq, g_dq, F(nq));
    CHECK_SAME_BYTES(what, f_dk, g_dk, F(nk));
    CHECK_SAME_BYTES(what, f_dv, g_dv, F(nk));
    free(f_out), free(f_dq), free(f_dk), free(f_dv);
    free(qu), free(ku), free(vu), free(doutu), free(out_r);
    free(q), free(k), free(v), free(dout), free(doc), free(out), free(lse), free(dq), free(dk);
    free(dv), free(g_out), free(g_lse), free(g_dq), free(g_dk), free(g_dv), free(h_out);
    free(h_lse), free(h_dq), free(h_dk), free(h_dv), free(x_dq), free(x_dk), free(x_dv);
    mt_cuda_arena_reset(&tc_arena);
}

static void attention_cases(uint64_t *s);

static void test_attention(uint64_t *s)
{
    /* both kinds of tensor-core kernels: mma.sync (the default), then WMMA */
    for (int kind = 1; kind >= 0; kind--) {
        mt_cuda_attention_tc_select(kind);
        att_kind = kind ? " mma" : " wmma";
        attention_cases(s);
    }
    mt_cuda_attention_tc_select(-1);
    att_kind = "";
}

static void attention_cases(uint64_t *s)
{
    attention_case(s, 2, 77, 4, 4, 64, 0, 0, 0);   /* plain causal, partial tile */
    attention_case(s, 1, 200, 8, 2, 64, 0, 0, 0);  /* GQA 4 */
    attention_case(s, 2, 150, 4, 2, 64, 1, 0, 0);  /* several documents */
    attention_case(s, 1, 1000, 4, 1, 64, 1, 0, 0); /* longer rows, GQA 4, documents */
    attention_case(s, 1, 130, 4, 1, 128, 1, 0, 0); /* hd 128 */
    attention_case(s, 2, 256, 4, 2, 128, 0, 0, 0); /* hd 128, whole tiles only */
    attention_case(s, 1, 1, 2, 2, 64, 0, 0, 0);    /* one token */
    attention_case(s, 1, 50, 4, 2, 48, 1, 0, 0);   /* hd 48: the fp32 fallback */
    attention_case(s, 1, 64, 2, 1, 128, 0, 1, 0);  /* one whole tile, scalar loads */
    attention_case(s, 1, 90, 4, 2, 64, 1, 1, 0);   /* partial tile, documents, scalar loads */
    /* sliding windows below, at and above the 64-key tiles (and the 16-key
     * fragments the warps skip), with documents, and on the fallback */
    attention_case(s, 1, 200, 4, 2, 64, 0, 0, 13);
    attention_case(s, 1, 300, 4, 1, 64, 1, 0, 64);
    attention_case(s, 1, 260, 2, 2, 128, 0, 0, 100);
    attention_case(s, 1, 90, 4, 2, 48, 0, 0, 20);
}


int main(void)
{
    tc_setup("test_cuda_bf16", mt_backend_cuda_bf16);
    uint64_t seed = 0x2545f4914f6cdd1dull;
    test_table();
    test_rounding_entries(&seed);
    test_loss_rounding(&seed);
    test_matmul(&seed);
    test_attention(&seed);
    /* test_cuda_storage.c's checks count through its returned counts */
    tc_add_counts(tc_test_storage(&seed));
    tc_teardown();
    return mt_test_exit("test_cuda_bf16");
}
