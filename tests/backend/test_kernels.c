/* test_kernels: every kernel of the CPU backend (mt_backend_cpu) against a
 * naive double-precision reference written here, backward kernels also
 * against central finite differences of their forward, plus the contract's
 * side rules: accumulate vs overwrite, aliasing, ignore_index and padding,
 * and determinism.  No MPI.
 *
 * Tolerances.  Errors are measured NORMWISE: max_i |got_i - ref_i| divided
 * by max_i |ref_i| (elementwise relative error is meaningless for entries
 * that cancel to ~0).  fp32 unit roundoff is u = 6e-8.
 *  - forward and elementwise kernels vs the double reference: 2e-6 (a few
 *    u times the depth of the short sums involved; measured <= 3.5e-7)
 *    except matmul, checked per element against the standard bound
 *    |c - ref| <= 2 (k+1) u sum_k |a||b| (+ |beta c|), and sum_squares
 *    against (n+1) * 1.2e-16 relative (double sums of exact float squares);
 *  - attention and RMSNorm backward vs the analytic double reference: 1e-5
 *    (they chain two or three fp32 reductions; measured <= 8e-7);
 *  - the AdamW step p_new - p: 1e-4 (a 1e-3 step read off floats near 1
 *    resolves only 6e-8 / 1e-3 = 6e-5; measured 9e-6);
 *  - finite differences: L = sum(forward(x) * R) is evaluated in double
 *    from the fp32 forward, with h = 1e-2 on O(1) inputs.  The error of
 *    (L(x+h) - L(x-h)) / 2h is the truncation h^2/6 |L'''| ~ 2e-5 plus the
 *    rounding noise ~ sqrt(N) u |L| / h ~ 1e-5 for our N <= 1000 outputs,
 *    so we require 2e-3 normwise over the sampled entries (measured
 *    <= 7e-5): loose enough for fp32, tight enough that a missing term,
 *    a wrong scale or a transposed index (all O(1) errors) fails.
 * Set MT_TEST_VERBOSE=1 to print every measured error.
 *
 * Determinism: each kernel runs twice at 2 threads and must give the same
 * bytes; all but matmul (OpenBLAS owns its threads) must also give the same
 * bytes at 1 and 3 threads, which the CPU backend guarantees.  Violated
 * preconditions must abort with the kernel's name (in a forked child).
 * Shapes are small; the whole program runs in well under a second.
 * Attention and the cross-entropy (the softmax kernels) are in
 * test_kernels_softmax.c, RMSNorm, RoPE and SwiGLU (the layer kernels)
 * in test_kernels_layers.c, with the same tolerances and helpers
 * (test_kernels.h). */
#include "test_kernels.h"

/* ------------------------------------------------------------------ exp */

static void test_expf(void)
{
    double worst = 0.0;
    float wx = 0.0f;
    for (int i = 0; i <= 200000; i++) {
        const float x = -87.0f + 175.0f * (float)i / 200000.0f;
        const double e = exp((double)x);
        const double r = fabs((double)mt_cpu_expf(x) - e) / e;
        if (r > worst) {
            worst = r;
            wx = x;
        }
    }
    if (verbose)
        printf("  mt_cpu_expf max relative error %.3g (tol %.2g = 2 ulp)\n", worst,
               2.0 * 1.1920929e-7);
    CHECK(worst <= 2.0 * 1.1920929e-7, "mt_cpu_expf: relative error %.3g at x=%g > 2 ulp", worst,
          wx);
    CHECK(mt_cpu_expf(0.0f) == 1.0f, "exp(0) = %.9g", mt_cpu_expf(0.0f));
    CHECK(mt_cpu_expf(-INFINITY) == 0.0f && mt_cpu_expf(-100.0f) == 0.0f, "underflow not 0");
    CHECK(isinf(mt_cpu_expf(INFINITY)) && isinf(mt_cpu_expf(100.0f)), "overflow not inf");
    CHECK(isnan(mt_cpu_expf(NAN)), "exp(NaN) not NaN");
}

/* ------------------------------------------------------------------ matmul */

typedef struct {
    float *c, *a, *b;
    int64_t m, n, k;
    bool ta, tb;
} mm_ctx_t;

