/* checkpoint_io.c: the HDF5 file of a checkpoint (model.h5), written and
 * read collectively through MPI-IO, one hyperslab per rank: a block of
 * rows, or of rows x columns (checkpoint_plan.c says which rank writes
 * which).
 *
 * Every collective step here ends in mt_agree, so a failure on one
 * rank (a dataset that cannot be created, a shape that does not match)
 * makes all ranks leave together instead of some waiting in the next
 * collective.  HDF5's own error printing is switched off while we work:
 * the innermost HDF5 message is folded into ours instead.
 *
 * This file knows nothing about directories, manifests or `latest`; that
 * is checkpoint.c.  The HDF5 pieces that need no MPI (errors, reading
 * attributes, the format check, the serial config read) are
 * checkpoint_h5.c's. */
#include "checkpoint_internal.h"
#include "mt_comm.h"

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>

#include "config.h" /* PACKAGE_VERSION for /meta software */

#define h5_fail mt_ckpt_h5_fail

static const char *const train_fields[5] = {"step", "consumed_samples", "data_epoch", "rng_seed",
                                            "rng_offset"};

/* ------------------------------------------------------------ small pieces */

typedef struct {
    hid_t file, lcpl, dcpl, dxpl;
    const char *name; /* the file's path, for messages */
    int rank;
} h5_ctx_t;

static void shape_text(char *buf, size_t cap, int ndim, const int64_t *dims)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", d ? ", " : "", (long long)dims[d]);
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
}

/* Select t's block (rows x columns of dims 0 and 1, the other dims
 * whole) in fs and return a memory space of the block's shape, which is
 * how the rank's buffer holds it; select nothing in either when the block
 * is empty, so the rank still joins the collective transfer. */
static hid_t select_block(hid_t fs, const mt_ckpt_tensor_t *t)
{
    int64_t b[4];
    mt_ckpt_block(t, b);
    hsize_t start[4] = {(hsize_t)b[0], (hsize_t)b[2], 0, 0}, count[4];
    hsize_t nelem = 1;
    for (int d = 0; d < t->ndim; d++) {
        count[d] = (hsize_t)(d == 0 ? b[1] : d == 1 ? b[3] : t->shape[d]);
        nelem *= count[d];
    }
    if (nelem == 0) {
        hsize_t one = 1;
        hid_t ms = H5Screate_simple(1, &one, NULL);
        if (ms >= 0 && (H5Sselect_none(ms) < 0 || H5Sselect_none(fs) < 0))
            mt_ckpt_h5_close_id(&ms, H5Sclose);
        return ms;
    }
    if (H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) < 0)
        return -1;
    return H5Screate_simple(t->ndim, count, NULL);
}

/* "rows [a, b)" or "rows [a, b) x columns [c, d)" of t, for messages. */
static const char *block_text(const mt_ckpt_tensor_t *t, char *buf, size_t cap)
{
    int64_t b[4];
    mt_ckpt_block(t, b);
    return mt_ckpt_block_text(t, b, buf, cap);
}

/* 1 if every component of path exists, 0 if one does not, <0 on error.
 * (H5Lexists on "/a/b/c" fails outright when "/a/b" is missing.) */
static htri_t path_exists(hid_t file, const char *path)
{
    char buf[sizeof ((mt_ckpt_tensor_t *)0)->path];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = strchr(buf + 1, '/');; p = strchr(p + 1, '/')) {
        if (p)
            *p = '\0';
        htri_t e = H5Lexists(file, buf, H5P_DEFAULT);
        if (e <= 0 || !p)
            return e;
        *p = '/';
    }
}

static mt_status_t attr_string(const h5_ctx_t *c, hid_t obj, const char *name, const char *value)
{
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR), a = -1;
    herr_t rc = -1;
    if (type >= 0 && space >= 0 && H5Tset_size(type, strlen(value) + 1) >= 0 &&
        H5Tset_strpad(type, H5T_STR_NULLTERM) >= 0 && H5Tset_cset(type, H5T_CSET_UTF8) >= 0 &&
        (a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT)) >= 0)
        rc = H5Awrite(a, type, value);
    mt_ckpt_h5_close_id(&a, H5Aclose);
    mt_ckpt_h5_close_id(&space, H5Sclose);
    mt_ckpt_h5_close_id(&type, H5Tclose);
    if (rc < 0)
        H5_FAIL("%s: cannot write attribute /meta %s", c->name, name);
    return MT_OK;
}

