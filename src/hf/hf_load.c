/* hf_load.c: the initial weights of a model named by
 * model.pretrained_model_name_or_path, read at start into the trainer's
 * own blocks.
 *
 * The trainer already knows, for checkpoints, which logical elements each
 * rank holds: its checkpoint tensor list (rows and columns of every
 * /model/<HF name> tensor, for TP, PP, EP and FSDP or DDP alike).  Loading
 * fills the same blocks from safetensors instead of HDF5: all ranks in
 * parallel, each reading only its blocks with pread (hf_source.c), so the
 * bytes read in all are the model's bytes times its replication.  The
 * list's shapes are the model's parameter table; a tensor whose shape
 * differs is refused by name before anything is read.  Not here: when to
 * load (the trainer loads unless a checkpoint is resumed). */
#include "hf_internal.h"

#include <stdlib.h>
#include <string.h>

#include "mt_comm.h"

/* Tensors of the trainer's that Hugging Face files do not have: they keep
 * their initial values (the aux-loss-free balancing biases). */
static int meshtrain_own(const char *name)
{
    size_t n = strlen(name);
    static const char sfx[] = ".mlp.gate.e_score_correction_bias";
    return n > sizeof sfx - 1 && strcmp(name + n - (sizeof sfx - 1), sfx) == 0;
}

static const char *hf_name(const mt_ckpt_tensor_t *t)
{
    return strncmp(t->path, "/model/", 7) == 0 ? t->path + 7 : NULL;
}

/* Every /model tensor of the list is in the files with the list's shape. */
static mt_status_t check_list(const mt_hf_source_t *src, const char *dir,
                              const mt_ckpt_tensor_t *t, int n)
{
    for (int i = 0; i < n; i++) {
        const char *name = hf_name(&t[i]);
        if (!name)
            continue;
        int fi;
        const mt_st_entry_t *e = mt_hf_source_find(src, name, &fi);
        if (!e) {
            if (meshtrain_own(name))
                continue;
            MT_FAIL(MT_ERR_IO, "%s: the model has tensor %s, which none of its safetensors "
                    "files holds", dir, name);
        }
        MT_TRY(mt_hf_check_shape(src->f[fi].path, e, t[i].ndim, t[i].shape,
                                 "but the model's parameter is", ""));
    }
    return MT_OK;
}

static int64_t block_numel(const mt_ckpt_tensor_t *t)
{
    int64_t cols = t->ndim > 1 ? (t->col_count ? t->col_count : t->shape[1]) : 1;
    for (int d = 2; d < t->ndim; d++)
        cols *= t->shape[d];
    return t->row_count * cols;
}

/* This rank's blocks; *bytes: what it read. */
static mt_status_t read_blocks(const mt_hf_source_t *src, const mt_ckpt_tensor_t *t, int n,
                               double *bytes)
{
    float *host = NULL;
    int64_t host_cap = 0;
    mt_status_t s = MT_OK;
    for (int i = 0; i < n && s == MT_OK; i++) {
        const char *name = hf_name(&t[i]);
        int fi;
        const mt_st_entry_t *e = name ? mt_hf_source_find(src, name, &fi) : NULL;
        int64_t numel = block_numel(&t[i]);
        if (!e || numel == 0 || !t[i].data)
            continue;
        float *dst = t[i].data;
        if (t[i].be) { /* device memory: through a host copy */
            if (numel > host_cap) {
                float *h = realloc(host, sizeof *h * (size_t)numel);
                if (!h) {
                    s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "a host copy of %s",
                                     name);
                    break;
                }
                host = h, host_cap = numel;
            }
            dst = host;
        }
        s = mt_hf_read_block(&src->f[fi], e, t[i].row_offset, t[i].row_count,
                             t[i].ndim > 1 ? t[i].col_offset : 0,
                             t[i].ndim > 1 ? t[i].col_count : 0, dst);
        if (s == MT_OK && t[i].be)
            t[i].be->copy_to_device(t[i].data, host, sizeof *host * (size_t)numel);
        *bytes += (double)numel * (double)mt_st_dtype_size(e->dtype);
    }
    free(host);
    return s;
}

mt_status_t mt_hf_load_weights(MPI_Comm comm, const mt_model_config_t *m,
                               const mt_ckpt_tensor_t *t, int n, FILE *out)
{
    int rank, size;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    double t0 = MPI_Wtime();
    /* rank 0 names the directory, so every rank reads the same snapshot */
    char dir[MT_PATH_MAX + 512] = "";
    MT_TRY(mt_agree(comm, rank == 0 ? mt_hf_resolve(m, dir, sizeof dir) : MT_OK));
    MT_MPI_TRY(MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, comm));

    mt_hf_source_t src = {0};
    mt_hf_tensor_t *x = NULL;
    int nx = 0;
    mt_status_t s = mt_hf_expected_tensors(m, &x, &nx);
    if (s == MT_OK)
        s = mt_hf_source_open(&src, dir);
    if (s == MT_OK)
        s = mt_hf_source_check(&src, x, nx, m, dir, rank == 0 ? out : NULL);
    if (s == MT_OK)
        s = check_list(&src, dir, t, n);
    s = mt_agree(comm, s);
    double mine = 0, all = 0;
    if (s == MT_OK)
        s = mt_agree(comm, read_blocks(&src, t, n, &mine));
    if (s == MT_OK)
        s = mt_allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, comm);
    if (s == MT_OK && rank == 0 && out) {
        double dt = MPI_Wtime() - t0;
        fprintf(out, "loaded %s: %d tensors from %d safetensors file%s, %.1f MB read by %d "
                "rank%s in %.2f s (%.0f MB/s)\n", dir, nx, src.nf, src.nf == 1 ? "" : "s",
                all / 1e6, size, size == 1 ? "" : "s", dt, dt > 0 ? all / 1e6 / dt : 0.0);
        fflush(out);
    }
    free(x);
    mt_hf_source_free(&src);
    return s;
}
