/* test_kernels_layers: the CPU backend's layer kernels, RMSNorm, RoPE
 * and SwiGLU, forward and backward, against a naive double-precision
 * reference written here, backward kernels also against central finite
 * differences of their forward, with the contract's side rules (dw
 * accumulates, dx overwrites, in place) and determinism across thread
 * counts.  The tolerances are test_kernels.c's; the helpers are
 * test_kernels.h; their preconditions are checked in test_kernels.c.
 * No MPI. */
#include "test_kernels.h"

/* ------------------------------------------------------------------ RMSNorm */

typedef struct {
    float *x, *w, *out, *rstd, *dout, *dx, *dw;
    int64_t n, dim;
    float eps;
} rms_ctx_t;

static void rms_run(void *p)
{
    rms_ctx_t *c = p;
    be->rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->n, c->dim, c->eps);
    ffill(c->dx, c->n * c->dim, NAN); /* overwritten */
    ffill(c->dw, c->dim, 1.0f);       /* accumulated */
    be->rmsnorm_backward(c->dx, c->dw, c->dout, c->x, c->w, c->rstd, c->n, c->dim, false);
}

static double rms_loss(void *p)
{
    rms_ctx_t *c = p;
    be->rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->n, c->dim, c->eps);
    double l = 0.0;
    for (int64_t i = 0; i < c->n * c->dim; i++)
        l += (double)c->out[i] * c->dout[i];
    return l;
}

static void test_rmsnorm(void)
{
    const int64_t cfg[][2] = {{1, 1}, {5, 7}, {13, 64}, {4, 130}, {300, 200}};
    for (size_t s = 0; s < sizeof cfg / sizeof cfg[0]; s++) {
        rms_ctx_t c = {.n = cfg[s][0], .dim = cfg[s][1], .eps = 1e-5f};
        const int64_t n = c.n, dim = c.dim;
        c.x = frand(n * dim, 2.0);
        c.w = frand(dim, 1.5);
        c.dout = frand(n * dim, 1.0);
        c.out = fnew(n * dim), c.rstd = fnew(n), c.dx = fnew(n * dim), c.dw = fnew(dim);
        rms_run(&c);

        double *rout = dnew(n * dim), *rr = dnew(n), *rdx = dnew(n * dim), *rdw = dnew(dim);
        for (int64_t i = 0; i < n; i++) {
            const float *x = c.x + i * dim, *g = c.dout + i * dim;
            double ms = 0.0, gwx = 0.0;
            for (int64_t j = 0; j < dim; j++) {
                ms += (double)x[j] * x[j];
                gwx += (double)g[j] * c.w[j] * x[j];
            }
            const double r = 1.0 / sqrt(ms / dim + (double)c.eps);
            rr[i] = r;
            for (int64_t j = 0; j < dim; j++) {
                rout[i * dim + j] = x[j] * r * c.w[j];
                rdx[i * dim + j] = r * g[j] * c.w[j] - r * r * r * gwx / dim * x[j];
                rdw[j] += (double)g[j] * x[j] * r;
            }
        }
        char what[96];
        snprintf(what, sizeof what, "rmsnorm out n=%lld dim=%lld", (long long)n, (long long)dim);
        check_close(what, c.out, rout, n * dim, 2e-6);
        check_close("rmsnorm rstd", c.rstd, rr, n, 2e-6);
        /* dx = r g w - (...) x cancels to ~0 for dim = 1: scale by |r g w| */
        double dx_scale = 0.0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < dim; j++)
                dx_scale = fmax(dx_scale, rr[i] * fabs((double)c.dout[i * dim + j] * c.w[j]));
        check_close_floor("rmsnorm dx", c.dx, rdx, n * dim, 1e-5, dx_scale);
        float *dw = fnew(dim);
        for (int64_t j = 0; j < dim; j++)
            dw[j] = c.dw[j] - 1.0f; /* dw accumulates onto the pre-filled 1.0 */
        check_close("rmsnorm dw (accumulated onto 1.0)", dw, rdw, dim, 1e-5);
        /* accumulate: dx += the same gradient, one float add per element */
        float *acc = frand(n * dim, 3.0), *acc0 = fcopy(acc, n * dim), *dw2 = fnew(dim);
        be->rmsnorm_backward(acc, dw2, c.dout, c.x, c.w, c.rstd, n, dim, true);
        int64_t bad = 0;
        for (int64_t i = 0; i < n * dim; i++) {
            const float want = acc0[i] + c.dx[i];
            bad += memcmp(&acc[i], &want, sizeof want) != 0;
        }
        CHECK(bad == 0, "rmsnorm_backward accumulate n=%lld dim=%lld: %lld elements are not "
              "dx + the overwritten result", (long long)n, (long long)dim, (long long)bad);
        free(acc), free(acc0), free(dw2);

        if (n * dim <= 1000) {
            float *dx = fcopy(c.dx, n * dim);
            check_fd("rmsnorm dx fd", c.x, n * dim, dx, rms_loss, &c, 32, 1e-2, dx_scale);
            check_fd("rmsnorm dw fd", c.w, dim, dw, rms_loss, &c, 32, 1e-2, 0.0);
            free(dx);
        } else {
            det_outs_t o = {{c.out, c.rstd, c.dx, c.dw},
                            {(size_t)(n * dim) * sizeof(float), (size_t)n * sizeof(float),
                             (size_t)(n * dim) * sizeof(float), (size_t)dim * sizeof(float)},
                            4};
            check_deterministic("rmsnorm", rms_run, &c, &o, 1);
        }
        free(c.x), free(c.w), free(c.dout), free(c.out), free(c.rstd), free(c.dx), free(c.dw);
        free(rout), free(rr), free(rdx), free(rdw), free(dw);
    }
}

