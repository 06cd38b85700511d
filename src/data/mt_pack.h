/* mt_pack.h: packed sequences (packed_sequence.packed_sequence_size > 0).
 *
 * The documents of a data set (mt_dataset_t.doc_start: the Megatron .idx
 * sequences, or llm.c tokens split after each end-of-document token) are
 * packed into rows of exactly S tokens.  Documents are taken in a
 * seed-determined order (the sampler's permutation of document indices,
 * or file order without shuffle); a document longer than S is cut into
 * pieces of S tokens (and a last shorter one), each then packed as a
 * document of its own; one-token pieces carry no target and are dropped.
 * Packing is greedy first-fit over a window of the MT_PACK_WINDOW newest
 * open rows: a piece goes into the oldest open row of the window with room
 * for it, else opens a new row; a row leaves the window when full or when
 * the window overflows.  The result depends only on the data, S and the
 * seed, never on the mesh, so every rank computes it identically.
 *
 * Each row carries its tokens, targets (the next token of the same
 * document; -100 for a document's last token and for the padding that
 * ends a row that is not full), position ids restarting at 0 in every
 * document, and per token the index in the row of its document's first
 * token (doc_start, what the block-diagonal causal attention mask needs).
 * Packed rows are the samples of the sampling contract (doc/data.md). */
#ifndef MT_PACK_H
#define MT_PACK_H

#include <stdbool.h>
#include <stdint.h>

#include "mt_data.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_PACK_WINDOW 64

typedef struct {
    int64_t S;          /* row length */
    int64_t rows;
    int64_t *row_seg;   /* [rows + 1]: row r holds pieces row_seg[r] .. row_seg[r+1]-1 */
    int64_t *seg_start; /* piece: first token offset in the data set */
    int32_t *seg_len;   /* piece: length (2 .. S) */
    int64_t pieces, tokens; /* totals (tokens packed, without padding) */
} mt_packing_t;

/* Pack every document of ds into rows of S tokens. */
mt_status_t mt_pack_init(mt_packing_t *pk, const mt_dataset_t *ds, int64_t S, bool shuffle,
                         uint64_t seed);
void mt_pack_free(mt_packing_t *pk);

/* Row r: inputs, targets, pos and doc_start, each [S]. */
mt_status_t mt_pack_fill_row(const mt_packing_t *pk, const mt_dataset_t *ds, int64_t r,
                             int32_t *inputs,
                      int32_t *targets, int32_t *pos, int32_t *doc_start);

/* mt_data_fill_batch for packed rows (s->num_samples = pk->rows): `local`
 * rows, each with its pos and doc_start. */
mt_status_t mt_pack_fill_batch(const mt_packing_t *pk, const mt_dataset_t *ds, const mt_sampler_t *s,
                        int64_t step, int64_t global, int64_t dp_rank, int64_t dp_size,
                        int64_t micro, int64_t local, int32_t *inputs, int32_t *targets,
                        int32_t *pos, int32_t *doc_start);

#ifdef __cplusplus
}
#endif
#endif
