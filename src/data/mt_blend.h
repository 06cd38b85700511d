/* mt_blend.h: the data a run trains on: one dataset or a blend of several
 * (dataset.paths), each one file or several concatenated, rows packed or
 * not, targets masked by the loss masks.
 *
 * Sampling contract (doc/data.md): draw c of the run (mt_batch_first
 * numbers them) is sample i of entry e, fixed by the data, the weights,
 * seq_len, shuffle and seed alone, never by the mesh or by a resume:
 *  - one entry: e = 0 and i is mt_sampler_index(c), as for a single file;
 *  - a blend: the normalised weights give each entry n_e draws out of
 *    every cycle of MT_BLEND_CYCLE draws (largest remainder, at least one
 *    each).  Inside a cycle, draw p goes to the entry furthest behind its
 *    share, the largest n_e (p + 1) - P taken_e among entries with draws
 *    left (ties: the lowest e), in integers.  Draw c is then cycle
 *    q = c / P, position p = c % P, entry e = E[p], its k-th draw with
 *    k = q n_e + K[p]; i = entry e's own sampler at k (its epochs, and
 *    with shuffle its permutation keyed by seed + e).
 * So the realised proportions are n_e / P in every cycle and each
 * entry's samples are visited as a dataset of its own would be. */
#ifndef MT_BLEND_H
#define MT_BLEND_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_config.h"
#include "mt_data.h"
#include "mt_pack.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_BLEND_CYCLE 65536

typedef struct {
    mt_data_format_t format;
    int64_t vocab_size;
    int64_t seq_len;          /* S: the sample, or the packed row */
    bool packed;
    bool shuffle;
    uint64_t seed;
    mt_loss_mask_t loss_mask;
} mt_blend_options_t;

typedef struct {
    int n;                    /* entries */
    mt_blend_options_t o;
    mt_dataset_t *ds;         /* [n]: each entry, one file or a concatenation */
    mt_packing_t *pk;         /* [n] when o.packed */
    double *weight;           /* [n] normalised */
    int64_t *samples;         /* [n] samples (packed rows) of each entry */
    int64_t *per_cycle;       /* [n] n_e: draws per cycle (a blend) */
    int32_t *cyc_entry;       /* [MT_BLEND_CYCLE] E (a blend) */
    int32_t *cyc_k;           /* [MT_BLEND_CYCLE] K (a blend) */
} mt_blend_t;

/* Open the entries of spec: shard s of entry e is paths[spec->shard[s]]
 * (paths indexed like the spec's items).  Every shard's mask by
 * o->loss_mask. */
mt_status_t mt_blend_open(mt_blend_t *b, const mt_blend_spec_t *spec,
                          const char (*paths)[MT_PATH_MAX], const mt_blend_options_t *o);
void mt_blend_close(mt_blend_t *b);

/* Entry and entry sample of draw c. */
void mt_blend_sample(const mt_blend_t *b, int64_t c, int *entry, int64_t *sample);

/* Draws of entry e among the first d draws. */
int64_t mt_blend_draws(const mt_blend_t *b, int64_t d, int e);

/* Samples of all entries together. */
int64_t mt_blend_num_samples(const mt_blend_t *b);

/* One micro-batch as mt_data_fill_batch (every window checked:
 * mt_dataset_check); pos and docs ([local, S]) are
 * filled for packed rows only (may be NULL otherwise). */
mt_status_t mt_blend_fill_batch(const mt_blend_t *b, int64_t step, int64_t global,
                                int64_t dp_rank, int64_t dp_size, int64_t micro, int64_t local,
                                int32_t *inputs, int32_t *targets, int32_t *pos, int32_t *docs);

/* The log's lines on the entries: files, masks, samples, weights and the
 * realised proportions, and each entry's draws over `draws` draws. */
void mt_blend_report(const mt_blend_t *b, const char *what, int64_t draws, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
