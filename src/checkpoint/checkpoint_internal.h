/* checkpoint_internal.h: what the checkpoint files share: checkpoint.c
 * (collective entry points, agreement), checkpoint_plan.c (each rank's
 * block of a tensor, who writes what), checkpoint_dir.c (step
 * directories, manifest, pruning; rank 0 or not collective),
 * checkpoint_io.c (the HDF5 file, collectively) and checkpoint_h5.c (its
 * HDF5 pieces that need no MPI).  Not installed: callers use
 * mt_checkpoint.h. */
#ifndef MT_CHECKPOINT_INTERNAL_H
#define MT_CHECKPOINT_INTERNAL_H

#include <hdf5.h>

#include "mt_checkpoint.h"

#define MT_CKPT_FILE "model.h5"
#define MT_CKPT_MANIFEST "manifest.sha256"
#define MT_CKPT_STEP_PREFIX "step_"
#define MT_CKPT_PATH_CAP 4096 /* paths built here; longer ones are refused */

/* out = dir/name (out holds MT_CKPT_PATH_CAP); MT_ERR_RANGE if too long. */
mt_status_t mt_ckpt_join(char *out, const char *dir, const char *name);

/* rm -rf: 0, or -1 with errno.  A missing path counts as removed. */
int mt_ckpt_remove_tree(const char *path);

/* Rank 0 of a save: mkdir -p dir, then a fresh, empty tmp. */
mt_status_t mt_ckpt_prepare(const char *dir, const char *tmp);

/* Rank 0 of a save, after model.h5 is closed everywhere: write the
 * manifest, rename tmp to dir/name (replacing an older copy), replace
 * `latest`, prune to keep (0 keeps all). */
mt_status_t mt_ckpt_publish(const char *dir, const char *name, const char *tmp, int64_t step,
                            int64_t keep);

/* ---- blocks (checkpoint_plan.c) ---- */

/* t's block in dims 0 and 1 as {row_offset, row_count, col_offset,
 * col_count}, with col_count 0 resolved to all of dim 1; a 1-D tensor has
 * one column.  The block holds b[1] * b[3] * prod(shape[2..]) floats. */
void mt_ckpt_block(const mt_ckpt_tensor_t *t, int64_t b[4]);

/* "rows [a, b)", or "rows [a, b) x columns [c, d)" when b is not whole
 * rows: for messages. */
const char *mt_ckpt_block_text(const mt_ckpt_tensor_t *t, const int64_t b[4], char *buf,
                               size_t cap);

/* Not collective: t's block lies inside its shape and has data. */
mt_status_t mt_ckpt_check_block(const mt_ckpt_tensor_t *t);

/* Collective, on tensors every rank has checked: *out is a malloc'd copy
 * of t with the blocks this rank actually writes.  A tensor that every
 * rank holds whole is written by rank 0 alone; any other must be tiled by
 * the ranks' blocks (no overlap, no gap), or MT_ERR_RANGE naming the
 * tensor.  Agreed. */
mt_status_t mt_ckpt_plan_writes(MPI_Comm comm, const mt_ckpt_tensor_t *t, int n,
                                mt_ckpt_tensor_t **out);

/* Collective.  Create `file` (truncating) and write /meta, /train,
 * /optim/step and every tensor's hyperslab.  config and mesh must be the
 * same on every rank.  Failures are agreed: every rank returns the same. */
mt_status_t mt_ckpt_h5_write(MPI_Comm comm, const char *file, const mt_ckpt_tensor_t *t, int n,
                             const mt_train_state_t *state, const char *config,
                             const char *mesh);

/* Collective.  Open `file`, check /meta format and version, check each
 * tensor's shape and read its hyperslab; read /train into state if not
 * NULL.  Failures are agreed. */
mt_status_t mt_ckpt_h5_read(MPI_Comm comm, const char *file, const mt_ckpt_tensor_t *t, int n,
                            mt_train_state_t *state);

/* Reading tensor by tensor, for tools that stream a checkpoint instead of
 * loading a model (meshtrain-ckpt export).  Every call is collective and
 * agreed.  open checks /meta format and version; read_rows checks t's
 * shape and reads this rank's block (rows, or rows x columns); close
 * frees r and returns s (a status every rank already agrees on) or, when
 * s is MT_OK, the close's own. */
typedef struct mt_ckpt_h5_reader mt_ckpt_h5_reader_t;
mt_status_t mt_ckpt_h5_open(MPI_Comm comm, const char *file, mt_ckpt_h5_reader_t **r);
mt_status_t mt_ckpt_h5_read_rows(mt_ckpt_h5_reader_t *r, const mt_ckpt_tensor_t *t);
mt_status_t mt_ckpt_h5_close(mt_ckpt_h5_reader_t *r, mt_status_t s);

/* Not collective: open `file` with the serial driver, check the format and
 * return a malloc'd copy of the /meta config attribute. */
mt_status_t mt_ckpt_h5_read_config(const char *file, char **yaml);

/* ---- HDF5 helpers shared by the readers (checkpoint_io.c, and
 * meshtrain-ckpt's ckpt_inspect.c); none needs MPI (checkpoint_h5.c). ---- */

/* HDF5's own error printing off between begin and end: the innermost
 * HDF5 message is folded into ours instead (mt_ckpt_h5_fail). */
typedef struct {
    H5E_auto2_t func;
    void *data;
} mt_ckpt_h5_quiet_t;

static inline void mt_ckpt_h5_quiet_begin(mt_ckpt_h5_quiet_t *q)
{
    H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static inline void mt_ckpt_h5_quiet_end(const mt_ckpt_h5_quiet_t *q)
{
    H5Eset_auto2(H5E_DEFAULT, q->func, q->data);
}

/* Close *id with close unless it is closed already (< 0), and mark it so. */
static inline void mt_ckpt_h5_close_id(hid_t *id, herr_t (*close)(hid_t))
{
    if (*id >= 0)
        close(*id);
    *id = -1;
}

/* An MT_ERR_IO error whose message ends with HDF5's innermost reason,
 * "(HDF5: ...)"; clears HDF5's error stack. */
mt_status_t mt_ckpt_h5_fail(const char *src, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define H5_FAIL(...) return mt_ckpt_h5_fail(__FILE__, __LINE__, __VA_ARGS__)
/* The largest string attribute read back (the resolved config is the
 * biggest, a few kB); anything larger is not a file this code wrote. */
#define MT_CKPT_ATTR_MAX (16 << 20)
/* The largest /train/step accepted on read (2^40 steps). */
#define MT_CKPT_STEP_MAX (INT64_C(1) << 40)
/* An integer dataset that must be one element (the /train values): refuse
 * arrays, non-integers and wide integers before reading, naming path. */
mt_status_t mt_ckpt_h5_read_int_scalar(const char *fname, hid_t file, const char *path,
                                       int64_t *v);

/* Attribute `name` of object `obj`: a string as a malloc'd copy (fixed or
 * variable length; *out = NULL when absent), or an integer (*present = 0
 * when absent). */
mt_status_t mt_ckpt_h5_attr_string(const char *fname, hid_t file, const char *obj,
                                  const char *name, char **out);
mt_status_t mt_ckpt_h5_attr_int(const char *fname, hid_t file, const char *obj, const char *name,
                               int64_t *v, int *present);

/* /meta format must be ours; with check_version, the version too. */
mt_status_t mt_ckpt_h5_check_format(const char *fname, hid_t file, int check_version);

/* 1: HDF5 transfers are collective (MPI-IO two-phase), 0: independent. */
int mt_ckpt_transfer_collective(void);

#endif