static void mm_run(void *p)
{
    mm_ctx_t *x = p;
    be->matmul(x->c, x->a, x->b, x->m, x->n, x->k, x->ta, x->tb, 0.0f);
}

static void test_matmul(void)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 48, 40}, {3, 130, 9}};
    const float betas[] = {0.0f, 1.0f, 0.5f};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 4; tr++)
            for (int bi = 0; bi < 3; bi++) {
                const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                const bool ta = tr & 1, tb = tr & 2;
                const float beta = betas[bi];
                float *a = frand(m * k, 1.0), *b = frand(k * n, 1.0), *c = frand(m * n, 1.0);
                float *c0 = fcopy(c, m * n);
                if (beta == 0.0f) /* overwrite: whatever C held must not leak in */
                    ffill(c, m * n, NAN);
                be->matmul(c, a, b, m, n, k, ta, tb, beta);
                int bad = 0;
                int64_t wi = 0;
                double werr = 0.0, wbound = 0.0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double ref = beta == 0.0f ? 0.0 : (double)beta * c0[i * n + j];
                        double bound = fabs(ref);
                        for (int64_t l = 0; l < k; l++) {
                            const double av = ta ? a[l * m + i] : a[i * k + l];
                            const double bv = tb ? b[j * k + l] : b[l * n + j];
                            ref += av * bv;
                            bound += fabs(av * bv);
                        }
                        bound *= 2.0 * (double)(k + 1) * 5.9604645e-8;
                        const double err = fabs((double)c[i * n + j] - ref);
                        if (!(err <= bound)) {
                            bad++;
                            wi = i * n + j;
                            werr = err;
                            wbound = bound;
                        }
                    }
                CHECK(bad == 0,
                      "matmul m=%lld n=%lld k=%lld ta=%d tb=%d beta=%g: %d elements outside the "
                      "error bound (e.g. [%lld] err %.3g > %.3g)",
                      (long long)m, (long long)n, (long long)k, ta, tb, beta, bad, (long long)wi,
                      werr, wbound);
                free(a), free(b), free(c), free(c0);
            }

    /* k = 0: C = beta C */
    float c[6] = {1, 2, 3, 4, 5, 6}, dummy = 0.0f;
    be->matmul(c, &dummy, &dummy, 2, 3, 0, false, false, 0.5f);
    CHECK(c[0] == 0.5f && c[5] == 3.0f, "matmul k=0 beta=0.5: c = %g .. %g", c[0], c[5]);
    be->matmul(c, &dummy, &dummy, 2, 3, 0, false, false, 0.0f);
    CHECK(c[0] == 0.0f && c[5] == 0.0f, "matmul k=0 beta=0 did not zero C");

    /* matmul_add: c = r + a b, the bits of r copied into c and a beta-1
     * matmul; in place (c == r) too, and k = 0 (c = r) */
    {
        const int64_t m = 7, n = 9, k = 5;
        float *a = frand(m * k, 1.0), *b = frand(n * k, 1.0), *r = frand(m * n, 1.0);
        float *c1 = fnew(m * n), *c2 = fnew(m * n), *c3 = fnew(m * n);
        memcpy(c1, r, sizeof(float) * (size_t)(m * n));
        be->matmul(c1, a, b, m, n, k, false, true, 1.0f);
        be->matmul_add(c2, r, a, b, m, n, k, false, true);
        memcpy(c3, r, sizeof(float) * (size_t)(m * n));
        be->matmul_add(c3, c3, a, b, m, n, k, false, true);
        CHECK(!memcmp(c1, c2, sizeof(float) * (size_t)(m * n)) &&
                  !memcmp(c1, c3, sizeof(float) * (size_t)(m * n)),
              "matmul_add: not the bits of a copy and a beta-1 matmul (or not in place)");
        be->matmul_add(c2, r, a, b, m, n, 0, false, true);
        CHECK(!memcmp(c2, r, sizeof(float) * (size_t)(m * n)), "matmul_add k=0: c is not r");
        free(a), free(b), free(r), free(c1), free(c2), free(c3);
    }

    mm_ctx_t x = {.m = 96, .n = 80, .k = 72, .ta = false, .tb = true};
    x.a = frand(x.m * x.k, 1.0);
    x.b = frand(x.n * x.k, 1.0);
    x.c = fnew(x.m * x.n);
    det_outs_t o = {{x.c}, {(size_t)(x.m * x.n) * sizeof(float)}, 1};
    check_deterministic("matmul", mm_run, &x, &o, 0);
    free(x.a), free(x.b), free(x.c);
}

