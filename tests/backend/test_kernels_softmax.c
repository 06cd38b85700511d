/* test_kernels_softmax: the CPU backend's softmax kernels against a naive
 * double-precision reference written here, backward kernels also against
 * central finite differences of their forward: attention (causal,
 * grouped-query, document-masked, forward and backward), the fused
 * cross-entropy (ignore_index, vocabulary padding, in place) and its
 * vocabulary-parallel passes against the whole.  The tolerances and the
 * determinism rule are test_kernels.c's; the helpers are test_kernels.h.
 * No MPI. */
#include "test_kernels.h"

/* ------------------------------------------------------------------ attention */

typedef struct {
    int64_t B, T, nh, nkv, hd;
    const int32_t *ds;
    float *q, *k, *v, *out, *lse, *R, *dq, *dk, *dv;
} att_ctx_t;

static void att_forward(att_ctx_t *c)
{
    be->attention_forward(c->out, c->lse, c->q, c->k, c->v, c->ds, c->B, c->T, c->nh, c->nkv,
                          c->hd);
}

static void att_run(void *p)
{
    att_ctx_t *c = p;
    att_forward(c);
    const int64_t nq = c->B * c->T * c->nh * c->hd, nk = c->B * c->T * c->nkv * c->hd;
    ffill(c->dq, nq, NAN); /* the backward overwrites */
    ffill(c->dk, nk, NAN);
    ffill(c->dv, nk, NAN);
    be->attention_backward(c->dq, c->dk, c->dv, c->R, c->out, c->lse, c->q, c->k, c->v, c->ds,
                           c->B, c->T, c->nh, c->nkv, c->hd);
}

static double att_loss(void *p)
{
    att_ctx_t *c = p;
    att_forward(c);
    double l = 0.0;
    for (int64_t i = 0; i < c->B * c->T * c->nh * c->hd; i++)
        l += (double)c->out[i] * c->R[i];
    return l;
}

/* Straightforward double attention: materialises each row's P. */
static void ref_attention(const att_ctx_t *c, double *out, double *lse, double *dq, double *dk,
                          double *dv)
{
    const int64_t B = c->B, T = c->T, nh = c->nh, nkv = c->nkv, hd = c->hd;
    const double scale = 1.0 / sqrt((double)hd);
    double *P = dnew(T), *dP = dnew(T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < nh; h++) {
            const int64_t g = h / (nh / nkv);
            for (int64_t t = 0; t < T; t++) {
                const int64_t lo = c->ds ? c->ds[b * T + t] : 0;
                const float *qt = c->q + (b * T + t) * nh * hd + h * hd;
                const float *gt = c->R + (b * T + t) * nh * hd + h * hd;
                double m = -INFINITY, z = 0.0;
                for (int64_t j = lo; j <= t; j++) {
                    const float *kj = c->k + (b * T + j) * nkv * hd + g * hd;
                    double s = 0.0;
                    for (int64_t d = 0; d < hd; d++)
                        s += (double)qt[d] * kj[d];
                    P[j] = s * scale;
                    m = P[j] > m ? P[j] : m;
                }
                for (int64_t j = lo; j <= t; j++)
                    z += exp(P[j] - m);
                lse[(b * nh + h) * T + t] = m + log(z);
                double D = 0.0;
                for (int64_t j = lo; j <= t; j++) {
                    P[j] = exp(P[j] - m) / z;
                    const float *vj = c->v + (b * T + j) * nkv * hd + g * hd;
                    dP[j] = 0.0;
                    for (int64_t d = 0; d < hd; d++) {
                        out[(b * T + t) * nh * hd + h * hd + d] += P[j] * vj[d];
                        dP[j] += (double)gt[d] * vj[d];
                    }
                    D += P[j] * dP[j];
                }
                for (int64_t j = lo; j <= t; j++) {
                    const double dS = P[j] * (dP[j] - D);
                    const float *kj = c->k + (b * T + j) * nkv * hd + g * hd;
                    for (int64_t d = 0; d < hd; d++) {
                        dq[(b * T + t) * nh * hd + h * hd + d] += scale * dS * kj[d];
                        dk[(b * T + j) * nkv * hd + g * hd + d] += scale * dS * qt[d];
                        dv[(b * T + j) * nkv * hd + g * hd + d] += P[j] * gt[d];
                    }
                }
            }
        }
    free(P), free(dP);
}