/* The norm over rows split by columns across ranks (rmsnorm_rowsums and
 * the _sums entries): the parts of a row, each normalised with the row
 * sums added over the parts, give the whole row's norm; one part is the
 * whole norm, bit for bit (the same row sums in the same order). */
static void test_rmsnorm_split(void)
{
    const int64_t n = 9, dim = 48;
    const float eps = 1e-5f;
    float *x = frand(n * dim, 2.0), *w = frand(dim, 1.5), *g = frand(n * dim, 1.0);
    float *out = fnew(n * dim), *rstd = fnew(n), *dx = fnew(n * dim), *dw = fnew(dim);
    memset(dw, 0, sizeof(float) * (size_t)dim); /* dw accumulates */
    be->rmsnorm_forward(out, rstd, x, w, n, dim, eps);
    be->rmsnorm_backward(dx, dw, g, x, w, rstd, n, dim, false);
    for (int parts = 1; parts <= 3; parts++) {
        const int64_t d = dim / parts;
        double *ss = dnew(n), *gx = dnew(n), *part = dnew(n);
        float *xp = fnew(n * d), *gp = fnew(n * d), *op = fnew(n * d), *rp = fnew(n);
        float *dxp = fnew(n * d), *dwp = fnew(d);
        for (int p = 0; p < parts; p++) { /* the sums, as the TP group adds them */
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < d; j++) {
                    xp[i * d + j] = x[i * dim + p * d + j];
                    gp[i * d + j] = g[i * dim + p * d + j];
                }
            be->rmsnorm_rowsums(part, xp, xp, NULL, n, d);
            for (int64_t i = 0; i < n; i++)
                ss[i] += part[i];
            be->rmsnorm_rowsums(part, gp, xp, w + p * d, n, d);
            for (int64_t i = 0; i < n; i++)
                gx[i] += part[i];
        }
        int64_t bad_out = 0, bad_dx = 0, bad_dw = 0, bad_r = 0;
        double worst = 0.0;
        for (int p = 0; p < parts; p++) {
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < d; j++) {
                    xp[i * d + j] = x[i * dim + p * d + j];
                    gp[i * d + j] = g[i * dim + p * d + j];
                }
            be->rmsnorm_forward_sums(op, rp, xp, w + p * d, ss, n, d, dim, eps);
            memset(dwp, 0, sizeof(float) * (size_t)d);
            be->rmsnorm_backward_sums(dxp, dwp, gp, xp, w + p * d, rp, gx, n, d, dim, false);
            for (int64_t i = 0; i < n; i++) {
                bad_r += rp[i] != rstd[i];
                for (int64_t j = 0; j < d; j++) {
                    const int64_t k = i * dim + p * d + j;
                    bad_out += op[i * d + j] != out[k];
                    const double e = fabs((double)dxp[i * d + j] - dx[k]) / (fabs(dx[k]) + 1e-3);
                    worst = fmax(worst, e);
                    bad_dx += parts == 1 ? dxp[i * d + j] != dx[k] : e > 1e-5;
                }
            }
            for (int64_t j = 0; j < d; j++)
                bad_dw += dwp[j] != dw[p * d + j];
        }
        /* a row's sums in another order may round its rstd one float
         * differently; with one part they are the same sums */
        CHECK(parts > 1 || (bad_out == 0 && bad_r == 0), "rmsnorm split, 1 part: %lld out, %lld "
              "rstd differ from rmsnorm_forward", (long long)bad_out, (long long)bad_r);
        CHECK(bad_r <= n / 3 && bad_dx == 0 && (parts > 1 || bad_dw == 0),
              "rmsnorm split into %d parts: %lld rstd, %lld dx (worst %.2e), %lld dw differ",
              parts, (long long)bad_r, (long long)bad_dx, worst, (long long)bad_dw);
        if (parts > 1) {
            double *rout = dnew(n * dim);
            for (int64_t i = 0; i < n * dim; i++)
                rout[i] = out[i];
            /* out from the split sums against the whole row's out */
            float *all = fnew(n * dim);
            for (int p = 0; p < parts; p++) {
                for (int64_t i = 0; i < n; i++)
                    for (int64_t j = 0; j < d; j++)
                        xp[i * d + j] = x[i * dim + p * d + j];
                be->rmsnorm_forward_sums(op, rp, xp, w + p * d, ss, n, d, dim, eps);
                for (int64_t i = 0; i < n; i++)
                    for (int64_t j = 0; j < d; j++)
                        all[i * dim + p * d + j] = op[i * d + j];
            }
            check_close("rmsnorm split out", all, rout, n * dim, 1e-6);
            free(rout), free(all);
        }
        free(ss), free(gx), free(part), free(xp), free(gp), free(op), free(rp), free(dxp), free(dwp);
    }
    free(x), free(w), free(g), free(out), free(rstd), free(dx), free(dw);
}