/* ------------------------------------------------------------------ add, scale, sum_squares */

typedef struct {
    const float *x;
    int64_t n;
    double r;
} ss_ctx_t;

static void ss_run(void *p)
{
    ss_ctx_t *c = p;
    c->r = be->sum_squares(c->x, c->n);
}

static void test_elementwise(void)
{
    const int64_t sizes[] = {0, 1, 7, 1000, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        float *x = frand(n, 2.0), *y = frand(n, 2.0), *y0 = fcopy(y, n);
        int bad = 0;
        omp_set_num_threads(2);
        be->add(y, x, n);
        for (int64_t i = 0; i < n; i++)
            bad += y[i] != y0[i] + x[i];
        CHECK(bad == 0, "add n=%lld: %d elements differ from y + x", (long long)n, bad);
        memcpy(y, y0, (size_t)n * sizeof(float));
        be->scale(y, -0.375f, n);
        bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += y[i] != y0[i] * -0.375f;
        CHECK(bad == 0, "scale n=%lld: %d elements differ from x * s", (long long)n, bad);
        /* bf16 storage: to_bf16 rounds as round_bf16 does, from_bf16 is
         * exact, so the round trip is round_bf16 and a bf16 value survives */
        uint16_t *h = malloc(sizeof *h * (size_t)(n + 1));
        memcpy(y, x, (size_t)n * sizeof(float));
        be->round_bf16(y, n);
        be->to_bf16(h, x, n);
        be->from_bf16(y0, h, n);
        bad = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &y[i], 4);
            bad += memcmp(&y0[i], &y[i], 4) != 0 || (u & 0xffffu) != 0 || h[i] != u >> 16;
        }
        CHECK(bad == 0, "to_bf16/from_bf16 n=%lld: %d elements are not round_bf16's", (long long)n,
              bad);
        omp_set_num_threads(1);
        free(x), free(y), free(y0), free(h);
    }
    { /* ties to even, a carry into the exponent, and a value of 1 + 2^-9 */
        const uint32_t in[4] = {0x3f808000u, 0x3f818000u, 0x3f7fffffu, 0x3f804000u};
        const uint16_t want[4] = {0x3f80, 0x3f82, 0x3f80, 0x3f80};
        float f[4];
        uint16_t h[4];
        memcpy(f, in, sizeof f);
        be->to_bf16(h, f, 4);
        for (int i = 0; i < 4; i++)
            CHECK(h[i] == want[i], "to_bf16(0x%08x) = 0x%04x, want 0x%04x", in[i], h[i], want[i]);
    }

    const int64_t ss_sizes[] = {0, 1, 5, 16384, 16385, 300007, 5000000};
    for (size_t s = 0; s < sizeof ss_sizes / sizeof ss_sizes[0]; s++) {
        const int64_t n = ss_sizes[s];
        float *x = frand(n, 3.0);
        double ref = 0.0;
        for (int64_t i = 0; i < n; i++)
            ref += (double)x[i] * x[i]; /* products of floats are exact in double */
        const double got = be->sum_squares(x, n);
        const double tol = (double)(n + 1) * 1.2e-16 * ref;
        CHECK(fabs(got - ref) <= tol, "sum_squares n=%lld: %.17g vs %.17g", (long long)n, got,
              ref);
        if (n == 300007) {
            ss_ctx_t c = {x, n, 0.0};
            det_outs_t o = {{&c.r}, {sizeof c.r}, 1};
            check_deterministic("sum_squares", ss_run, &c, &o, 1);
        }
        free(x);
    }
}

/* ------------------------------------------------------------------ AdamW */

typedef struct {
    float *p, *m, *v;
    const float *p0, *m0, *v0, *g;
    int64_t n;
} adam_ctx_t;