/* Random packing: each row is split into documents of random lengths. */
static int32_t *make_doc_start(int64_t B, int64_t T, int64_t maxlen)
{
    int32_t *ds = malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++) {
        int64_t start = 0, left = 1 + irand(maxlen);
        for (int64_t t = 0; t < T; t++) {
            if (left-- == 0) {
                start = t;
                left = irand(maxlen);
            }
            ds[b * T + t] = (int32_t)start;
        }
    }
    return ds;
}

static void test_attention(void)
{
    /* B, T, nh, nkv, hd, doc mask (max doc length, 0 = none) */
    const int64_t cfg[][6] = {
        {1, 1, 1, 1, 8, 0},   {2, 13, 4, 4, 8, 0},   {2, 13, 4, 2, 16, 5},
        {1, 9, 8, 2, 32, 0},  {2, 70, 2, 1, 8, 0},   {1, 70, 4, 1, 16, 20},
        {2, 130, 4, 2, 32, 0}, {2, 130, 4, 4, 16, 40}, {3, 33, 6, 3, 8, 7},
        /* the tiled kernel: 64 flattened (token, group head) rows per tile
         * (4096/hd when hd > 64), keys in blocks of 128 from the tile's
         * first visible key.  T not a multiple of either; a group of 3
         * splits tokens across tiles; documents that cross tiles and key
         * blocks; hd not a multiple of 4; 16 and 4 rows per tile; one token
         * with a group of 2; rows spanning 3 and 4 key blocks (the online
         * softmax's rescaling), with and without documents */
        {1, 100, 4, 2, 64, 0}, {2, 150, 6, 2, 64, 90}, {1, 97, 2, 2, 24, 30},
        {1, 75, 2, 1, 256, 0}, {1, 6, 3, 1, 1024, 3}, {1, 1, 2, 1, 64, 0},
        {1, 300, 2, 1, 16, 0}, {1, 450, 2, 2, 8, 400},
    };
    for (size_t s = 0; s < sizeof cfg / sizeof cfg[0]; s++) {
        att_ctx_t c = {.B = cfg[s][0], .T = cfg[s][1], .nh = cfg[s][2], .nkv = cfg[s][3],
                       .hd = cfg[s][4]};
        const int64_t B = c.B, T = c.T, nh = c.nh, nkv = c.nkv, hd = c.hd;
        const int64_t nq = B * T * nh * hd, nk = B * T * nkv * hd;
        int32_t *ds = cfg[s][5] ? make_doc_start(B, T, cfg[s][5]) : NULL;
        c.ds = ds;
        c.q = frand(nq, 1.5), c.k = frand(nk, 1.5), c.v = frand(nk, 1.0), c.R = frand(nq, 1.0);
        c.out = fnew(nq), c.lse = fnew(B * nh * T);
        c.dq = fnew(nq), c.dk = fnew(nk), c.dv = fnew(nk);
        att_run(&c);

        double *rout = dnew(nq), *rlse = dnew(B * nh * T), *rdq = dnew(nq), *rdk = dnew(nk),
               *rdv = dnew(nk);
        ref_attention(&c, rout, rlse, rdq, rdk, rdv);
        char tag[80], what[128];
        snprintf(tag, sizeof tag, "B=%lld T=%lld nh=%lld nkv=%lld hd=%lld%s", (long long)B,
                 (long long)T, (long long)nh, (long long)nkv, (long long)hd, ds ? " docs" : "");
        snprintf(what, sizeof what, "attention out %s", tag);
        check_close(what, c.out, rout, nq, 2e-6);
        snprintf(what, sizeof what, "attention lse %s", tag);
        check_close(what, c.lse, rlse, B * nh * T, 2e-6);
        snprintf(what, sizeof what, "attention dq %s", tag);
        check_close(what, c.dq, rdq, nq, 1e-5);
        snprintf(what, sizeof what, "attention dk %s", tag);
        check_close(what, c.dk, rdk, nk, 1e-5);
        snprintf(what, sizeof what, "attention dv %s", tag);
        check_close(what, c.dv, rdv, nk, 1e-5);

        if (nq <= 2000) {
            float *dq = fcopy(c.dq, nq), *dk = fcopy(c.dk, nk), *dv = fcopy(c.dv, nk);
            /* with one key per row (T = 1) dq and dk are exactly 0: use dv's scale */
            double floor = 0.0;
            for (int64_t i = 0; T == 1 && i < nk; i++)
                floor = fmax(floor, fabs(dv[i]));
            snprintf(what, sizeof what, "attention dq fd %s", tag);
            check_fd(what, c.q, nq, dq, att_loss, &c, 16, 1e-2, floor);
            snprintf(what, sizeof what, "attention dk fd %s", tag);
            check_fd(what, c.k, nk, dk, att_loss, &c, 16, 1e-2, floor);
            snprintf(what, sizeof what, "attention dv fd %s", tag);
            check_fd(what, c.v, nk, dv, att_loss, &c, 16, 1e-2, 0.0);
            free(dq), free(dk), free(dv);
        }
        if (T >= 70) {
            det_outs_t o = {{c.out, c.lse, c.dq, c.dk},
                            {(size_t)nq * sizeof(float), (size_t)(B * nh * T) * sizeof(float),
                             (size_t)nq * sizeof(float), (size_t)nk * sizeof(float)},
                            4};
            snprintf(what, sizeof what, "attention %s", tag);
            check_deterministic(what, att_run, &c, &o, 1);
            det_outs_t o2 = {{c.dv}, {(size_t)nk * sizeof(float)}, 1};
            check_deterministic(what, att_run, &c, &o2, 1);
        }
        free(ds), free(c.q), free(c.k), free(c.v), free(c.R), free(c.out), free(c.lse);
        free(c.dq), free(c.dk), free(c.dv), free(rout), free(rlse), free(rdq), free(rdk),
            free(rdv);
    }

    /* A document mask equal to "one document per row" is plain causal. */
    {
        att_ctx_t c = {.B = 2, .T = 40, .nh = 4, .nkv = 2, .hd = 16};
        const int64_t nq = 2 * 40 * 4 * 16, nk = nq / 2;
        int32_t *zeros = calloc(80, sizeof(int32_t));
        c.q = frand(nq, 1.0), c.k = frand(nk, 1.0), c.v = frand(nk, 1.0), c.R = frand(nq, 1.0);
        c.out = fnew(nq), c.lse = fnew(2 * 4 * 40), c.dq = fnew(nq), c.dk = fnew(nk),
        c.dv = fnew(nk);
        att_run(&c);
        float *out = fcopy(c.out, nq), *dk = fcopy(c.dk, nk);
        c.ds = zeros;
        att_run(&c);
        CHECK(memcmp(out, c.out, (size_t)nq * sizeof(float)) == 0 &&
                  memcmp(dk, c.dk, (size_t)nk * sizeof(float)) == 0,
              "attention: doc_start all 0 differs from no mask");
        free(zeros), free(c.q), free(c.k), free(c.v), free(c.R), free(c.out), free(c.lse),
            free(c.dq), free(c.dk), free(c.dv), free(out), free(dk);
    }
}

