/* test_checkpoint_blocks.c: checkpoint tensors held as blocks of rows x
 * columns, as tensor parallelism holds row-parallel linears (o_proj,
 * down_proj: a column block of [out, in]).  Part of test_checkpoint, so
 * it runs at 1 and 4 ranks.
 *
 * Saves column blocks and a grid of blocks (2 x 2 at 4 ranks), reads each
 * back whole on one rank and with other splits (row runs, column blocks
 * in reverse, a grid, everyone whole) and compares every value bit for
 * bit, and against a plain serial HDF5 read of the full tensor.  Refuses,
 * on every rank and naming the tensor: a block outside the tensor, column
 * fields on a 1-D tensor, blocks that leave a hole, blocks that overlap
 * (also when the element counts still add up). */
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mt_checkpoint.h"
#include "mt_test.h"
#include "test_checkpoint.h"

static MPI_Comm comm;
static int rank, nranks;
static char dir[700];

#define NB 3
static const char *const names[NB] = {
    "/model/model.layers.0.self_attn.o_proj.weight",
    "/model/model.layers.0.post_attention_layernorm.weight",
    "/optim/model.layers.0.mlp.experts.down_proj/exp_avg",
};
static const int ndims[NB] = {2, 1, 3};
static const int64_t shapes[NB][4] = {{6, 8}, {5}, {4, 6, 3}};

/* Whole rows (col_count 0) unless a mode says otherwise; 1-D tensors are
 * split by rows wherever the others are split by columns. */
typedef enum { B_COLS, B_COLS_REV, B_GRID, B_ROWS, B_ONE, B_ALL_EXPLICIT } layout_t;

static float value(int t, int64_t idx, int64_t step)
{
    return (float)(t * 1000 + idx) * 0.5f - 100.25f + (float)step; /* exact in float */
}

static int64_t inner(int i) { return ndims[i] > 2 ? shapes[i][2] : 1; }
static int64_t cols(int i) { return ndims[i] > 1 ? shapes[i][1] : 1; }

/* [n * k / parts, n * (k + 1) / parts) */
static void part(int64_t n, int k, int parts, int64_t *off, int64_t *cnt)
{
    *off = n * k / parts;
    *cnt = n * (k + 1) / parts - *off;
}

/* Rank q's block of tensor i: b = {row_offset, row_count, col_offset, col_count}. */
static void block_of(layout_t mode, int i, int q, int64_t b[4])
{
    int64_t rows = shapes[i][0];
    int two_d = ndims[i] > 1;
    b[0] = 0, b[1] = rows, b[2] = 0, b[3] = 0;
    int pc = nranks % 2 == 0 ? 2 : 1, pr = nranks / pc;
    switch (mode) {
    case B_COLS:
    case B_COLS_REV: {
        int k = mode == B_COLS ? q : nranks - 1 - q;
        if (two_d)
            part(cols(i), k, nranks, &b[2], &b[3]);
        else
            part(rows, k, nranks, &b[0], &b[1]);
        break;
    }
    case B_GRID:
        if (two_d) {
            part(rows, q / pc, pr, &b[0], &b[1]);
            part(cols(i), q % pc, pc, &b[2], &b[3]);
        } else {
            part(rows, q, nranks, &b[0], &b[1]);
        }
        break;
    case B_ROWS:
        part(rows, q, nranks, &b[0], &b[1]);
        break;
    case B_ONE:
        b[1] = q == 0 ? rows : 0;
        break;
    case B_ALL_EXPLICIT:
        b[3] = two_d ? cols(i) : 0;
        break;
    }
}

/* Expected value of element (r, c, k) of tensor i. */
static float expected(int i, int64_t r, int64_t c, int64_t k, int64_t step)
{
    return value(i, (r * cols(i) + c) * inner(i) + k, step);
}

static int64_t block_elems(const mt_ckpt_tensor_t *t, int i)
{
    int64_t cc = t->col_count ? t->col_count : cols(i);
    return t->row_count * cc * inner(i);
}

static void make(mt_ckpt_tensor_t *t, layout_t mode, int64_t step, int fill)
{
    memset(t, 0, sizeof *t * NB);
    for (int i = 0; i < NB; i++) {
        snprintf(t[i].path, sizeof t[i].path, "%s", names[i]);
        t[i].ndim = ndims[i];
        memcpy(t[i].shape, shapes[i], sizeof t[i].shape);
        int64_t b[4];
        block_of(mode, i, rank, b);
        t[i].row_offset = b[0], t[i].row_count = b[1];
        t[i].col_offset = b[2], t[i].col_count = b[3];
        int64_t n = block_elems(&t[i], i), cc = b[3] ? b[3] : cols(i), at = 0;
        t[i].data = malloc(sizeof(float) * (size_t)(n ? n : 1));
        for (int64_t r = 0; r < b[1]; r++)
            for (int64_t c = 0; c < cc; c++)
                for (int64_t k = 0; k < inner(i); k++)
                    t[i].data[at++] = fill ? expected(i, b[0] + r, b[2] + c, k, step) : -12345.0f;
    }
}