static mt_status_t attr_int(const h5_ctx_t *c, hid_t obj, const char *name, hid_t file_type,
                            int64_t value)
{
    hid_t space = H5Screate(H5S_SCALAR), a = -1;
    herr_t rc = -1;
    if (space >= 0 && (a = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT)) >= 0)
        rc = H5Awrite(a, H5T_NATIVE_INT64, &value);
    mt_ckpt_h5_close_id(&a, H5Aclose);
    mt_ckpt_h5_close_id(&space, H5Sclose);
    if (rc < 0)
        H5_FAIL("%s: cannot write attribute /meta %s", c->name, name);
    return MT_OK;
}

/* ------------------------------------------------------------ writing */

static mt_status_t write_scalar(const h5_ctx_t *c, const char *path, int64_t v)
{
    hid_t fs = H5Screate(H5S_SCALAR), ms = H5Screate(H5S_SCALAR), d = -1;
    herr_t rc = -1;
    if (fs >= 0 && ms >= 0 &&
        (d = H5Dcreate2(c->file, path, H5T_STD_I64LE, fs, c->lcpl, c->dcpl, H5P_DEFAULT)) >= 0) {
        /* One writer; the others join the collective with nothing. */
        if (c->rank == 0 || (H5Sselect_none(fs) >= 0 && H5Sselect_none(ms) >= 0))
            rc = H5Dwrite(d, H5T_NATIVE_INT64, ms, fs, c->dxpl, &v);
    }
    mt_ckpt_h5_close_id(&d, H5Dclose);
    mt_ckpt_h5_close_id(&ms, H5Sclose);
    mt_ckpt_h5_close_id(&fs, H5Sclose);
    if (rc < 0)
        H5_FAIL("%s: cannot write %s", c->name, path);
    return MT_OK;
}

static mt_status_t write_meta(const h5_ctx_t *c, const mt_train_state_t *st, const char *config,
                              const char *mesh, int world_size)
{
    hid_t g = H5Gcreate2(c->file, "/meta", c->lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0)
        H5_FAIL("%s: cannot create /meta", c->name);
    mt_status_t s = attr_string(c, g, "format", MT_CKPT_FORMAT);
    if (s == MT_OK)
        s = attr_int(c, g, "version", H5T_STD_I32LE, MT_CKPT_VERSION);
    if (s == MT_OK)
        s = attr_string(c, g, "config", config);
    if (s == MT_OK)
        s = attr_string(c, g, "mesh", mesh);
    if (s == MT_OK)
        s = attr_int(c, g, "world_size", H5T_STD_I64LE, world_size);
    if (s == MT_OK)
        s = attr_string(c, g, "software", "meshtrain " PACKAGE_VERSION);
    H5Gclose(g);
    MT_TRY(s);

    const int64_t v[5] = {st->step, st->consumed_samples, st->data_epoch, st->rng_seed,
                          st->rng_offset};
    char path[64];
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "/train/%s", train_fields[i]);
        MT_TRY(write_scalar(c, path, v[i]));
    }
    MT_TRY(write_scalar(c, "/optim/step", st->step));
    return MT_OK;
}

/* Create the dataset (collective) and select this rank's rows (local). */
static mt_status_t create_tensor(const h5_ctx_t *c, const mt_ckpt_tensor_t *t, hid_t *d,
                                 hid_t *fs, hid_t *ms)
{
    hsize_t dims[4];
    for (int k = 0; k < t->ndim; k++)
        dims[k] = (hsize_t)t->shape[k];
    if ((*fs = H5Screate_simple(t->ndim, dims, NULL)) < 0)
        H5_FAIL("%s: %s: cannot make its dataspace", c->name, t->path);
    if ((*d = H5Dcreate2(c->file, t->path, H5T_IEEE_F32LE, *fs, c->lcpl, c->dcpl, H5P_DEFAULT)) < 0)
        H5_FAIL("%s: cannot create dataset %s", c->name, t->path);
    char text[128];
    if ((*ms = select_block(*fs, t)) < 0)
        H5_FAIL("%s: %s: cannot select %s", c->name, t->path, block_text(t, text, sizeof text));
    return MT_OK;
}