static void adam_run(void *q)
{
    adam_ctx_t *c = q;
    memcpy(c->p, c->p0, (size_t)c->n * sizeof(float));
    memcpy(c->m, c->m0, (size_t)c->n * sizeof(float));
    memcpy(c->v, c->v0, (size_t)c->n * sizeof(float));
    be->adamw(c->p, c->g, 1.0f, c->m, c->v, c->n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7);
}

static void test_adamw(void)
{
    /* hand-computed (exact decimal arithmetic of the formula in mt_backend.h) */
    {
        float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -3e-3f}, m[2] = {0, 0}, v[2] = {0, 0};
        be->adamw(p, g, 1.0f, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
        CHECK(fabs(p[0] - 0.899000002) <= 1e-7 && fabs(p[1] - -1.898000333) <= 2e-7,
              "adamw t=1: p = %.9g %.9g, want 0.899000002 -1.898000333", p[0], p[1]);
        /* m and v carry float's b1, b2: 1 - 0.999f = 9.9998713e-4, not 1e-3 */
        const double m0 = (1.0 - (double)0.9f) * 0.5, m1 = (1.0 - (double)0.9f) * (double)-3e-3f;
        const double v0 = (1.0 - (double)0.999f) * 0.25,
                     v1 = (1.0 - (double)0.999f) * (double)-3e-3f * (double)-3e-3f;
        CHECK(fabs(m[0] - m0) <= 1e-6 * fabs(m0) && fabs(m[1] - m1) <= 1e-6 * fabs(m1),
              "adamw t=1: m = %.9g %.9g, want %.9g %.9g", m[0], m[1], m0, m1);
        CHECK(fabs(v[0] - v0) <= 1e-6 * v0 && fabs(v[1] - v1) <= 1e-6 * v1,
              "adamw t=1: v = %.9g %.9g, want %.9g %.9g", v[0], v[1], v0, v1);
    }
    {
        float p[2] = {0.5f, -0.25f}, g[2] = {0.2f, -0.05f}, m[2] = {0.1f, 0.02f},
              v[2] = {0.01f, 0.004f};
        be->adamw(p, g, 1.0f, m, v, 2, 1e-3f, 0.9f, 0.99f, 1e-6f, 0.1f, 3);
        CHECK(fabs(p[0] - 0.499260730) <= 1e-7 && fabs(p[1] - -0.250105962) <= 1e-7,
              "adamw t=3: p = %.9g %.9g, want 0.499260730 -0.250105962", p[0], p[1]);
        CHECK(fabs(m[0] - 0.11) <= 2e-6 * 0.11 && fabs(m[1] - 0.013) <= 2e-6 * 0.013,
              "adamw t=3: m = %.9g %.9g, want 0.11 0.013", m[0], m[1]);
        CHECK(fabs(v[0] - 0.0103) <= 2e-6 * 0.0103 && fabs(v[1] - 0.003985) <= 2e-6 * 0.003985,
              "adamw t=3: v = %.9g %.9g, want 0.0103 0.003985", v[0], v[1]);
    }
    /* random vector against the double formula, and determinism */
    const int64_t n = 70001;
    adam_ctx_t c = {.n = n};
    c.p0 = frand(n, 1.0);
    c.g = frand(n, 0.1);
    c.m0 = frand(n, 0.01);
    float *v0 = frand(n, 1e-3);
    for (int64_t i = 0; i < n; i++)
        v0[i] = fabsf(v0[i]);
    c.v0 = v0;
    c.p = fnew(n), c.m = fnew(n), c.v = fnew(n);
    adam_run(&c);
    double *rp = dnew(n), *rm = dnew(n), *rv = dnew(n);
    const double bc1 = 1 - pow(0.9f, 7), bc2 = 1 - pow(0.95f, 7);
    for (int64_t i = 0; i < n; i++) {
        const double g = c.g[i];
        rm[i] = 0.9f * (double)c.m0[i] + (1 - 0.9f) * g;
        rv[i] = 0.95f * (double)c.v0[i] + (1 - 0.95f) * g * g;
        const double upd = rm[i] / bc1 / (sqrt(rv[i] / bc2) + 1e-8f);
        rp[i] = c.p0[i] - (double)1e-3f * (upd + (double)0.1f * c.p0[i]);
        rp[i] -= c.p0[i]; /* compare the step, not p, so the tolerance means something */
    }
    float *step = fnew(n);
    for (int64_t i = 0; i < n; i++)
        step[i] = c.p[i] - c.p0[i];
    check_close("adamw step vs double formula (t=7)", step, rp, n, 1e-4);
    check_close("adamw m", c.m, rm, n, 2e-6);
    check_close("adamw v", c.v, rv, n, 2e-6);
    const size_t nb = (size_t)n * sizeof(float);
    det_outs_t o = {{c.p, c.m, c.v}, {nb, nb, nb}, 3};
    check_deterministic("adamw", adam_run, &c, &o, 1);
    /* gscale (clipping): the bits of scaling the gradient first; g unchanged */
    {
        float *p1 = fcopy(c.p0, n), *m1 = fcopy(c.m0, n), *v1 = fcopy(c.v0, n);
        float *p2 = fcopy(c.p0, n), *m2 = fcopy(c.m0, n), *v2 = fcopy(c.v0, n);
        float *gs = fcopy(c.g, n), *g0 = fcopy(c.g, n);
        be->scale(gs, 0.37f, n);
        be->adamw(p1, gs, 1.0f, m1, v1, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7);
        be->adamw(p2, c.g, 0.37f, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7);
        CHECK(memcmp(p1, p2, nb) == 0 && memcmp(m1, m2, nb) == 0 && memcmp(v1, v2, nb) == 0,
              "adamw gscale 0.37: not the bits of scale then adamw");
        CHECK(memcmp(g0, c.g, nb) == 0, "adamw gscale changed the stored gradient");
        free(p1), free(m1), free(v1), free(p2), free(m2), free(v2), free(gs), free(g0);
    }
    free((void *)c.p0), free((void *)c.g), free((void *)c.m0), free(v0);
    free(c.p), free(c.m), free(c.v), free(rp), free(rm), free(rv), free(step);
}