static void release(mt_ckpt_tensor_t *t)
{
    for (int i = 0; i < NB; i++)
        free(t[i].data);
}

/* Values of this rank's blocks that differ, bit for bit, from the writer's. */
static int64_t differing(const mt_ckpt_tensor_t *t, int64_t step)
{
    int64_t bad = 0;
    for (int i = 0; i < NB; i++) {
        int64_t cc = t[i].col_count ? t[i].col_count : cols(i), at = 0;
        for (int64_t r = 0; r < t[i].row_count; r++)
            for (int64_t c = 0; c < cc; c++)
                for (int64_t k = 0; k < inner(i); k++) {
                    float want = expected(i, t[i].row_offset + r, t[i].col_offset + c, k, step);
                    bad += memcmp(&t[i].data[at++], &want, sizeof want) != 0;
                }
    }
    return bad;
}

static mt_status_t save(int64_t step, layout_t mode, void (*edit)(mt_ckpt_tensor_t *))
{
    mt_ckpt_tensor_t t[NB];
    make(t, mode, step, 1);
    if (edit)
        edit(t);
    mt_train_state_t st = {step, step * 8, 0, 99, 0};
    mt_status_t s = mt_ckpt_save(comm, dir, t, NB, &st, "model: {}\n", "blocks", 0);
    release(t);
    return s;
}

static void expect_ok(mt_status_t s, const char *what)
{
    int mine = (int)s, hi;
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, comm);
    CHECK(hi == MT_OK, "%s failed (rank %d: %s)", what, rank, mt_error_message());
}

static void expect_refused(mt_status_t s, const char *what, const char *needle)
{
    int mine = (int)s, lo, hi;
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, comm);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, comm);
    CHECK(lo == hi && lo == (int)MT_ERR_RANGE, "%s: rank %d: statuses %d..%d, expected %d "
          "everywhere (%s)", what, rank, lo, hi, (int)MT_ERR_RANGE, mt_error_message());
    CHECK_CONTAINS(mt_error_message(), needle);
}

static const char *step_dir(int64_t step)
{
    static char buf[800];
    snprintf(buf, sizeof buf, "%s/step_%08lld", dir, (long long)step);
    return buf;
}

/* Load step with the given split and compare every value. */
static void read_back(int64_t step, layout_t mode, const char *what)
{
    mt_ckpt_tensor_t t[NB];
    make(t, mode, step, 0);
    expect_ok(mt_ckpt_load(comm, step_dir(step), t, NB, NULL), what);
    int64_t bad = differing(t, step);
    CHECK(bad == 0, "%s: rank %d: %lld values differ", what, rank, (long long)bad);
    release(t);
}

/* The o_proj tensor read whole by plain serial HDF5 on rank 0. */
static void serial_check(int64_t step)
{
    if (rank != 0)
        return;
    char file[900];
    snprintf(file, sizeof file, "%s/model.h5", step_dir(step));
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = f >= 0 ? H5Dopen2(f, names[0], H5P_DEFAULT) : -1;
    float all[48];
    CHECK(d >= 0 && H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) >= 0,
          "serial read of %s", names[0]);
    int bad = 0;
    for (int k = 0; k < 48; k++)
        bad += all[k] != value(0, k, step);
    CHECK(bad == 0, "serial read of step %lld: %d values differ", (long long)step, bad);
    if (d >= 0)
        H5Dclose(d);
    if (f >= 0)
        H5Fclose(f);
}

/* ------------------------------------------------------------ refusals */

static void outside(mt_ckpt_tensor_t *t)
{
    if (rank == nranks - 1)
        t[0].col_offset = 7, t[0].col_count = 2;
}

static void cols_on_1d(mt_ckpt_tensor_t *t)
{
    if (rank == 0)
        t[1].col_count = 1;
}

static void offset_without_count(mt_ckpt_tensor_t *t)
{
    if (rank == nranks - 1)
        t[0].col_offset = 1, t[0].col_count = 0;
}

static void last_column_missing(mt_ckpt_tensor_t *t)
{
    if (rank == nranks - 1)
        t[0].col_count--;
}

static void grid_block_missing(mt_ckpt_tensor_t *t) /* 4 ranks: rank 2 has rows [3, 6) */
{
    if (rank == 2)
        t[0].row_count = 0;
}

static void grid_rows_overlap(mt_ckpt_tensor_t *t) /* 4 ranks: rank 2 takes row 2 too */
{
    if (rank == 2)
        t[0].row_offset = 2, t[0].row_count = 4;
}

static void column_overlap(mt_ckpt_tensor_t *t) /* rank 1 takes rank 0's last column too */
{
    if (rank == 1)
        t[0].col_offset--, t[0].col_count++;
}

static void overlap_same_total(mt_ckpt_tensor_t *t) /* and the last rank gives one up */
{
    column_overlap(t);
    if (rank == nranks - 1)
        t[0].col_count--;
}