/* Floats of this rank's block of t. */
static int64_t block_numel(const mt_ckpt_tensor_t *t)
{
    int64_t b[4], n;
    mt_ckpt_block(t, b);
    n = b[1] * b[3];
    for (int k = 2; k < t->ndim; k++)
        n *= t->shape[k];
    return n;
}

/* The host buffer HDF5 reads or writes for t: its data, or for a block in
 * a backend's memory a host copy (*staged, freed by the caller), filled
 * from the backend when `fill`.  NULL when out of memory. */
static float *host_block(const mt_ckpt_tensor_t *t, bool fill, float **staged)
{
    static float nothing; /* HDF5 wants a buffer even for an empty selection */
    *staged = NULL;
    int64_t n = t->data ? block_numel(t) : 0;
    if (n == 0)
        return t->data ? t->data : &nothing;
    if (!t->be)
        return t->data;
    if (!(*staged = malloc(sizeof(float) * (size_t)n)))
        return NULL;
    if (fill)
        t->be->copy_to_host(*staged, t->data, sizeof(float) * (size_t)n);
    return *staged;
}

static mt_status_t open_tensor(const h5_ctx_t *c, const mt_ckpt_tensor_t *t, hid_t *d, hid_t *fs,
                               hid_t *ms);

/* Write t's block (write) or read it (else), each rank its own, through a
 * host copy when the block is in a backend's memory.  Creating or opening
 * the dataset is collective, so every rank does it and then all agree,
 * also on a failed host copy. */
static mt_status_t io_tensor(MPI_Comm comm, const h5_ctx_t *c, const mt_ckpt_tensor_t *t,
                             bool write)
{
    hid_t d = -1, fs = -1, ms = -1;
    char text[128];
    float *staged, *buf = host_block(t, write, &staged);
    mt_status_t s = write ? create_tensor(c, t, &d, &fs, &ms) : open_tensor(c, t, &d, &fs, &ms);
    if (s == MT_OK && !buf)
        s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "%s: a host copy of %s", c->name,
                         t->path);
    s = mt_agree(comm, s);
    if (s == MT_OK && (write ? H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, c->dxpl, buf)
                             : H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, c->dxpl, buf)) < 0)
        s = h5_fail(__FILE__, __LINE__, "%s: %s %s of %s failed", c->name,
                    write ? "writing" : "reading", block_text(t, text, sizeof text), t->path);
    if (s == MT_OK && staged && !write)
        t->be->copy_to_device(t->data, staged, sizeof(float) * (size_t)block_numel(t));
    free(staged);
    mt_ckpt_h5_close_id(&ms, H5Sclose);
    mt_ckpt_h5_close_id(&fs, H5Sclose);
    mt_ckpt_h5_close_id(&d, H5Dclose);
    return s;
}

/* Collective transfers (MPI-IO two-phase I/O) unless the node is
 * oversubscribed: there every blocking exchange inside ROMIO spins against
 * the ranks it waits for (8 ranks on 2 cores: 20 s per save of a 0.5 MB
 * model instead of 1.5 s).  A block of whole rows is one contiguous run of
 * the file, so independent writes lose nothing there; a column block is
 * row_count runs, which ROMIO writes by data sieving (read-modify-write
 * under a file lock): correct, and small next to the spinning.
 * MESHTRAIN_H5_TRANSFER=collective|independent overrides. */
int mt_ckpt_transfer_collective(void)
{
    const char *e = getenv("MESHTRAIN_H5_TRANSFER");
    if (e && strcmp(e, "collective") == 0)
        return 1;
    if (e && strcmp(e, "independent") == 0)
        return 0;
    return mt_comm_wait_mode() != MT_WAIT_SLEEP;
}

