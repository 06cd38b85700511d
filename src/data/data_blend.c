/* data_blend.c: a run's data as one dataset or a blend (mt_blend.h).
 *
 * Opens each entry's shards (with their loss masks), concatenates them,
 * packs each entry on its own when packing is on, and builds one cycle of
 * the deterministic interleaving.  Nothing here depends on the mesh: every
 * rank builds the same tables from the same files.  Not here: where the
 * paths come from (config and train). */
#include <config.h>

#include "mt_blend.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static mt_status_t open_entry(mt_blend_t *b, int e, const mt_blend_spec_t *spec,
                              const char (*paths)[MT_PATH_MAX])
{
    int n = spec->first[e + 1] - spec->first[e];
    if (n < 1)
        MT_FAIL(MT_ERR_CONFIG, "blend entry %d has no file", e);
    mt_dataset_t *parts = calloc((size_t)n, sizeof *parts);
    if (!parts)
        MT_FAIL(MT_ERR_NOMEM, "blend entry %d: %d files", e, n);
    mt_status_t s = MT_OK;
    for (int i = 0; i < n && s == MT_OK; i++) {
        const char *p = paths[spec->shard[spec->first[e] + i]];
        bool found;
        s = mt_dataset_open(&parts[i], p, b->o.format, b->o.vocab_size);
        if (s == MT_OK)
            s = mt_dataset_open_mask(&parts[i], b->o.loss_mask, &found);
    }
    if (s == MT_OK && n == 1) {
        b->ds[e] = parts[0];
        memset(&parts[0], 0, sizeof parts[0]);
    } else if (s == MT_OK) {
        s = mt_dataset_concat(&b->ds[e], parts, n);
    }
    for (int i = 0; i < n; i++)
        mt_dataset_close(&parts[i]);
    free(parts);
    if (s != MT_OK)
        return s;
    const mt_dataset_t *ds = &b->ds[e];
    if (b->o.packed) {
        MT_TRY(mt_pack_init(&b->pk[e], ds, b->o.seq_len, b->o.shuffle, b->o.seed + (uint64_t)e));
        b->samples[e] = b->pk[e].rows;
    } else {
        b->samples[e] = mt_dataset_num_samples(ds, b->o.seq_len);
        if (b->samples[e] < 1)
            MT_FAIL(MT_ERR_CONFIG, "%s: %lld tokens are fewer than one sample of seq_len %lld "
                    "+ 1", ds->path, (long long)ds->n_tokens, (long long)b->o.seq_len);
    }
    return MT_OK;
}

/* n_e by largest remainder, each at least 1, then the cycle's order. */
static mt_status_t build_cycle(mt_blend_t *b)
{
    int n = b->n;
    const int64_t P = MT_BLEND_CYCLE;
    if (n > P)
        MT_FAIL(MT_ERR_CONFIG, "%d blend entries: at most %lld", n, (long long)P);
    b->cyc_entry = malloc(sizeof *b->cyc_entry * (size_t)P);
    b->cyc_k = malloc(sizeof *b->cyc_k * (size_t)P);
    int64_t *taken = calloc((size_t)n, sizeof *taken);
    double *rem = calloc((size_t)n, sizeof *rem);
    if (!b->cyc_entry || !b->cyc_k || !taken || !rem) {
        free(taken), free(rem);
        MT_FAIL(MT_ERR_NOMEM, "blend: a cycle of %lld draws", (long long)P);
    }
    int64_t total = 0;
    for (int e = 0; e < n; e++) {
        double x = b->weight[e] * (double)P;
        b->per_cycle[e] = (int64_t)x;
        rem[e] = x - (double)b->per_cycle[e];
        total += b->per_cycle[e];
    }
    while (total < P) { /* the largest remainders (ties: the lowest e) get one more */
        int best = 0;
        for (int e = 1; e < n; e++)
            if (rem[e] > rem[best])
                best = e;
        b->per_cycle[best]++, rem[best] = -1, total++;
    }
    for (int e = 0; e < n; e++)
        while (b->per_cycle[e] < 1) { /* a tiny weight still draws: from the largest */
            int big = 0;
            for (int f = 1; f < n; f++)
                if (b->per_cycle[f] > b->per_cycle[big])
                    big = f;
            b->per_cycle[big]--, b->per_cycle[e]++;
        }
    for (int64_t p = 0; p < P; p++) {
        int best = -1;
        int64_t best_err = 0;
        for (int e = 0; e < n; e++) {
            if (taken[e] >= b->per_cycle[e])
                continue;
            int64_t err = b->per_cycle[e] * (p + 1) - P * taken[e];
            if (best < 0 || err > best_err)
                best = e, best_err = err;
        }
        assert(best >= 0);
        b->cyc_entry[p] = best;
        b->cyc_k[p] = (int32_t)taken[best]++;
    }
    free(taken), free(rem);
    return MT_OK;
}

