/* pack.c: greedy first-fit packing of documents into rows (mt_pack.h). */
#include "mt_pack.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t cap, n;
    int64_t *start;
    int32_t *len;
    int64_t *row; /* row of each piece */
} pieces_t;

static mt_status_t push(pieces_t *p, int64_t start, int64_t len, int64_t row)
{
    if (p->n == p->cap) {
        int64_t cap = p->cap ? 2 * p->cap : 1024;
        int64_t *s = realloc(p->start, sizeof *s * (size_t)cap);
        if (s)
            p->start = s;
        int32_t *l = realloc(p->len, sizeof *l * (size_t)cap);
        if (l)
            p->len = l;
        int64_t *r = realloc(p->row, sizeof *r * (size_t)cap);
        if (r)
            p->row = r;
        if (!s || !l || !r)
            MT_FAIL(MT_ERR_NOMEM, "packing: %lld pieces", (long long)cap);
        p->cap = cap;
    }
    p->start[p->n] = start, p->len[p->n] = (int32_t)len, p->row[p->n] = row;
    p->n++;
    return MT_OK;
}

mt_status_t mt_pack_init(mt_packing_t *pk, const mt_dataset_t *ds, int64_t S, bool shuffle,
                         uint64_t seed)
{
    memset(pk, 0, sizeof *pk);
    if (S < 2 || S > 2147483647LL)
        MT_FAIL(MT_ERR_RANGE, "packed_sequence_size %lld: must be in [2, 2^31)", (long long)S);
    if (ds->n_docs < 1)
        MT_FAIL(MT_ERR_IO, "%s: no documents to pack", ds->path);
    pk->S = S;
    /* the window: open rows, oldest first, and the room left in each */
    int64_t win_row[MT_PACK_WINDOW], win_room[MT_PACK_WINDOW];
    int nwin = 0;
    pieces_t p = {0};
    mt_sampler_t order = {ds->n_docs, 1, shuffle, seed};
    mt_status_t st = MT_OK;
    for (int64_t c = 0; c < ds->n_docs && st == MT_OK; c++) {
        int64_t d = mt_sampler_index(&order, c);
        int64_t a = ds->doc_start[d], end = ds->doc_start[d + 1];
        for (; a < end && st == MT_OK; a += S) {
            int64_t len = end - a < S ? end - a : S;
            if (len < 2)
                continue; /* one token: nothing to predict */
            int w = 0;
            while (w < nwin && win_room[w] < len)
                w++;
            if (w == nwin) { /* a new row; the oldest leaves a full window */
                if (nwin == MT_PACK_WINDOW) {
                    memmove(win_row, win_row + 1, sizeof win_row[0] * (MT_PACK_WINDOW - 1));
                    memmove(win_room, win_room + 1, sizeof win_room[0] * (MT_PACK_WINDOW - 1));
                    nwin--, w--;
                }
                win_row[nwin] = pk->rows++, win_room[nwin] = S;
                w = nwin++;
            }
            st = push(&p, a, len, win_row[w]);
            pk->tokens += len;
            win_room[w] -= len;
            if (win_room[w] < 2) { /* full: nothing that has a target fits */
                memmove(win_row + w, win_row + w + 1, sizeof win_row[0] * (size_t)(nwin - w - 1));
                memmove(win_room + w, win_room + w + 1, sizeof win_room[0] * (size_t)(nwin - w - 1));
                nwin--;
            }
        }
    }
    /* CSR by row; pieces keep their packing order inside a row */
    pk->row_seg = calloc((size_t)pk->rows + 1, sizeof *pk->row_seg);
    pk->seg_start = malloc(sizeof *pk->seg_start * (size_t)(p.n ? p.n : 1));
    pk->seg_len = malloc(sizeof *pk->seg_len * (size_t)(p.n ? p.n : 1));
    if (st == MT_OK && (!pk->row_seg || !pk->seg_start || !pk->seg_len))
        st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "packing: %lld rows", (long long)pk->rows);
    if (st == MT_OK) {
        for (int64_t i = 0; i < p.n; i++)
            pk->row_seg[p.row[i] + 1]++;
        for (int64_t r = 0; r < pk->rows; r++)
            pk->row_seg[r + 1] += pk->row_seg[r];
        int64_t *fill = calloc((size_t)pk->rows + 1, sizeof *fill);
        if (!fill) {
            st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "packing");
        } else {
            for (int64_t i = 0; i < p.n; i++) {
                int64_t k = pk->row_seg[p.row[i]] + fill[p.row[i]]++;
                pk->seg_start[k] = p.start[i], pk->seg_len[k] = p.len[i];
            }
            free(fill);
        }
        pk->pieces = p.n;
    }
    free(p.start), free(p.len), free(p.row);
    if (st == MT_OK && pk->rows == 0)
        st = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: no document has two tokens to "
                          "pack", ds->path);
    if (st != MT_OK) {
        mt_pack_free(pk);
        mt_error_trace(__FILE__, __LINE__);
    }
    return st;
}

void mt_pack_free(mt_packing_t *pk)
{
    free(pk->row_seg), free(pk->seg_start), free(pk->seg_len);
    memset(pk, 0, sizeof *pk);
}

mt_status_t mt_pack_fill_row(const mt_packing_t *pk, const mt_dataset_t *ds, int64_t r,
                             int32_t *inputs, int32_t *targets, int32_t *pos, int32_t *doc_start)
{
    assert(r >= 0 && r < pk->rows);
    int64_t t = 0;
    for (int64_t k = pk->row_seg[r]; k < pk->row_seg[r + 1]; k++) {
        int64_t n = pk->seg_len[k];
        MT_TRY(mt_dataset_check(ds, pk->seg_start[k], n));
        mt_dataset_read(ds, pk->seg_start[k], n, inputs + t);
        for (int64_t i = 0; i < n; i++) {
            targets[t + i] = i + 1 < n ? inputs[t + i + 1] : MT_IGNORE_INDEX;
            pos[t + i] = (int32_t)i;
            doc_start[t + i] = (int32_t)t;
        }
        /* the loss mask moves with its document: token i's target is token
         * i + 1 of the same piece */
        for (int64_t a = 1; a < n && (ds->mask || ds->n_parts > 0); a += 512) {
            unsigned char m[512];
            int64_t len = n - a < 512 ? n - a : 512;
            mt_dataset_read_mask(ds, pk->seg_start[k] + a, len, m);
            for (int64_t i = 0; i < len; i++)
                if (!m[i])
                    targets[t + a - 1 + i] = MT_IGNORE_INDEX;
        }
        t += n;
    }
    /* padding: its own document, nothing to predict */
    for (int64_t i = t; i < pk->S; i++) {
        inputs[i] = 0;
        targets[i] = MT_IGNORE_INDEX;
        pos[i] = (int32_t)(i - t);
        doc_start[i] = (int32_t)t;
    }
    return MT_OK;
}

mt_status_t mt_pack_fill_batch(const mt_packing_t *pk, const mt_dataset_t *ds, const mt_sampler_t *s,
                        int64_t step, int64_t global, int64_t dp_rank, int64_t dp_size,
                        int64_t micro, int64_t local, int32_t *inputs, int32_t *targets,
                        int32_t *pos, int32_t *doc_start)
{
    int64_t first = mt_batch_first(step, global, dp_rank, dp_size, micro, local), S = pk->S;
    for (int64_t j = 0; j < local; j++)
        MT_TRY(mt_pack_fill_row(pk, ds, mt_sampler_index(s, first + j), inputs + j * S,
                                targets + j * S, pos + j * S, doc_start + j * S));
    return MT_OK;
}