/* ------------------------------------------------------------------ RoPE */

typedef struct {
    float *x, *buf, *R;
    int32_t *pos;
    int64_t n, nh, hd;
    const double *inv; /* inverse frequencies [hd/2] */
    double scale;
} rope_ctx_t;

static double rope_loss(void *p)
{
    rope_ctx_t *c = p;
    const int64_t N = c->n * c->nh * c->hd;
    memcpy(c->buf, c->x, (size_t)N * sizeof(float));
    be->rope_forward(c->buf, c->pos, c->n, c->nh, c->hd, c->inv, c->scale);
    double l = 0.0;
    for (int64_t i = 0; i < N; i++)
        l += (double)c->buf[i] * c->R[i];
    return l;
}

static void rope_run(void *p)
{
    rope_ctx_t *c = p;
    const int64_t N = c->n * c->nh * c->hd;
    memcpy(c->buf, c->x, (size_t)N * sizeof(float));
    be->rope_forward(c->buf, c->pos, c->n, c->nh, c->hd, c->inv, c->scale);
    be->rope_backward(c->buf, c->pos, c->n, c->nh, c->hd, c->inv, c->scale);
}

/* theta^(-2i/hd), the unscaled table, as the model forms it */
static double *rope_table(double theta, int64_t hd)
{
    double *inv = dnew(hd / 2);
    for (int64_t i = 0; i < hd / 2; i++)
        inv[i] = pow(theta, -2.0 * (double)i / (double)hd);
    return inv;
}