/* ------------------------------------------------------------------ embedding */

typedef struct {
    float *out, *dtable, *table, *dout, *R;
    int32_t *tok;
    int64_t n, V, dim;
} emb_ctx_t;

static void emb_run(void *p)
{
    emb_ctx_t *c = p;
    be->embedding_forward(c->out, c->tok, c->table, c->n, c->dim);
    ffill(c->dtable, c->V * c->dim, 1.0f);
    be->embedding_backward(c->dtable, c->dout, c->tok, c->n, c->dim);
}

static double emb_loss(void *p)
{
    emb_ctx_t *c = p;
    be->embedding_forward(c->out, c->tok, c->table, c->n, c->dim);
    double l = 0.0;
    for (int64_t i = 0; i < c->n * c->dim; i++)
        l += (double)c->out[i] * c->R[i];
    return l;
}

static void test_embedding(void)
{
    const int64_t cfg[][3] = {{1, 1, 1}, {13, 5, 7}, {300, 11, 130}}; /* n, V, dim */
    for (size_t s = 0; s < sizeof cfg / sizeof cfg[0]; s++) {
        emb_ctx_t c = {.n = cfg[s][0], .V = cfg[s][1], .dim = cfg[s][2]};
        const int64_t n = c.n, V = c.V, dim = c.dim;
        c.tok = malloc((size_t)n * sizeof(int32_t));
        for (int64_t i = 0; i < n; i++)
            c.tok[i] = (int32_t)irand(V); /* repeats: V < n */
        c.table = frand(V * dim, 1.0);
        c.dout = frand(n * dim, 1.0);
        c.R = c.dout;
        c.out = fnew(n * dim);
        c.dtable = fnew(V * dim);
        emb_run(&c);
        int bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += memcmp(c.out + i * dim, c.table + (int64_t)c.tok[i] * dim,
                          (size_t)dim * sizeof(float)) != 0;
        CHECK(bad == 0, "embedding_forward n=%lld dim=%lld: %d rows are not the table rows",
              (long long)n, (long long)dim, bad);
        /* backward: dtable (pre-filled with 1) += rows in token order, bit for bit */
        float *ref = fnew(V * dim);
        ffill(ref, V * dim, 1.0f);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < dim; j++)
                ref[(int64_t)c.tok[i] * dim + j] += c.dout[i * dim + j];
        CHECK(memcmp(ref, c.dtable, (size_t)(V * dim) * sizeof(float)) == 0,
              "embedding_backward n=%lld dim=%lld: not the token-order sum added to the "
              "pre-filled 1.0",
              (long long)n, (long long)dim);
        /* finite differences of L = sum(out R) over the table */
        float *grad = fnew(V * dim);
        for (int64_t i = 0; i < V * dim; i++)
            grad[i] = c.dtable[i] - 1.0f;
        check_fd("embedding_backward fd", c.table, V * dim, grad, emb_loss, &c, 24, 1e-2, 0.0);
        if (s == 2) {
            det_outs_t o = {{c.out, c.dtable},
                            {(size_t)(n * dim) * sizeof(float), (size_t)(V * dim) * sizeof(float)},
                            2};
            check_deterministic("embedding", emb_run, &c, &o, 1);
        }
        free(c.tok), free(c.table), free(c.dout), free(c.out), free(c.dtable), free(ref),
            free(grad);
    }
}

