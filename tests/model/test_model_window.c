/* test_model_window: the sliding window as the model hands it to the
 * attention kernels (doc/sliding-window.md).
 *
 * 1. The mask mt_model_set_packing builds: for plain rows, packed rows,
 *    and context parallelism's chunks (global positions, with and without
 *    documents), each query's first visible key equals the smallest key
 *    that Hugging Face's rule lets it see, found here by scanning every
 *    key j of the row: j <= g, g - j < W, same document (g the query's
 *    index in its row); a window that narrows nothing leaves the mask as
 *    it is without one (none on plain rows).
 * 2. The model's loss: a window at least the row gives the loss of no
 *    window bit for bit, a narrower one changes it.  (That the kernels
 *    apply these first visible keys as the rule says is
 *    tests/backend/test_kernels_window's.)
 * No MPI. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt_backend.h"
#include "mt_config.h"
#include "mt_model.h"
#include "mt_test.h"
#include "mt_test_model.h"

#define NB 2
#define NT 8

static int init(mt_model_t *m, mt_config_t *cfg, const char *extra, int64_t t)
{
    char buf[256];
    snprintf(buf, sizeof buf, "model.architecture=MistralForCausalLM;dataset.seq_length=%lld;%s",
             (long long)t, extra ? extra : "");
    if (!mt_test_model_cfg(cfg, NULL, buf, MT_APP_ANY, 1))
        return 0;
    mt_status_t s = mt_model_init(m, cfg, mt_backend_cpu(), NB, t);
    CHECK(s == MT_OK, "init (%s): %s", buf, mt_error_message());
    return s == MT_OK;
}

/* The model's first visible keys against a scan of the rule.  The full
 * row has Tf tokens, documents doc[] (ids, or NULL); this model holds the
 * row's tokens at indices idx[] (m->T of them per row); pos and ds are what
 * the trainer passes (ds NULL: unpacked). */
static void check_mask(const char *what, mt_model_t *m, int64_t W, int64_t Tf,
                       const int32_t *doc, const int64_t *idx, const int32_t *pos,
                       const int32_t *ds)
{
    mt_model_set_packing(m, pos, ds);
    int32_t *got = calloc((size_t)m->N, sizeof(int32_t)); /* no mask: every lo 0 */
    if (m->doc_start)
        m->be->copy_to_host(got, m->doc_start, sizeof(int32_t) * (size_t)m->N);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < m->N; i++) {
        const int64_t b = i / m->T, g = idx[i % m->T];
        int64_t lo = g;
        for (int64_t j = 0; j <= g; j++)
            if (g - j < W && (!doc || doc[b * Tf + j] == doc[b * Tf + g])) {
                lo = j;
                break;
            }
        if (got[i] != lo && bad++ == 0)
            first = i;
    }
    CHECK(bad == 0, "%s (W=%lld): %lld first visible keys wrong, the first at token %lld: %d, "
          "expected by the rule %s", what, (long long)W, (long long)bad, (long long)first,
          first >= 0 ? got[first] : 0, "j <= g, g - j < W, same document");
    free(got);
}