/* The kernel as it was when it took theta (the frequencies formed inside,
 * cos and sin rounded to float, the float rotation): the unscaled table
 * with scale 1 must keep these bits. */
static void rope_by_theta(float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                          double theta, double sign)
{
    const int64_t half = hd / 2;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < half; i++) {
            const double a = (double)pos[t] * pow(theta, -2.0 * (double)i / (double)hd);
            const float cs = (float)cos(a), sn = (float)(sign * sin(a));
            for (int64_t h = 0; h < nh; h++) {
                float *x1 = x + t * nh * hd + h * hd, *x2 = x1 + half;
                const float a1 = x1[i], b1 = x2[i];
                x1[i] = a1 * cs - b1 * sn;
                x2[i] = b1 * cs + a1 * sn;
            }
        }
}

static void test_rope(void)
{
    /* the pairing, by hand: hd = 4, pos = 1, theta = 10000: angles 1 and 1/100 */
    {
        float x[4] = {1, 0, 0, 0}, y[4] = {0, 1, 0, 0};
        const int32_t pos = 1;
        double *inv = rope_table(10000.0, 4);
        be->rope_forward(x, &pos, 1, 1, 4, inv, 1.0);
        be->rope_forward(y, &pos, 1, 1, 4, inv, 1.0);
        CHECK(fabs(x[0] - cos(1.0)) < 1e-7 && x[1] == 0 && fabs(x[2] - sin(1.0)) < 1e-7 &&
                  x[3] == 0,
              "rope pairing: e0 -> %g %g %g %g, want cos1 0 sin1 0", x[0], x[1], x[2], x[3]);
        CHECK(fabs(y[1] - cos(0.01)) < 1e-7 && fabs(y[3] - sin(0.01)) < 1e-7 && y[0] == 0 &&
                  y[2] == 0,
              "rope pairing: e1 -> %g %g %g %g, want 0 cos.01 0 sin.01", y[0], y[1], y[2], y[3]);
        /* a table entry and the scale are what the kernel applies */
        const double inv2[2] = {0.5, 0.25};
        float z[4] = {1, 0, 0, 0}, w[4] = {0, 1, 0, 0};
        be->rope_forward(z, &pos, 1, 1, 4, inv2, 1.5);
        be->rope_forward(w, &pos, 1, 1, 4, inv2, 1.5);
        CHECK(z[0] == (float)(1.5 * cos(0.5)) && z[2] == (float)(1.5 * sin(0.5)) &&
                  w[1] == (float)(1.5 * cos(0.25)) && w[3] == (float)(1.5 * sin(0.25)),
              "rope table {0.5, 0.25}, scale 1.5: e0 -> %g _ %g, e1 -> %g _ %g", z[0], z[2],
              w[1], w[3]);
        free(inv);
    }
    const int64_t cfg[][3] = {{3, 1, 2}, {7, 3, 8}, {16, 2, 32}, {300, 4, 64}}; /* n, nh, hd */
    for (size_t s = 0; s < 2 * sizeof cfg / sizeof cfg[0]; s++) {
        /* odd s: a scaled table (every third frequency divided by 8, as a
         * RoPE scaling's low band) and yarn's kind of scale */
        const bool scaled = s % 2;
        rope_ctx_t c = {.n = cfg[s / 2][0], .nh = cfg[s / 2][1], .hd = cfg[s / 2][2]};
        const double theta = 500000.0;
        const int64_t n = c.n, nh = c.nh, hd = c.hd, N = n * nh * hd, half = hd / 2;
        double *inv = rope_table(theta, hd);
        for (int64_t i = 0; scaled && i < half; i++)
            inv[i] /= i % 3 ? 1.0 : 8.0;
        c.inv = inv, c.scale = scaled ? 1.1386 : 1.0;
        c.pos = malloc((size_t)n * sizeof(int32_t));
        for (int64_t t = 0; t < n; t++)
            c.pos[t] = t == 0 ? 0 : (int32_t)irand(t % 2 ? 100 : 131072); /* incl. long positions */
        c.x = frand(N, 1.0);
        c.R = frand(N, 1.0);
        c.buf = fnew(N);
        memcpy(c.buf, c.x, (size_t)N * sizeof(float));
        be->rope_forward(c.buf, c.pos, n, nh, hd, c.inv, c.scale);
        if (!scaled) { /* the old kernel's bits, forward and backward */
            float *old = fcopy(c.x, N);
            rope_by_theta(old, c.pos, n, nh, hd, theta, 1.0);
            CHECK(memcmp(old, c.buf, (size_t)N * sizeof(float)) == 0,
                  "rope_forward n=%lld hd=%lld: the unscaled table changes the bits of "
                  "theta^(-2i/hd) formed in the kernel", (long long)n, (long long)hd);
            memcpy(old, c.R, (size_t)N * sizeof(float));
            rope_by_theta(old, c.pos, n, nh, hd, theta, -1.0);
            float *g = fcopy(c.R, N);
            be->rope_backward(g, c.pos, n, nh, hd, c.inv, c.scale);
            CHECK(memcmp(old, g, (size_t)N * sizeof(float)) == 0,
                  "rope_backward n=%lld hd=%lld: the unscaled table changes the bits",
                  (long long)n, (long long)hd);
            free(old), free(g);
        }
        double *ref = dnew(N), *rback = dnew(N);
        for (int64_t t = 0; t < n; t++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t i = 0; i < half; i++) {
                    const double a = c.pos[t] * inv[i], cs = c.scale * cos(a);
                    const double sn = c.scale * sin(a);
                    const int64_t o = t * nh * hd + h * hd;
                    const double x1 = c.x[o + i], x2 = c.x[o + i + half];
                    const double r1 = c.R[o + i], r2 = c.R[o + i + half];
                    ref[o + i] = x1 * cs - x2 * sn;
                    ref[o + i + half] = x2 * cs + x1 * sn;
                    rback[o + i] = r1 * cs + r2 * sn; /* (s R(a))^T */
                    rback[o + i + half] = r2 * cs - r1 * sn;
                }
        check_close("rope forward vs double", c.buf, ref, N, 2e-6);
        bool ident = true; /* position 0: the identity times the scale */
        for (int64_t i = 0; i < nh * hd; i++)
            ident = ident && c.buf[i] == (float)(c.scale * 1.0) * c.x[i];
        CHECK(ident, "rope at position 0 is not scale times the identity (scale %g)", c.scale);
        float *grad = fcopy(c.R, N);
        be->rope_backward(grad, c.pos, n, nh, hd, c.inv, c.scale);
        check_close("rope backward vs double R^T", grad, rback, N, 2e-6);
        /* backward(forward(x)) = scale^2 x */
        memcpy(c.buf, c.x, (size_t)N * sizeof(float));
        be->rope_forward(c.buf, c.pos, n, nh, hd, c.inv, c.scale);
        be->rope_backward(c.buf, c.pos, n, nh, hd, c.inv, c.scale);
        double *xd = dnew(N);
        for (int64_t i = 0; i < N; i++)
            xd[i] = c.scale * c.scale * c.x[i];
        check_close("rope backward(forward(x)) = scale^2 x", c.buf, xd, N, 1e-6);
        if (N <= 1000)
            check_fd("rope backward fd", c.x, N, grad, rope_loss, &c, 32, 1e-2, 0.0);
        else {
            det_outs_t o = {{c.buf}, {(size_t)N * sizeof(float)}, 1};
            check_deterministic("rope", rope_run, &c, &o, 1);
        }
        free(c.pos), free(c.x), free(c.R), free(c.buf), free(ref), free(rback), free(grad),
            free(xd), free(inv);
    }
}

