/* checkpoint_plan.c: which block of each tensor a rank writes.  A block is
 * rows x columns of dims 0 and 1 (whole rows when col_count is 0; dims 2
 * and up are always whole): a run of rows under FSDP, a column block of a
 * row-parallel linear under TP, or both.  This file resolves and names
 * blocks, checks one rank's blocks against the tensor's shape, and plans a
 * save: a tensor that every rank holds whole is written by rank 0 alone;
 * any other must be tiled by the ranks' blocks, every element saved by
 * exactly one rank.  Rank 0 checks the tiling exactly (a sweep over the
 * rows, below) and the verdict is agreed.
 *
 * It does no I/O (checkpoint_io.c) and knows nothing of directories
 * (checkpoint.c, checkpoint_dir.c).  Loads need no plan: any rank may read
 * any block. */
#include "checkpoint_internal.h"
#include "mt_comm.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ one block */

void mt_ckpt_block(const mt_ckpt_tensor_t *t, int64_t b[4])
{
    b[0] = t->row_offset;
    b[1] = t->row_count;
    b[2] = t->ndim > 1 ? t->col_offset : 0;
    b[3] = t->ndim > 1 ? (t->col_count ? t->col_count : t->shape[1]) : 1;
}

const char *mt_ckpt_block_text(const mt_ckpt_tensor_t *t, const int64_t b[4], char *buf,
                               size_t cap)
{
    int used = snprintf(buf, cap, "rows [%lld, %lld)", (long long)b[0], (long long)(b[0] + b[1]));
    if (t->ndim > 1 && !(b[2] == 0 && b[3] == t->shape[1]) && used >= 0 && (size_t)used < cap)
        snprintf(buf + used, cap - (size_t)used, " x columns [%lld, %lld)", (long long)b[2],
                 (long long)(b[2] + b[3]));
    return buf;
}

mt_status_t mt_ckpt_check_block(const mt_ckpt_tensor_t *t)
{
    if (t->row_offset < 0 || t->row_count < 0 || t->row_offset > t->shape[0] - t->row_count)
        MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %s: rows [%lld, %lld) are outside dim 0 of "
                "size %lld", t->path, (long long)t->row_offset,
                (long long)(t->row_offset + t->row_count), (long long)t->shape[0]);
    if (t->ndim == 1 && (t->col_offset != 0 || t->col_count != 0))
        MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %s: col_offset %lld and col_count %lld for a "
                "1-D tensor; both must be 0", t->path, (long long)t->col_offset,
                (long long)t->col_count);
    if (t->ndim > 1 && t->col_count == 0 && t->col_offset != 0)
        MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %s: col_offset %lld with col_count 0, which "
                "means all of dim 1: col_offset must be 0", t->path, (long long)t->col_offset);
    if (t->ndim > 1 && (t->col_offset < 0 || t->col_count < 0 ||
                        t->col_offset > t->shape[1] - t->col_count))
        MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %s: columns [%lld, %lld) are outside dim 1 of "
                "size %lld", t->path, (long long)t->col_offset,
                (long long)(t->col_offset + t->col_count), (long long)t->shape[1]);
    int64_t b[4];
    mt_ckpt_block(t, b);
    char text[128];
    if (b[1] > 0 && !t->data)
        MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %s: %s but no data", t->path,
                mt_ckpt_block_text(t, b, text, sizeof text));
    return MT_OK;
}

/* ------------------------------------------------------------ the tiling */

/* Rank 0 holds every rank's block of m tensors, rank-major: the block of
 * tensor i on rank q is all[4 * (q * m + i)].  Sweeping the rows from top
 * to bottom, a block is inserted into the active set at its first row and
 * removed after its last.  The active blocks are kept disjoint and sorted
 * by first column, so a new block can only overlap its two neighbours
 * there; between consecutive event rows the set is fixed, and the rows in
 * between are tiled exactly when the active widths add up to dim 1.  That
 * is exact for any blocks, at O(k log k) for k non-empty blocks (plus
 * moves within the active array, at most k each). */
typedef struct {
    int64_t row;
    int insert; /* 0 (removals first at the same row: blocks are half-open) */
    int64_t col;
    int rank;
} event_t;

static int by_row(const void *a, const void *b)
{
    const event_t *x = a, *y = b;
    if (x->row != y->row)
        return x->row < y->row ? -1 : 1;
    if (x->insert != y->insert)
        return x->insert - y->insert;
    if (x->col != y->col)
        return x->col < y->col ? -1 : 1;
    return x->rank - y->rank;
}

typedef struct {
    const mt_ckpt_tensor_t *t;
    const int64_t *all;
    int m, i;
    event_t *ev; /* 2 * ranks */
    int *act;    /* ranks: active blocks by first column */
    int na;
} sweep_t;

static const int64_t *blk(const sweep_t *w, int q) { return w->all + 4 * ((size_t)q * w->m + w->i); }