/* ------------------------------------------------------------------ cross-entropy */

typedef struct {
    float *logits, *dl;
    int32_t *tgt;
    int64_t n, V, vv, count;
    float gs;
    double loss;
} ce_ctx_t;

static void ce_run(void *p)
{
    ce_ctx_t *c = p;
    c->loss = be->cross_entropy(c->dl, c->logits, c->tgt, c->n, c->V, c->vv, c->gs, &c->count);
}

static double ce_loss(void *p)
{
    ce_ctx_t *c = p;
    int64_t cnt;
    const double l = be->cross_entropy(NULL, c->logits, c->tgt, c->n, c->V, c->vv, c->gs, &cnt);
    return l * c->gs;
}

static void test_cross_entropy(void)
{
    /* n, V, v_valid */
    const int64_t cfg[][3] = {{1, 1, 1},       {1, 5, 3},       {9, 37, 29},
                              {17, 64, 64},    {8, 1300, 1200}, {300, 150, 131},
                              {600, 150, 150}, {40, 2000, 1900}};
    for (size_t s = 0; s < sizeof cfg / sizeof cfg[0]; s++) {
        ce_ctx_t c = {.n = cfg[s][0], .V = cfg[s][1], .vv = cfg[s][2], .gs = 0.37f};
        const int64_t n = c.n, V = c.V, vv = c.vv;
        c.logits = frand(n * V, 4.0);
        c.tgt = malloc((size_t)n * sizeof(int32_t));
        int64_t want_count = 0;
        for (int64_t i = 0; i < n; i++) {
            c.tgt[i] = (n > 1 && i % 4 == 1) ? -100 : (int32_t)irand(vv);
            want_count += c.tgt[i] != -100;
            for (int64_t j = vv; j < V; j++)
                c.logits[i * V + j] = NAN; /* padding must never be read */
            if (i % 5 == 2)
                for (int64_t j = 0; j < vv; j++) /* far from 0: needs a stable log-sum-exp */
                    c.logits[i * V + j] += 3000.0f;
            if (i % 5 == 3) /* rising: each 512-column block raises the running max */
                for (int64_t j = 0; j < vv; j++)
                    c.logits[i * V + j] += 0.02f * (float)j;
            if (i % 7 == 6 && vv > 600 && c.tgt[i] != -100) {
                /* masked columns (-inf) filling the first 512-column block
                 * and more: they add nothing, their gradient is 0 */
                for (int64_t j = 0; j < 600; j++)
                    c.logits[i * V + j] = -INFINITY;
                c.tgt[i] = 600 + (int32_t)irand(vv - 600);
            }
        }
        c.dl = fnew(n * V);
        ffill(c.dl, n * V, NAN);
        ce_run(&c);

        double rloss = 0.0, *rdl = dnew(n * V);
        for (int64_t i = 0; i < n; i++) {
            if (c.tgt[i] == -100)
                continue;
            const float *l = c.logits + i * V;
            double m = -INFINITY, z = 0.0;
            for (int64_t j = 0; j < vv; j++)
                m = l[j] > m ? l[j] : m;
            for (int64_t j = 0; j < vv; j++)
                z += exp(l[j] - m);
            rloss += m + log(z) - l[c.tgt[i]];
            for (int64_t j = 0; j < vv; j++)
                rdl[i * V + j] = (exp(l[j] - m) / z - (j == c.tgt[i])) * c.gs;
        }
        CHECK(c.count == want_count, "cross_entropy n=%lld: count %lld, want %lld", (long long)n,
              (long long)c.count, (long long)want_count);
        CHECK(fabs(c.loss - rloss) <= 1e-6 * fabs(rloss) + 1e-6,
              "cross_entropy n=%lld V=%lld v_valid=%lld: loss %.12g, want %.12g", (long long)n,
              (long long)V, (long long)vv, c.loss, rloss);
        char what[96];
        snprintf(what, sizeof what, "cross_entropy dlogits n=%lld V=%lld v=%lld", (long long)n,
                 (long long)V, (long long)vv);
        check_close(what, c.dl, rdl, n * V, 2e-6);
        int bad = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < V; j++)
                if ((c.tgt[i] == -100 || j >= vv) && c.dl[i * V + j] != 0.0f)
                    bad++;
        CHECK(bad == 0, "cross_entropy: %d padding/ignored entries of dlogits are not 0", bad);

        /* dlogits == NULL: same loss; dlogits == logits: same bits */
        int64_t cnt2 = -1;
        const double l2 = be->cross_entropy(NULL, c.logits, c.tgt, n, V, vv, c.gs, &cnt2);
        CHECK(l2 == c.loss && cnt2 == c.count, "cross_entropy without dlogits: %.17g vs %.17g",
              l2, c.loss);
        float *alias = fcopy(c.logits, n * V);
        int64_t cnt3 = -1;
        const double l3 = be->cross_entropy(alias, alias, c.tgt, n, V, vv, c.gs, &cnt3);
        CHECK(l3 == c.loss && cnt3 == c.count &&
                  memcmp(alias, c.dl, (size_t)(n * V) * sizeof(float)) == 0,
              "cross_entropy with dlogits == logits differs from separate buffers");
        free(alias);

        if (n <= 20) {
            /* finite differences of grad_scale * loss, one row's real columns at a time */
            float *g = fcopy(c.dl, n * V);
            for (int64_t i = 0; i < n && i < 6; i++) {
                if (c.tgt[i] == -100 || i % 5 == 2)
                    continue; /* ignored rows have no gradient; +3000 rows lose fd precision */
                snprintf(what, sizeof what, "cross_entropy fd row %lld (V=%lld v=%lld)",
                         (long long)i, (long long)V, (long long)vv);
                check_fd(what, c.logits + i * V, vv, g + i * V, ce_loss, &c, 16, 1e-2, 0.0);
            }
            free(g);
        } else {
            det_outs_t o = {{c.dl, &c.loss, &c.count},
                            {(size_t)(n * V) * sizeof(float), sizeof c.loss, sizeof c.count},
                            3};
            check_deterministic("cross_entropy", ce_run, &c, &o, 1);
        }
        free(c.logits), free(c.tgt), free(c.dl), free(rdl);
    }
    /* NaN logits in the first block, where no finite maximum is known yet:
     * the loss is NaN, not dropped with the -inf columns */
    float row[1300];
    for (int j = 0; j < 1300; j++)
        row[j] = j < 600 ? NAN : 0.01f * (float)(j % 11);
    int32_t t = 900;
    int64_t cnt = 0;
    const double l = be->cross_entropy(row, row, &t, 1, 1300, 1300, 1.0f, &cnt);
    CHECK(isnan(l) && cnt == 1, "cross_entropy, NaN in the first block: loss %.9g, not NaN", l);
}