static mt_status_t make_plists(h5_ctx_t *c, hid_t *fapl, MPI_Comm comm, int create)
{
    if ((*fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 ||
        H5Pset_fapl_mpio(*fapl, comm, MPI_INFO_NULL) < 0)
        H5_FAIL("%s: cannot set up MPI-IO file access", c->name);
    /* Format 1.8 or later: attributes over 64 KiB (a long config) go to
     * dense storage instead of failing. */
    if (create && H5Pset_libver_bounds(*fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0)
        H5_FAIL("%s: cannot set the file format bounds", c->name);
    if ((c->lcpl = H5Pcreate(H5P_LINK_CREATE)) < 0 ||
        H5Pset_create_intermediate_group(c->lcpl, 1) < 0)
        H5_FAIL("%s: cannot set up link creation", c->name);
    /* Every byte is written by some rank, so filling first is wasted I/O. */
    if ((c->dcpl = H5Pcreate(H5P_DATASET_CREATE)) < 0 ||
        H5Pset_alloc_time(c->dcpl, H5D_ALLOC_TIME_EARLY) < 0 ||
        H5Pset_fill_time(c->dcpl, H5D_FILL_TIME_NEVER) < 0)
        H5_FAIL("%s: cannot set up dataset creation", c->name);
    if ((c->dxpl = H5Pcreate(H5P_DATASET_XFER)) < 0 ||
        H5Pset_dxpl_mpio(c->dxpl, mt_ckpt_transfer_collective() ? H5FD_MPIO_COLLECTIVE
                                                                : H5FD_MPIO_INDEPENDENT) < 0)
        H5_FAIL("%s: cannot set up collective transfer", c->name);
    return MT_OK;
}

/* Close everything; a failing H5Fclose (a flush that hits a full disk)
 * becomes the status when nothing failed before. */
static mt_status_t close_ctx(MPI_Comm comm, h5_ctx_t *c, hid_t *fapl, mt_status_t s)
{
    herr_t rc = 0;
    if (c->file >= 0)
        rc = H5Fclose(c->file);
    c->file = -1;
    mt_ckpt_h5_close_id(&c->dxpl, H5Pclose);
    mt_ckpt_h5_close_id(&c->dcpl, H5Pclose);
    mt_ckpt_h5_close_id(&c->lcpl, H5Pclose);
    mt_ckpt_h5_close_id(fapl, H5Pclose);
    if (s != MT_OK)
        return s; /* already agreed */
    if (rc < 0)
        s = h5_fail(__FILE__, __LINE__, "%s: closing the file failed", c->name);
    return mt_agree(comm, s);
}

mt_status_t mt_ckpt_h5_write(MPI_Comm comm, const char *file, const mt_ckpt_tensor_t *t, int n,
                             const mt_train_state_t *state, const char *config, const char *mesh)
{
    h5_ctx_t c = {-1, -1, -1, -1, file, 0};
    hid_t fapl = -1;
    int size;
    MT_MPI_TRY(MPI_Comm_rank(comm, &c.rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    mt_ckpt_h5_quiet_t q;
    mt_ckpt_h5_quiet_begin(&q);

    mt_status_t s = make_plists(&c, &fapl, comm, 1);
    if (s == MT_OK && (c.file = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, fapl)) < 0)
        s = h5_fail(__FILE__, __LINE__, "%s: cannot create the checkpoint file", file);
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = mt_agree(comm, write_meta(&c, state, config, mesh, size));
    for (int i = 0; i < n && s == MT_OK; i++)
        s = mt_agree(comm, io_tensor(comm, &c, &t[i], true));
    s = close_ctx(comm, &c, &fapl, s);
    mt_ckpt_h5_quiet_end(&q);
    return s;
}

/* ------------------------------------------------------------ reading */

static mt_status_t open_tensor(const h5_ctx_t *c, const mt_ckpt_tensor_t *t, hid_t *d, hid_t *fs,
                               hid_t *ms)
{
    htri_t ex = path_exists(c->file, t->path);
    if (ex < 0)
        H5_FAIL("%s: cannot look up %s", c->name, t->path);
    if (ex == 0)
        MT_FAIL(MT_ERR_IO, "%s: no tensor %s in the checkpoint", c->name, t->path);
    if ((*d = H5Dopen2(c->file, t->path, H5P_DEFAULT)) < 0)
        H5_FAIL("%s: %s is not a dataset", c->name, t->path);
    hid_t type = H5Dget_type(*d);
    H5T_class_t cls = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
    mt_ckpt_h5_close_id(&type, H5Tclose);
    if (cls != H5T_FLOAT)
        MT_FAIL(MT_ERR_IO, "%s: %s is not a floating-point dataset", c->name, t->path);

    hsize_t dims[H5S_MAX_RANK];
    int nd;
    if ((*fs = H5Dget_space(*d)) < 0 || (nd = H5Sget_simple_extent_ndims(*fs)) < 0 ||
        nd > H5S_MAX_RANK || H5Sget_simple_extent_dims(*fs, dims, NULL) < 0)
        H5_FAIL("%s: cannot read the shape of %s", c->name, t->path);
    int same = nd == t->ndim;
    int64_t file_shape[H5S_MAX_RANK];
    for (int k = 0; k < nd; k++) {
        file_shape[k] = (int64_t)dims[k];
        same = same && file_shape[k] == t->shape[k];
    }
    if (!same) {
        char have[128], want[128];
        shape_text(have, sizeof have, nd, file_shape);
        shape_text(want, sizeof want, t->ndim, t->shape);
        mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                     "%s: %s has shape %s in the checkpoint, expected %s", c->name, t->path, have,
                     want);
        mt_error_hint("the checkpoint was written for a different model; its config is the "
                      "/meta config attribute (h5dump -a /meta/config %s)",
                      c->name);
        return MT_ERR_IO;
    }
    char text[128];
    if ((*ms = select_block(*fs, t)) < 0)
        H5_FAIL("%s: %s: cannot select %s", c->name, t->path, block_text(t, text, sizeof text));
    return MT_OK;
}

static mt_status_t read_state(const h5_ctx_t *c, mt_train_state_t *st)
{
    int64_t v[5];
    char path[64];
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "/train/%s", train_fields[i]);
        htri_t ex = path_exists(c->file, path);
        if (ex < 0)
            H5_FAIL("%s: cannot look up %s", c->name, path);
        if (ex == 0)
            MT_FAIL(MT_ERR_IO, "%s: no %s: the file is not a complete meshtrain checkpoint",
                    c->name, path);
        MT_TRY(mt_ckpt_h5_read_int_scalar(c->name, c->file, path, &v[i]));
    }
    /* Bounds far above any real run, low enough that step + 1, samples
     * + batch and the step directory's name cannot overflow. */
    const int64_t max_v[5] = {MT_CKPT_STEP_MAX, INT64_C(1) << 52, INT64_C(1) << 40, INT64_MAX,
                              INT64_C(1) << 60};
    for (int i = 0; i < 5; i++)
        if ((i != 3 && v[i] < 0) || v[i] > max_v[i])
            MT_FAIL(MT_ERR_IO, "%s: /train/%s is %lld, outside [%s, %lld]", c->name,
                    train_fields[i], (long long)v[i], i == 3 ? "INT64_MIN" : "0",
                    (long long)max_v[i]);
    st->step = v[0];
    st->consumed_samples = v[1];
    st->data_epoch = v[2];
    st->rng_seed = v[3];
    st->rng_offset = v[4];
    return MT_OK;
}