/* First active position whose block starts at or after column c. */
static int active_from(const sweep_t *w, int64_t c)
{
    int lo = 0, hi = w->na;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (blk(w, w->act[mid])[2] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static mt_status_t overlap(const sweep_t *w, int q1, int q2)
{
    char a[128], b[128];
    mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__,
                 "checkpoint tensor %s: rank %d's %s overlap rank %d's %s: every element must be "
                 "saved by exactly one rank", w->t->path, q1,
                 mt_ckpt_block_text(w->t, blk(w, q1), a, sizeof a), q2,
                 mt_ckpt_block_text(w->t, blk(w, q2), b, sizeof b));
    mt_error_hint("split the tensor over the ranks, or give a tensor held by some ranks but not "
                  "all to one of them (row_count 0 on the others)");
    return MT_ERR_RANGE;
}

/* Row `row` is not tiled by the active blocks: name its first hole. */
static mt_status_t hole(const sweep_t *w, int64_t row)
{
    int64_t col = 0;
    for (int k = 0; k < w->na && blk(w, w->act[k])[2] == col; k++)
        col += blk(w, w->act[k])[3];
    if (w->na == 0)
        mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__, "checkpoint tensor %s: row %lld is saved "
                     "by no rank: every element must be saved by exactly one rank", w->t->path,
                     (long long)row);
    else
        mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__, "checkpoint tensor %s: row %lld, column "
                     "%lld is saved by no rank: every element must be saved by exactly one rank",
                     w->t->path, (long long)row, (long long)col);
    mt_error_hint("split the tensor's rows (and columns) over the ranks so that their blocks "
                  "cover it, or give a tensor held by some ranks but not all to one of them");
    return MT_ERR_RANGE;
}

static mt_status_t check_tiling(sweep_t *w, int ranks)
{
    int64_t rows = w->t->shape[0], cols = w->t->ndim > 1 ? w->t->shape[1] : 1;
    int ne = 0;
    for (int q = 0; q < ranks; q++) {
        const int64_t *b = blk(w, q);
        if (b[1] > 0 && b[3] > 0) {
            w->ev[ne++] = (event_t){b[0], 1, b[2], q};
            w->ev[ne++] = (event_t){b[0] + b[1], 0, b[2], q};
        }
    }
    qsort(w->ev, (size_t)ne, sizeof *w->ev, by_row);
    int64_t covered = 0, done = 0; /* columns active; rows [0, done) are tiled */
    w->na = 0;
    for (int e = 0; e <= ne; e++) {
        int64_t y = e < ne ? w->ev[e].row : rows;
        if (y > done) {
            if (covered != cols)
                return hole(w, done);
            done = y;
        }
        if (e == ne)
            break;
        int q = w->ev[e].rank;
        const int64_t *b = blk(w, q);
        int p = active_from(w, b[2]);
        if (!w->ev[e].insert) { /* act[p] is q: the active blocks start at distinct columns */
            memmove(w->act + p, w->act + p + 1, sizeof *w->act * (size_t)(w->na - p - 1));
            w->na--;
            covered -= b[3];
            continue;
        }
        if (p > 0 && blk(w, w->act[p - 1])[2] + blk(w, w->act[p - 1])[3] > b[2])
            return overlap(w, w->act[p - 1], q);
        if (p < w->na && b[2] + b[3] > blk(w, w->act[p])[2])
            return overlap(w, w->act[p], q);
        memmove(w->act + p + 1, w->act + p, sizeof *w->act * (size_t)(w->na - p));
        w->act[p] = q;
        w->na++;
        covered += b[3];
    }
    return MT_OK;
}

/* ------------------------------------------------------------ the plan */

mt_status_t mt_ckpt_plan_writes(MPI_Comm comm, const mt_ckpt_tensor_t *t, int n,
                                mt_ckpt_tensor_t **out)
{
    enum { CHUNK = 64 }; /* tensors per exchange: rank 0 holds ranks * 2 KiB */
    int rank, size;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    *out = NULL;
    mt_ckpt_tensor_t *w = malloc(sizeof *w * (size_t)(n ? n : 1));
    int64_t *all = NULL;
    event_t *ev = NULL;
    int *act = NULL;
    if (rank == 0) {
        all = malloc(sizeof *all * 4 * CHUNK * (size_t)size);
        ev = malloc(sizeof *ev * 2 * (size_t)size);
        act = malloc(sizeof *act * (size_t)size);
    }
    mt_status_t s = w && (rank != 0 || (all && ev && act))
                        ? MT_OK
                        : mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__,
                                       "checkpoint: %d tensor descriptors, %d ranks' blocks", n,
                                       size);
    s = mt_agree(comm, s);
    if (s == MT_OK && n)
        memcpy(w, t, sizeof *w * (size_t)n);
    int64_t mine[4 * CHUNK];
    int whole[CHUNK], nwhole[CHUNK];
    for (int base = 0; base < n && s == MT_OK; base += CHUNK) {
        int m = n - base < CHUNK ? n - base : CHUNK;
        for (int i = 0; i < m; i++) {
            const mt_ckpt_tensor_t *x = &t[base + i];
            int64_t *b = mine + 4 * i;
            mt_ckpt_block(x, b);
            whole[i] = b[0] == 0 && b[1] == x->shape[0] && b[2] == 0 &&
                       b[3] == (x->ndim > 1 ? x->shape[1] : 1);
        }
        int rc = MPI_Allreduce(whole, nwhole, m, MPI_INT, MPI_SUM, comm);
        if (rc == MPI_SUCCESS)
            rc = MPI_Gather(mine, 4 * m, MPI_INT64_T, all, 4 * m, MPI_INT64_T, 0, comm);
        if (rc != MPI_SUCCESS) {
            s = mt_error_mpi(rc, "checkpoint: exchanging the ranks' blocks", __FILE__, __LINE__);
            break;
        }
        for (int i = 0; i < m && rank == 0 && s == MT_OK; i++) {
            sweep_t sw = {&t[base + i], all, m, i, ev, act, 0};
            if (nwhole[i] != size)
                s = check_tiling(&sw, size);
        }
        s = mt_agree(comm, s);
        for (int i = 0; i < m && s == MT_OK; i++)
            if (nwhole[i] == size && rank != 0)
                w[base + i].row_count = 0;
    }
    free(act);
    free(ev);
    free(all);
    if (s != MT_OK) {
        free(w);
        return s;
    }
    *out = w;
    return MT_OK;
}