/* Vocabulary-parallel cross-entropy: the vocabulary split into k shards
 * (padded to a multiple of k, as tensor parallelism pads it), combined as
 * the model combines them over the TP group, gives cross_entropy's loss
 * and gradient. */
static void test_ce_shards(void)
{
    const int64_t cfg[][3] = {{7, 37, 2}, {40, 600, 3}, {5, 2000, 4}, {9, 10, 4}}; /* n, V, k */
    for (size_t s = 0; s < sizeof cfg / sizeof cfg[0]; s++) {
        const int64_t n = cfg[s][0], Vv = cfg[s][1], k = cfg[s][2];
        const int64_t Vl = (Vv + k - 1) / k, Vp = Vl * k; /* padded */
        float *full = frand(n * Vp, 4.0), *dfull = fnew(n * Vp);
        int32_t *tgt = malloc((size_t)n * sizeof(int32_t));
        for (int64_t i = 0; i < n; i++) {
            tgt[i] = i % 3 == 1 ? -100 : (int32_t)irand(Vv);
            if (i % 4 == 2)
                for (int64_t j = 0; j < Vv; j++)
                    full[i * Vp + j] += 500.0f; /* needs the max subtracted */
        }
        int64_t cnt = 0;
        const double want = be->cross_entropy(dfull, full, tgt, n, Vp, Vv, 0.3f, &cnt);
        /* the shards: columns [r*Vl, (r+1)*Vl) of each row */
        float *sh = fnew(k * n * Vl), *mx = fnew(n), *m1 = fnew(n);
        double *z = dnew(n), *ly = dnew(n), *z1 = dnew(n), *l1 = dnew(n);
        for (int64_t r = 0; r < k; r++)
            for (int64_t i = 0; i < n; i++)
                memcpy(sh + (r * n + i) * Vl, full + i * Vp + r * Vl, sizeof(float) * (size_t)Vl);
        for (int64_t i = 0; i < n; i++)
            mx[i] = -INFINITY, z[i] = ly[i] = 0;
        for (int64_t r = 0; r < k; r++) {
            int64_t vv = Vv - r * Vl < 0 ? 0 : Vv - r * Vl < Vl ? Vv - r * Vl : Vl;
            be->ce_shard_max(m1, sh + r * n * Vl, n, Vl, vv);
            for (int64_t i = 0; i < n; i++)
                mx[i] = m1[i] > mx[i] ? m1[i] : mx[i];
        }
        for (int64_t r = 0; r < k; r++) {
            int64_t vv = Vv - r * Vl < 0 ? 0 : Vv - r * Vl < Vl ? Vv - r * Vl : Vl;
            be->ce_shard_sum(z1, l1, sh + r * n * Vl, tgt, mx, n, Vl, r * Vl, vv);
            for (int64_t i = 0; i < n; i++)
                z[i] += z1[i], ly[i] += l1[i];
        }
        for (int64_t r = 0; r < k; r++) {
            int64_t vv = Vv - r * Vl < 0 ? 0 : Vv - r * Vl < Vl ? Vv - r * Vl : Vl, c2 = 0;
            float *d = sh + r * n * Vl; /* in place: dlogits aliases logits */
            const double got = be->ce_shard_finish(d, d, tgt, mx, z, ly, n, Vl, r * Vl, vv, 0.3f,
                                                   &c2);
            CHECK(c2 == cnt && fabs(got - want) <= 1e-9 * fabs(want) + 1e-9,
                  "ce shards n=%lld V=%lld k=%lld shard %lld: loss %.12g count %lld, want %.12g %lld",
                  (long long)n, (long long)Vv, (long long)k, (long long)r, got, (long long)c2, want,
                  (long long)cnt);
            double md = 0;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < Vl; j++)
                    md = fmax(md, fabs((double)d[i * Vl + j] - (double)dfull[i * Vp + r * Vl + j]));
            CHECK(md <= 1e-6, "ce shards n=%lld V=%lld k=%lld shard %lld: dlogits differ by %.3g",
                  (long long)n, (long long)Vv, (long long)k, (long long)r, md);
        }
        free(full), free(dfull), free(tgt), free(sh), free(mx), free(m1);
        free(z), free(ly), free(z1), free(l1);
    }
    /* embedding: -1 is another shard's token: a zero row, no gradient */
    float table[6] = {1, 2, 3, 4, 5, 6}, out[4], dtab[6] = {0}, dout[4] = {1, 1, 1, 1};
    int32_t tok[2] = {-1, 2};
    be->embedding_forward(out, tok, table, 2, 2);
    CHECK(out[0] == 0 && out[1] == 0 && out[2] == 5 && out[3] == 6, "embedding -1 forward");
    be->embedding_backward(dtab, dout, tok, 2, 2);
    CHECK(dtab[0] == 0 && dtab[1] == 0 && dtab[4] == 1 && dtab[5] == 1, "embedding -1 backward");
}

int main(void)
{
    kernels_test_begin();
    test_attention();
    test_cross_entropy();
    test_ce_shards();
    return mt_test_exit("test_kernels_softmax");
}