/* ------------------------------------------------------------------ preconditions */

/* Kernels cannot return an error: a violated precondition must stop the
 * process (SIGABRT) with a message naming the kernel.  Each case runs in a
 * child process. */
static void expect_abort(const char *what, const char *needle, void (*fn)(void))
{
    int fds[2];
    if (pipe(fds) != 0) {
        CHECK(0, "pipe failed");
        return;
    }
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        alarm(10);
        fn();
        _exit(0); /* the kernel returned: the precondition was not enforced */
    }
    close(fds[1]);
    char msg[1024] = "";
    size_t len = 0;
    ssize_t got;
    while (len + 1 < sizeof msg && (got = read(fds[0], msg + len, sizeof msg - 1 - len)) > 0)
        len += (size_t)got;
    msg[len] = '\0';
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "%s: child did not abort (status %d)", what,
          st);
    CHECK_CONTAINS(msg, needle);
}

static void bad_target(void)
{
    float logits[4] = {0, 1, 2, 3};
    const int32_t tgt[1] = {3}; /* v_valid = 3: column 3 is padding */
    int64_t cnt;
    be->cross_entropy(NULL, logits, tgt, 1, 4, 3, 1.0f, &cnt);
}

static void bad_token(void)
{
    float table[4] = {0}, out[2];
    const int32_t tok[1] = {-2};
    be->embedding_forward(out, tok, table, 1, 2);
}

static void bad_gqa(void)
{
    float buf[64] = {0};
    be->attention_forward(buf, buf, buf, buf, buf, NULL, 1, 1, 3, 2, 8);
}

static void bad_doc_start(void)
{
    float q[16] = {0}, k[16] = {0}, v[16] = {0}, out[16], lse[2];
    const int32_t ds[2] = {0, 2}; /* token 1 cannot start after itself */
    be->attention_forward(out, lse, q, k, v, ds, 1, 2, 1, 1, 8);
}

static void bad_rope(void)
{
    float x[3] = {0};
    const int32_t pos[1] = {0};
    const double inv[2] = {1.0, 0.01};
    be->rope_forward(x, pos, 1, 1, 3, inv, 1.0);
}

static void bad_rope_table(void)
{
    float x[4] = {0};
    const int32_t pos[1] = {0};
    be->rope_backward(x, pos, 1, 1, 4, NULL, 1.0);
}

static void bad_adam_step(void)
{
    float p = 0, g = 0, m = 0, v = 0;
    be->adamw(&p, &g, 1.0f, &m, &v, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0);
}


static void test_preconditions(void)
{
    omp_set_num_threads(1);
    expect_abort("cross_entropy target in padding", "cross_entropy", bad_target);
    expect_abort("embedding negative token", "tokens[0] = -2", bad_token);
    expect_abort("attention nh % nkv != 0", "nh must be a multiple of nkv", bad_gqa);
    expect_abort("attention doc_start > t", "doc_start[1] = 2", bad_doc_start);
    expect_abort("rope odd head_dim", "must be even", bad_rope);
    expect_abort("rope without a table", "inv_freq=", bad_rope_table);
    expect_abort("adamw t = 0", "steps count from 1", bad_adam_step);
}