/* ------------------------------------------------------------------ SwiGLU */

typedef struct {
    float *gate, *up, *out, *dout, *dg, *du;
    int64_t n;
} swi_ctx_t;

static void swi_run(void *p)
{
    swi_ctx_t *c = p;
    be->swiglu_forward(c->out, c->gate, c->up, c->n);
    ffill(c->dg, c->n, NAN);
    ffill(c->du, c->n, NAN);
    be->swiglu_backward(c->dg, c->du, c->dout, c->gate, c->up, c->n);
}

static double swi_loss(void *p)
{
    swi_ctx_t *c = p;
    be->swiglu_forward(c->out, c->gate, c->up, c->n);
    double l = 0.0;
    for (int64_t i = 0; i < c->n; i++)
        l += (double)c->out[i] * c->dout[i];
    return l;
}

static void test_swiglu(void)
{
    const int64_t sizes[] = {1, 7, 300, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        swi_ctx_t c = {.n = sizes[s]};
        const int64_t n = c.n;
        c.gate = frand(n, 6.0), c.up = frand(n, 2.0), c.dout = frand(n, 1.0);
        if (n >= 7) { /* the saturated tails */
            c.gate[0] = -120.0f, c.gate[1] = 120.0f, c.gate[2] = -30.0f, c.gate[3] = 0.0f;
        }
        c.out = fnew(n), c.dg = fnew(n), c.du = fnew(n);
        swi_run(&c);
        double *ro = dnew(n), *rg = dnew(n), *ru = dnew(n);
        for (int64_t i = 0; i < n; i++) {
            const double g = c.gate[i], u = c.up[i], d = c.dout[i];
            const double sg = 1.0 / (1.0 + exp(-g));
            ro[i] = g * sg * u;
            rg[i] = d * u * sg * (1.0 + g * (1.0 - sg));
            ru[i] = d * g * sg;
        }
        check_close("swiglu out", c.out, ro, n, 2e-6);
        check_close("swiglu dgate", c.dg, rg, n, 2e-6);
        check_close("swiglu dup", c.du, ru, n, 2e-6);
        CHECK(isfinite(c.out[0]) && isfinite(c.dg[0]), "swiglu at gate = -120 is not finite");

        /* in place: dgate == gate, dup == up gives the same bits */
        float *g2 = fcopy(c.gate, n), *u2 = fcopy(c.up, n);
        be->swiglu_backward(g2, u2, c.dout, g2, u2, n);
        CHECK(memcmp(g2, c.dg, (size_t)n * sizeof(float)) == 0 &&
                  memcmp(u2, c.du, (size_t)n * sizeof(float)) == 0,
              "swiglu_backward n=%lld in place (dgate==gate, dup==up) differs", (long long)n);
        free(g2), free(u2);

        if (n <= 300) {
            float *dg = fcopy(c.dg, n), *du = fcopy(c.du, n);
            check_fd("swiglu dgate fd", c.gate, n, dg, swi_loss, &c, 32, 1e-2, 0.0);
            check_fd("swiglu dup fd", c.up, n, du, swi_loss, &c, 32, 1e-2, 0.0);
            free(dg), free(du);
        } else {
            det_outs_t o = {{c.out, c.dg, c.du},
                            {(size_t)n * sizeof(float), (size_t)n * sizeof(float),
                             (size_t)n * sizeof(float)},
                            3};
            check_deterministic("swiglu", swi_run, &c, &o, 1);
        }
        free(c.gate), free(c.up), free(c.dout), free(c.out), free(c.dg), free(c.du);
        free(ro), free(rg), free(ru);
    }
}

int main(void)
{
    kernels_test_begin();
    test_rmsnorm();
    test_rmsnorm_split();
    test_rope();
    test_swiglu();
    return mt_test_exit("test_kernels_layers");
}
