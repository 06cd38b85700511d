/* mt_checkpoint.h: HDF5 checkpoints that any mesh can read.
 *
 * checkpoint_dir/step_NNNNNNNN/ holds one HDF5 file, model.h5, and a
 * SHA-256 manifest.  In the file:
 *   /model/<HF name>                 full logical tensors, float32, shaped as
 *                                    in PyTorch ([out, in] for linears)
 *   /optim/<HF name>/exp_avg, /optim/<HF name>/exp_avg_sq
 *   /optim/step                      int64 scalar
 *   /train/{step, consumed_samples, data_epoch, rng_seed, rng_offset}  int64 scalars
 *   /meta attributes: format "meshtrain-checkpoint", version 1, config
 *                     (the resolved YAML), mesh (a one-line description),
 *                     world_size
 * Every rank writes and reads only its own hyperslab, a block of dims 0
 * and 1 (rows [row_offset, row_offset+row_count) x columns
 * [col_offset, col_offset+col_count)), collectively through MPI-IO, so no
 * rank ever holds another's shard.
 *
 * Writes are atomic: the directory is written as step_NNNNNNNN.tmp, the
 * manifest (manifest.sha256: "<hex>  model.h5") is written last, then the
 * directory is renamed and the `latest` file (one line, the directory name)
 * is replaced by rename.  A checkpoint whose manifest is missing or does
 * not match is never loaded silently. */
#ifndef MT_CHECKPOINT_H
#define MT_CHECKPOINT_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_backend.h"
#include "mt_config.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_CKPT_FORMAT "meshtrain-checkpoint"
#define MT_CKPT_VERSION 1

typedef struct {
    char path[256];       /* dataset path in the file: "/model/model.norm.weight" */
    int ndim;
    int64_t shape[4];     /* full logical shape */
    int64_t row_offset;   /* this rank's rows of dim 0 */
    int64_t row_count;    /* 0 is allowed (a rank with nothing of this tensor) */
    int64_t col_offset;   /* this rank's columns of dim 1 (a column block of a */
    int64_t col_count;    /* row-parallel linear); col_count 0: all of dim 1, with
                           * col_offset 0, so a zero-initialised struct means whole
                           * rows.  1-D tensors: both must be 0. */
    float *data;          /* the block, contiguous and row-major: row_count *
                           * col_count * prod(shape[2..]) floats (col_count 0:
                           * shape[1]) */
    const mt_backend_t *be; /* NULL: data is host memory; else it is this
                           * backend's memory (a GPU's), which the HDF5 I/O
                           * stages through a host copy of the block */
} mt_ckpt_tensor_t;

typedef struct {
    int64_t step;             /* optimizer steps completed */
    int64_t consumed_samples; /* global samples consumed */
    int64_t data_epoch;
    int64_t rng_seed;
    int64_t rng_offset;
} mt_train_state_t;

/* Collective over comm.  Writes checkpoint_dir/step_NNNNNNNN atomically,
 * updates `latest`, then deletes the oldest step_* directories beyond
 * keep_last_n (0 keeps all). */
mt_status_t mt_ckpt_save(MPI_Comm comm, const char *checkpoint_dir, const mt_ckpt_tensor_t *t,
                         int n, const mt_train_state_t *state, const char *config_yaml,
                         const char *mesh_desc, int64_t keep_last_n);

/* Verify the manifest of one step directory: MT_OK, or MT_ERR_IO naming
 * what is missing or which hash differs.  Not collective. */
mt_status_t mt_ckpt_verify(const char *step_dir);

/* One run owns a checkpoint directory (checkpoint_lock.c): rank 0 holds
 * checkpoint_dir/.lock (created if need be), whose mtime is the heartbeat;
 * a live lock of another run is an error naming it, a stale one (a dead
 * pid on this host, an earlier run of this job, or no heartbeat for
 * stale_s) is taken over with a warning on `warn`.  Acquire is collective
 * and agreed; beat and release are rank 0's (no-ops elsewhere). */
typedef struct {
    char path[MT_PATH_MAX + 8];
    char token[40];
    double stale_s, last_beat;
    bool held;
} mt_ckpt_lock_t;
mt_status_t mt_ckpt_lock_acquire(MPI_Comm comm, const char *dir, double stale_s, FILE *warn,
                                 mt_ckpt_lock_t *l);
/* Touch the heartbeat, at most every stale_s / 10 seconds. */
void mt_ckpt_lock_beat(mt_ckpt_lock_t *l);
void mt_ckpt_lock_release(mt_ckpt_lock_t *l);

/* Newest complete, verified step directory under checkpoint_dir into
 * out (cap bytes); *found = 0 if there is none.  Corrupt or partial ones
 * are skipped with a warning on `warn` (if not NULL).  Not collective. */
mt_status_t mt_ckpt_find_latest(const char *checkpoint_dir, char *out, size_t cap, int *found,
                                FILE *warn);

/* Collective over comm.  Verifies the manifest, checks format and version,
 * checks every tensor's shape against t[i].shape, and reads each rank's
 * hyperslab into t[i].data.  state may be NULL. */
mt_status_t mt_ckpt_load(MPI_Comm comm, const char *step_dir, const mt_ckpt_tensor_t *t, int n,
                         mt_train_state_t *state);
/* The same for a step directory that rank 0's mt_ckpt_find_latest has
 * just verified: the files are hashed once, not twice. */
mt_status_t mt_ckpt_load_found(MPI_Comm comm, const char *step_dir, const mt_ckpt_tensor_t *t,
                               int n, mt_train_state_t *state);

/* Read the stored config text (malloc'd into *yaml). Not collective. */
mt_status_t mt_ckpt_read_config(const char *step_dir, char **yaml);

/* SHA-256 of a file as 64 hex characters plus NUL. */
mt_status_t mt_sha256_file(const char *path, char hex[65]);
/* SHA-256 of a buffer (tests use the FIPS 180-4 vectors). */
void mt_sha256(const void *data, size_t len, unsigned char digest[32]);

#ifdef __cplusplus
}
#endif
#endif