static void replicated_on_two(mt_ckpt_tensor_t *t) /* HSDP replicas without a writer */
{
    t[0].col_offset = t[0].col_count = 0;
    t[0].row_count = rank < 2 ? 6 : 0;
}

static void test_refusals(void)
{
    const char *o = names[0];
    char want[400];
    snprintf(want, sizeof want, "%s: columns [7, 9) are outside dim 1 of size 8", o);
    expect_refused(save(9, B_COLS, outside), "block outside", want);
    snprintf(want, sizeof want, "%s: col_offset 0 and col_count 1 for a 1-D tensor", names[1]);
    expect_refused(save(9, B_COLS, cols_on_1d), "columns of a 1-D tensor", want);
    snprintf(want, sizeof want, "%s: col_offset 1 with col_count 0, which means all of dim 1",
             o);
    expect_refused(save(9, B_ROWS, offset_without_count), "col_offset alone", want);
    snprintf(want, sizeof want, "%s: row 0, column 7 is saved by no rank: every element must be "
             "saved by exactly one rank", o);
    expect_refused(save(9, B_COLS, last_column_missing), "a column missing", want);
    if (nranks == 4) {
        snprintf(want, sizeof want, "%s: row 3, column 0 is saved by no rank", o);
        expect_refused(save(9, B_GRID, grid_block_missing), "a grid block missing", want);
        snprintf(want, sizeof want, "%s: rank 0's rows [0, 3) x columns [0, 4) overlap rank 2's "
                 "rows [2, 6) x columns [0, 4)", o);
        expect_refused(save(9, B_GRID, grid_rows_overlap), "grid rows overlap", want);
    }
    /* 8 columns: rank 0 has [0, e0), rank 1 [e0, e1) */
    int64_t e0 = 8 / nranks, e1 = 8 * 2 / nranks;
    if (nranks > 1) {
        snprintf(want, sizeof want, "%s: rank 0's rows [0, 6) x columns [0, %lld) overlap rank "
                 "1's rows [0, 6) x columns [%lld, %lld): every element must be saved by exactly "
                 "one rank", o, (long long)e0, (long long)e0 - 1, (long long)e1);
        expect_refused(save(9, B_COLS, column_overlap), "columns overlap", want);
    }
    if (nranks > 2) { /* the element counts add up; only the overlap check sees it */
        snprintf(want, sizeof want, "%s: rank 0's rows [0, 6) overlap rank 1's rows [0, 6)", o);
        expect_refused(save(9, B_COLS, replicated_on_two), "whole on two ranks", want);
        snprintf(want, sizeof want, "%s: rank 0's rows [0, 6) x columns [0, %lld) overlap rank "
                 "1's rows [0, 6) x columns [%lld, %lld)", o, (long long)e0, (long long)e0 - 1,
                 (long long)e1);
        expect_refused(save(9, B_COLS, overlap_same_total), "overlap, same total", want);
    }
    struct stat sb;
    CHECK(stat(step_dir(9), &sb) != 0, "a refused save left %s", step_dir(9));
}

/* ------------------------------------------------------------ entry points */

static void setup(MPI_Comm c, const char *d)
{
    comm = c;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &nranks);
    snprintf(dir, sizeof dir, "%s", d);
}

void test_blocks(MPI_Comm c, const char *root, int *checks, int *failures)
{
    char d[700];
    snprintf(d, sizeof d, "%s/blocks", root);
    setup(c, d);

    /* Column blocks, as TP holds o_proj and down_proj. */
    expect_ok(save(1, B_COLS, NULL), "save column blocks");
    serial_check(1);
    read_back(1, B_ONE, "column blocks read whole by rank 0");
    read_back(1, B_ROWS, "column blocks read as row runs");
    read_back(1, B_COLS_REV, "column blocks read in reverse");
    read_back(1, B_GRID, "column blocks read as a grid");
    read_back(1, B_ALL_EXPLICIT, "column blocks read whole everywhere");

    /* A grid of blocks: TP columns x FSDP rows (2 x 2 at 4 ranks). */
    expect_ok(save(2, B_GRID, NULL), "save a grid of blocks");
    serial_check(2);
    read_back(2, B_ONE, "grid read whole by rank 0");
    read_back(2, B_COLS, "grid read as column blocks");
    read_back(2, B_ROWS, "grid read as row runs");

    /* Whole everywhere with col_count given explicitly: rank 0 writes. */
    expect_ok(save(3, B_ALL_EXPLICIT, NULL), "save whole, explicit col_count");
    serial_check(3);
    read_back(3, B_COLS, "explicitly whole read as column blocks");

    test_refusals();
    *checks = mt_test_checks;
    *failures = mt_test_failures;
}

int save_blocks_only(MPI_Comm c, const char *d)
{
    setup(c, d);
    mt_status_t s = save(1, B_GRID, NULL);
    if (s != MT_OK && rank == 0)
        fprintf(stderr, "test_checkpoint: %s\n", mt_error_message());
    expect_ok(s, "save the block tensors");
    return mt_test_failures;
}