static void test_masks(void)
{
    const int64_t Tf = 16;
    /* documents of one row each: [0,5) [5,6) [6,13) [13,16); row 2: [0,16) */
    int32_t doc[NB * 16], ds[NB * 16], pos[NB * 16];
    for (int64_t t = 0; t < Tf; t++) {
        const int32_t d = t < 5 ? 0 : t < 6 ? 1 : t < 13 ? 2 : 3;
        const int32_t st = t < 5 ? 0 : t < 6 ? 5 : t < 13 ? 6 : 13;
        doc[t] = d, ds[t] = st, pos[t] = (int32_t)(t - st);
        doc[Tf + t] = 0, ds[Tf + t] = 0, pos[Tf + t] = (int32_t)t;
    }
    const int64_t windows[] = {1, 2, 3, 4, 7, 16, 40};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
        const int64_t W = windows[w];
        char extra[64];
        snprintf(extra, sizeof extra, "model.sliding_window=%lld", (long long)W);
        mt_config_t cfg;
        mt_model_t m;
        /* the whole row on one model */
        if (init(&m, &cfg, extra, Tf)) {
            int64_t idx[16];
            for (int64_t t = 0; t < Tf; t++)
                idx[t] = t;
            check_mask("plain rows (no positions)", &m, W, Tf, NULL, idx, NULL, NULL);
            CHECK((m.doc_start == NULL) == (W >= Tf), "W=%lld on rows of %lld: a mask %s",
                  (long long)W, (long long)Tf, m.doc_start ? "that narrows nothing" : "missing");
            int32_t rp[NB * 16];
            for (int64_t i = 0; i < NB * Tf; i++)
                rp[i] = (int32_t)(i % Tf);
            check_mask("plain rows (positions)", &m, W, Tf, NULL, idx, rp, NULL);
            int32_t p2[NB * 16], d2[NB * 16];
            memcpy(p2, pos, sizeof p2), memcpy(d2, ds, sizeof d2);
            check_mask("packed rows", &m, W, Tf, doc, idx, p2, d2);
            mt_model_free(&m);
        }
        /* context parallelism, cp 2, rank 1: chunks 1 and 2 of 4 (global
         * tokens 4..11), positions and document starts global */
        if (init(&m, &cfg, extra, Tf / 2)) {
            int64_t idx[8];
            int32_t lp[NB * 8], ld[NB * 8], up[NB * 8];
            for (int64_t b = 0; b < NB; b++)
                for (int64_t i = 0; i < 8; i++) {
                    const int64_t g = 4 + i;
                    idx[i] = g;
                    lp[b * 8 + i] = pos[b * Tf + g], ld[b * 8 + i] = ds[b * Tf + g];
                    up[b * 8 + i] = (int32_t)g;
                }
            check_mask("cp chunks, plain rows", &m, W, Tf, NULL, idx, up, NULL);
            check_mask("cp chunks, packed rows", &m, W, Tf, doc, idx, lp, ld);
            mt_model_free(&m);
        }
    }
    /* no window: no mask on plain rows, the documents' own starts packed */
    mt_config_t cfg;
    mt_model_t m;
    if (init(&m, &cfg, NULL, Tf)) {
        mt_model_set_packing(&m, NULL, NULL);
        CHECK(m.doc_start == NULL && m.window == 0, "no window: a mask on plain rows");
        mt_model_free(&m);
    }
}

static double loss(const char *extra, const int32_t *tok, const int32_t *tgt)
{
    mt_config_t cfg;
    mt_model_t m;
    if (!init(&m, &cfg, extra, NT))
        return NAN;
    mt_model_init_weights(&m, 77);
    int64_t c;
    const double l = mt_model_step(&m, tok, tgt, false, 0, &c) / (double)c;
    mt_model_free(&m);
    return l;
}

static void test_losses(void)
{
    int32_t tok[NB * NT], tgt[NB * NT];
    mt_test_batch(NB * NT, 37, tok, tgt, 5);
    const double full = loss(NULL, tok, tgt), wide = loss("model.sliding_window=8", tok, tgt);
    const double wider = loss("model.sliding_window=100", tok, tgt);
    const double w3 = loss("model.sliding_window=3", tok, tgt);
    const double w7 = loss("model.sliding_window=7", tok, tgt);
    CHECK(isfinite(full) && full == wide && full == wider,
          "a window of at least the row: loss %.17g and %.17g, without one %.17g", wide, wider,
          full);
    CHECK(isfinite(w3) && w3 != full && isfinite(w7) && w7 != full && w3 != w7,
          "narrower windows change the loss: W=3 %.17g, W=7 %.17g, none %.17g", w3, w7, full);
}

int main(void)
{
    test_masks();
    test_losses();
    return mt_test_exit("test_model_window");
}
