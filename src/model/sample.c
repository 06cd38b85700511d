/* sample.c: the next token from logits (mt_decode.h): greedy, or a draw
 * at a temperature from the top-k / top-p part of the distribution.
 *
 * The draw is one uniform of the counter-based generator (mt_rng.h) per
 * generated position, so a seed fixes the ids on every machine and rank;
 * the probabilities are formed in double from float32 logits, and the
 * order of candidates is by probability, ties by lower id, so nothing
 * depends on a sort's stability.  No logit processors beyond these
 * (repetition penalties and the like are not here). */
#include "mt_decode.h"

#include <math.h>
#include <stdlib.h>

#include "mt_rng.h"

typedef struct {
    float l;
    int32_t id;
} cand_t;

void mt_sample_opts_init(mt_sample_opts_t *o)
{
    o->greedy = false;
    o->temperature = 1.0;
    o->top_k = 0;
    o->top_p = 1.0;
    o->seed = 0;
}

mt_status_t mt_sample_opts_check(const mt_sample_opts_t *o)
{
    if (!(o->temperature >= 0.0) || !isfinite(o->temperature))
        MT_FAIL(MT_ERR_CONFIG, "temperature %g: a finite number >= 0 (0: greedy)",
                o->temperature);
    if (o->top_k < 0)
        MT_FAIL(MT_ERR_CONFIG, "top_k %lld: >= 0 (0: no limit)", (long long)o->top_k);
    if (!(o->top_p > 0.0 && o->top_p <= 1.0))
        MT_FAIL(MT_ERR_CONFIG, "top_p %g: in (0, 1] (1: no limit)", o->top_p);
    return MT_OK;
}

size_t mt_sample_scratch_bytes(int64_t V)
{
    return (size_t)V * (sizeof(double) + sizeof(cand_t));
}

static int32_t argmax(const float *l, int64_t V)
{
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (l[i] > l[best])
            best = i;
    return (int32_t)best;
}

/* higher logit first (the same order as probability), then lower id */
static int by_logit(const void *pa, const void *pb)
{
    const cand_t *a = pa, *b = pb;
    if (a->l != b->l)
        return a->l > b->l ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

int32_t mt_sample(const float *logits, int64_t V, const mt_sample_opts_t *o, uint64_t step,
                  void *scratch)
{
    if (o->greedy || o->temperature == 0.0)
        return argmax(logits, V);
    void *mem = scratch ? scratch : malloc(mt_sample_scratch_bytes(V));
    if (!mem) /* no memory for the candidates: the most likely one */
        return argmax(logits, V);
    double *p = mem;
    cand_t *cd = (cand_t *)(p + V);
    for (int64_t i = 0; i < V; i++)
        cd[i] = (cand_t){logits[i], (int32_t)i};
    qsort(cd, (size_t)V, sizeof *cd, by_logit);
    int64_t keep = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    const double mx = cd[0].l, inv_t = 1.0 / o->temperature;
    double z = 0.0;
    for (int64_t i = 0; i < keep; i++) {
        p[i] = exp(((double)cd[i].l - mx) * inv_t);
        z += p[i];
    }
    if (o->top_p < 1.0) { /* the smallest prefix whose mass reaches top_p */
        double c = 0.0;
        int64_t n = 0;
        while (n < keep) {
            c += p[n++] / z;
            if (c >= o->top_p)
                break;
        }
        keep = n;
        z = 0.0;
        for (int64_t i = 0; i < keep; i++)
            z += p[i];
    }
    const double u = mt_rng_uniform(o->seed, mt_rng_stream("generate"), step) * z;
    double c = 0.0;
    int32_t tok = cd[keep - 1].id;
    for (int64_t i = 0; i < keep; i++) {
        c += p[i];
        if (u < c) {
            tok = cd[i].id;
            break;
        }
    }
    if (!scratch)
        free(mem);
    return tok;
}