/* Every tensor asked for must be in the file, and every tensor in the file
 * must be one the caller asked for: a checkpoint of another model is
 * refused by name before anything is read. */
typedef struct {
    hid_t file;
    const mt_ckpt_tensor_t *t;
    int n;
    char extra[300];
} extra_ctx_t;

static herr_t visit_extra(hid_t group, const char *name, const H5L_info_t *info, void *data)
{
    extra_ctx_t *x = data;
    (void)group, (void)info;
    if (strncmp(name, "model/", 6) != 0 && strncmp(name, "optim/", 6) != 0)
        return 0;
    if (strcmp(name, "optim/step") == 0)
        return 0;
    for (int i = 0; i < x->n; i++)
        if (x->t[i].path[0] == '/' && strcmp(x->t[i].path + 1, name) == 0)
            return 0;
    hid_t d = H5Dopen2(x->file, name, H5P_DEFAULT); /* groups are not tensors */
    if (d < 0)
        return 0;
    H5Dclose(d);
    snprintf(x->extra, sizeof x->extra, "/%s", name);
    return 1; /* stop: found one */
}

static mt_status_t check_extra(const h5_ctx_t *c, const mt_ckpt_tensor_t *t, int n)
{
    /* a missing tensor is the clearer message when both apply (a renamed one) */
    for (int i = 0; i < n; i++) {
        htri_t ex = path_exists(c->file, t[i].path);
        if (ex < 0)
            H5_FAIL("%s: cannot look up %s", c->name, t[i].path);
        if (ex == 0)
            MT_FAIL(MT_ERR_IO, "%s: no tensor %s in the checkpoint", c->name, t[i].path);
    }
    extra_ctx_t x = {c->file, t, n, ""};
    if (H5Lvisit(c->file, H5_INDEX_NAME, H5_ITER_INC, visit_extra, &x) < 0)
        H5_FAIL("%s: cannot list the tensors", c->name);
    if (x.extra[0]) {
        mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                     "%s: the checkpoint has tensor %s, which this model does not have", c->name,
                     x.extra);
        mt_error_hint("the checkpoint was written for a different model; its config is the "
                      "/meta config attribute (meshtrain-ckpt config %s)", c->name);
        return MT_ERR_IO;
    }
    return MT_OK;
}