/* ------------------------------------------------------------------ main */

/* The memory moves and matmul_bf16 of device backends: on the CPU the memory
 * moves are memcpy/memset, and matmul_bf16 is the reference the CUDA tests
 * compare cuBLASLt with: fp32 sums of exact bf16 products, one rounding
 * to nearest even at the end.  Checked against a double reference: the
 * fp32 sum is within 2 (k+1) u sum |a b| of it, and the rounding adds
 * half a bf16 ulp (2^-8 relative). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_gpu_entries(void)
{
    float src[5] = {1, -2, 3.5f, NAN, 5}, dst[5] = {0};
    be->copy_to_device(dst, src, sizeof src);
    be->copy(dst, dst, 0); /* zero bytes: nothing happens */
    CHECK(memcmp(dst, src, sizeof src) == 0, "copy_to_device is not memcpy");
    be->zero(dst + 1, 3 * sizeof(float));
    CHECK(dst[0] == 1 && dst[1] == 0 && dst[2] == 0 && dst[3] == 0 && dst[4] == 5,
          "zero: %g %g %g %g %g", dst[0], dst[1], dst[2], dst[3], dst[4]);
    be->synchronize();

    CHECK(to_bf16(1.0f) == 0x3f80 && to_bf16(1.00390625f) == 0x3f80 &&
              to_bf16(1.01171875f) == 0x3f82,
          "bf16 rounding to nearest even");
    const int64_t m = 9, n = 7, k = 13;
    for (int tr = 0; tr < 4; tr++)
        for (int acc = 0; acc < 2; acc++) {
            const bool ta = tr & 1, tb = tr & 2;
            uint16_t a[9 * 13], b[13 * 7], c[9 * 7], c0[9 * 7];
            float *fa = frand(m * k, 1.0), *fb = frand(k * n, 1.0), *fc = frand(m * n, 1.0);
            for (int64_t i = 0; i < m * k; i++)
                a[i] = to_bf16(fa[i]);
            for (int64_t i = 0; i < k * n; i++)
                b[i] = to_bf16(fb[i]);
            for (int64_t i = 0; i < m * n; i++)
                c0[i] = c[i] = acc ? to_bf16(fc[i]) : 0x7fc0; /* NaN: beta 0 must not read it */
            be->matmul_bf16(c, a, b, m, n, k, ta, tb, acc ? 1.0f : 0.0f);
            int bad = 0;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double ref = acc ? (double)from_bf16(c0[i * n + j]) : 0.0, mag = fabs(ref);
                    for (int64_t l = 0; l < k; l++) {
                        const double p = (double)from_bf16(ta ? a[l * m + i] : a[i * k + l]) *
                                         (double)from_bf16(tb ? b[j * k + l] : b[l * n + j]);
                        ref += p;
                        mag += fabs(p);
                    }
                    const double bound =
                        2.0 * (double)(k + 2) * 5.9604645e-8 * mag + fabs(ref) / 256.0;
                    bad += !(fabs((double)from_bf16(c[i * n + j]) - ref) <= bound);
                }
            CHECK(bad == 0, "matmul_bf16 ta=%d tb=%d beta=%d: %d elements out of bounds", ta, tb,
                  acc, bad);
            free(fa), free(fb), free(fc);
        }
}

int main(void)
{
    kernels_test_begin();
    CHECK(be && strcmp(be->name, "cpu") == 0, "mt_backend_cpu() name");
    CHECK(be->matmul && be->embedding_forward && be->embedding_backward && be->rmsnorm_forward &&
              be->rmsnorm_backward && be->rope_forward && be->rope_backward &&
              be->attention_forward && be->attention_backward && be->swiglu_forward &&
              be->swiglu_backward && be->cross_entropy && be->add && be->sum_squares &&
              be->scale && be->adamw && be->copy_to_device && be->copy_to_host && be->copy &&
              be->zero && be->synchronize && be->matmul_bf16 && be->matmul_add,
          "mt_backend_cpu() has an empty slot");

    test_expf();
    test_matmul();
    test_elementwise();
    test_adamw();
    test_embedding();
    test_preconditions();
    test_gpu_entries();
    return mt_test_exit("test_kernels");
}