mt_status_t mt_blend_open(mt_blend_t *b, const mt_blend_spec_t *spec,
                          const char (*paths)[MT_PATH_MAX], const mt_blend_options_t *o)
{
    memset(b, 0, sizeof *b);
    if (spec->n < 1)
        MT_FAIL(MT_ERR_CONFIG, "an empty blend: no token file");
    int n = spec->n;
    b->o = *o;
    b->ds = calloc((size_t)n, sizeof *b->ds);
    b->pk = calloc((size_t)n, sizeof *b->pk);
    b->weight = calloc((size_t)n, sizeof *b->weight);
    b->samples = calloc((size_t)n, sizeof *b->samples);
    b->per_cycle = calloc((size_t)n, sizeof *b->per_cycle);
    if (!b->ds || !b->pk || !b->weight || !b->samples || !b->per_cycle) {
        mt_blend_close(b);
        MT_FAIL(MT_ERR_NOMEM, "blend of %d entries", n);
    }
    b->n = n;
    double sum = 0;
    for (int e = 0; e < n; e++) {
        if (!(spec->weight[e] > 0) || spec->weight[e] > 1e300) {
            mt_blend_close(b);
            MT_FAIL(MT_ERR_CONFIG, "blend entry %d: weight %g must be a positive number", e,
                    spec->weight[e]);
        }
        sum += spec->weight[e];
    }
    for (int e = 0; e < n; e++)
        b->weight[e] = spec->weight[e] / sum;
    mt_status_t s = MT_OK;
    for (int e = 0; e < n && s == MT_OK; e++)
        s = open_entry(b, e, spec, paths);
    if (s == MT_OK && n > 1)
        s = build_cycle(b);
    if (s != MT_OK) {
        mt_error_trace(__FILE__, __LINE__);
        mt_blend_close(b);
    }
    return s;
}

void mt_blend_close(mt_blend_t *b)
{
    for (int e = 0; e < b->n; e++) {
        mt_dataset_close(&b->ds[e]);
        mt_pack_free(&b->pk[e]);
    }
    free(b->ds), free(b->pk), free(b->weight), free(b->samples), free(b->per_cycle);
    free(b->cyc_entry), free(b->cyc_k);
    memset(b, 0, sizeof *b);
}

void mt_blend_sample(const mt_blend_t *b, int64_t c, int *entry, int64_t *sample)
{
    assert(b->n >= 1 && c >= 0);
    int e = 0;
    int64_t k = c;
    if (b->n > 1) {
        int64_t q = c / MT_BLEND_CYCLE, p = c % MT_BLEND_CYCLE;
        e = b->cyc_entry[p];
        k = q * b->per_cycle[e] + b->cyc_k[p];
    }
    mt_sampler_t s = {b->samples[e], b->o.seq_len, b->o.shuffle, b->o.seed + (uint64_t)e};
    *entry = e;
    *sample = mt_sampler_index(&s, k);
}

int64_t mt_blend_draws(const mt_blend_t *b, int64_t d, int e)
{
    if (b->n == 1)
        return d;
    int64_t q = d / MT_BLEND_CYCLE, r = d % MT_BLEND_CYCLE, k = q * b->per_cycle[e];
    for (int64_t p = 0; p < r; p++)
        k += b->cyc_entry[p] == e;
    return k;
}

int64_t mt_blend_num_samples(const mt_blend_t *b)
{
    int64_t n = 0;
    for (int e = 0; e < b->n; e++)
        n += b->samples[e];
    return n;
}

mt_status_t mt_blend_fill_batch(const mt_blend_t *b, int64_t step, int64_t global,
                                int64_t dp_rank, int64_t dp_size, int64_t micro, int64_t local,
                                int32_t *inputs, int32_t *targets, int32_t *pos, int32_t *docs)
{
    int64_t S = b->o.seq_len, first = mt_batch_first(step, global, dp_rank, dp_size, micro, local);
    for (int64_t j = 0; j < local; j++) {
        int e;
        int64_t i;
        mt_blend_sample(b, first + j, &e, &i);
        if (b->o.packed)
            MT_TRY(mt_pack_fill_row(&b->pk[e], &b->ds[e], i, inputs + j * S, targets + j * S,
                                    pos + j * S, docs + j * S));
        else
            MT_TRY(mt_data_fill_sample(&b->ds[e], i, S, inputs + j * S, targets + j * S));
    }
    return MT_OK;
}

void mt_blend_report(const mt_blend_t *b, const char *what, int64_t draws, FILE *out)
{
    for (int e = 0; e < b->n; e++) {
        const mt_dataset_t *ds = &b->ds[e];
        int files = ds->n_parts ? ds->n_parts : 1, masked = mt_dataset_masked_parts(ds);
        fprintf(out, "%s", what);
        if (b->n > 1)
            fprintf(out, " entry %d", e);
        fprintf(out, ": %s: %d file%s, %lld tokens, %lld %s; loss mask: %s", ds->path, files,
                files > 1 ? "s" : "", (long long)ds->n_tokens, (long long)b->samples[e],
                b->o.packed ? "packed rows" : "samples",
                masked == files ? "yes" : masked == 0 ? "none" : "some files");
        if (masked && masked < files)
            fprintf(out, " (%d of %d; the others count every target)", masked, files);
        if (b->n > 1)
            fprintf(out, "; weight %.6f, realised %lld/%d = %.6f", b->weight[e],
                    (long long)b->per_cycle[e], MT_BLEND_CYCLE,
                    (double)b->per_cycle[e] / MT_BLEND_CYCLE);
        if (draws > 0) {
            int64_t k = mt_blend_draws(b, draws, e);
            fprintf(out, "; %lld of the run's %lld draws (%.2f epochs)", (long long)k,
                    (long long)draws,
                    (double)k / (double)b->samples[e]);
        }
        fputc('\n', out);
    }
}