mt_status_t mt_ckpt_h5_read(MPI_Comm comm, const char *file, const mt_ckpt_tensor_t *t, int n,
                            mt_train_state_t *state)
{
    h5_ctx_t c = {-1, -1, -1, -1, file, 0};
    hid_t fapl = -1;
    MT_MPI_TRY(MPI_Comm_rank(comm, &c.rank));
    mt_ckpt_h5_quiet_t q;
    mt_ckpt_h5_quiet_begin(&q);

    mt_status_t s = make_plists(&c, &fapl, comm, 0);
    if (s == MT_OK && (c.file = H5Fopen(file, H5F_ACC_RDONLY, fapl)) < 0)
        s = h5_fail(__FILE__, __LINE__, "%s: cannot open as HDF5", file);
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = mt_agree(comm, mt_ckpt_h5_check_format(file, c.file, 1));
    if (s == MT_OK)
        s = mt_agree(comm, check_extra(&c, t, n));
    for (int i = 0; i < n && s == MT_OK; i++)
        s = mt_agree(comm, io_tensor(comm, &c, &t[i], false));
    if (s == MT_OK && state)
        s = mt_agree(comm, read_state(&c, state));
    s = close_ctx(comm, &c, &fapl, s);
    mt_ckpt_h5_quiet_end(&q);
    return s;
}

struct mt_ckpt_h5_reader {
    MPI_Comm comm;
    h5_ctx_t c;
    hid_t fapl;
    mt_ckpt_h5_quiet_t q;
    char name[MT_CKPT_PATH_CAP];
};

mt_status_t mt_ckpt_h5_open(MPI_Comm comm, const char *file, mt_ckpt_h5_reader_t **out)
{
    *out = NULL;
    mt_ckpt_h5_reader_t *r = calloc(1, sizeof *r);
    mt_status_t s = MT_OK;
    if (!r)
        s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "%s: reader state", file);
    else if (strlen(file) >= sizeof r->name)
        s = mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__, "%s: path too long", file);
    s = mt_agree(comm, s);
    if (s != MT_OK) {
        free(r);
        return s;
    }
    snprintf(r->name, sizeof r->name, "%s", file);
    r->comm = comm;
    r->c = (h5_ctx_t){-1, -1, -1, -1, r->name, 0};
    r->fapl = -1;
    MPI_Comm_rank(comm, &r->c.rank);
    mt_ckpt_h5_quiet_begin(&r->q);
    s = make_plists(&r->c, &r->fapl, comm, 0);
    if (s == MT_OK && (r->c.file = H5Fopen(file, H5F_ACC_RDONLY, r->fapl)) < 0)
        s = h5_fail(__FILE__, __LINE__, "%s: cannot open as HDF5", file);
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = mt_agree(comm, mt_ckpt_h5_check_format(file, r->c.file, 1));
    if (s != MT_OK)
        return mt_ckpt_h5_close(r, s);
    *out = r;
    return MT_OK;
}

mt_status_t mt_ckpt_h5_read_rows(mt_ckpt_h5_reader_t *r, const mt_ckpt_tensor_t *t)
{
    return mt_agree(r->comm, io_tensor(r->comm, &r->c, t, false));
}

mt_status_t mt_ckpt_h5_close(mt_ckpt_h5_reader_t *r, mt_status_t s)
{
    if (!r)
        return s;
    s = close_ctx(r->comm, &r->c, &r->fapl, s);
    mt_ckpt_h5_quiet_end(&r->q);
    free(r);
    return s;
}
