/* checkpoint.c: the collective entry points of mt_checkpoint.h: argument
 * checks that every rank agrees on, save and load.  Every failure is
 * agreed over the communicator (mt_agree), so all ranks return the
 * same status and message and none is left waiting in a collective.
 *
 * Who writes which block of a tensor is checkpoint_plan.c; the step
 * directories (manifest, rename, `latest`, pruning, discovery) are
 * checkpoint_dir.c, run by rank 0 alone; the HDF5 file is
 * checkpoint_io.c. */
#include "checkpoint_internal.h"
#include "mt_comm.h"

#include <stdlib.h>
#include <string.h>

#define PATH_CAP MT_CKPT_PATH_CAP
#define STEP_PREFIX MT_CKPT_STEP_PREFIX
#define MAX_TEXT (16 << 20) /* config or mesh text; they are a few KB */


/* ------------------------------------------------------------ argument checks */

static mt_status_t check_tensor(const mt_ckpt_tensor_t *t, int i, int saving)
{
    if (!memchr(t->path, '\0', sizeof t->path) || t->path[0] != '/' || !t->path[1])
        MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %d: path must be an absolute HDF5 path such as "
                "\"/model/model.norm.weight\"", i);
    if (saving && strncmp(t->path, "/model/", 7) != 0 &&
        (strncmp(t->path, "/optim/", 7) != 0 || strcmp(t->path, "/optim/step") == 0))
        MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %d (%s): tensors live under /model/ or /optim/ "
                "(and /optim/step is the step counter)", i, t->path);
    if (t->ndim < 1 || t->ndim > 4)
        MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %s: ndim %d, expected 1 to 4", t->path, t->ndim);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 1)
            MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %s: dim %d has size %lld; tensors must not "
                    "be empty", t->path, d, (long long)t->shape[d]);
    MT_TRY(mt_ckpt_check_block(t));
    return MT_OK;
}

static mt_status_t check_tensors(const mt_ckpt_tensor_t *t, int n, int saving)
{
    if (n < 0 || (n > 0 && !t))
        MT_FAIL(MT_ERR_RANGE, "checkpoint: %d tensors at %p", n, (const void *)t);
    for (int i = 0; i < n; i++)
        MT_TRY(check_tensor(&t[i], i, saving));
    return MT_OK;
}

/* Digest of what must be identical on every rank: the directory, a few
 * scalars and the tensor list with shapes (not the blocks, which differ). */
static void call_digest(const char *dir, const int64_t *scalars, int ns,
                        const mt_ckpt_tensor_t *t, int n, unsigned char d[32])
{
    struct {
        char dir[PATH_CAP];
        int64_t v[8];
    } call;
    memset(&call, 0, sizeof call);
    snprintf(call.dir, sizeof call.dir, "%s", dir);
    for (int i = 0; i < ns && i < 7; i++)
        call.v[i] = scalars[i];
    call.v[7] = n;
    mt_sha256(&call, sizeof call, d);
    /* Chained: each tensor's item carries the digest so far. */
    struct {
        unsigned char prev[32];
        char path[sizeof t->path];
        int64_t v[5];
    } item;
    for (int i = 0; i < n; i++) {
        memset(&item, 0, sizeof item);
        memcpy(item.prev, d, 32);
        memcpy(item.path, t[i].path, sizeof item.path);
        item.v[0] = t[i].ndim;
        for (int k = 0; k < t[i].ndim; k++)
            item.v[1 + k] = t[i].shape[k];
        mt_sha256(&item, sizeof item, d);
    }
}

/* Collective: every rank compares its call with rank 0's.  `valid` says
 * whether this rank's arguments passed the local checks (if not, it joins
 * the broadcast without hashing them).  Returns the local verdict. */
static mt_status_t same_as_rank0(MPI_Comm comm, int valid, const char *what, const char *dir,
                                 const int64_t *scalars, int ns, const mt_ckpt_tensor_t *t, int n)
{
    int rank;
    unsigned char mine[32] = {0}, root[32];
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    if (valid)
        call_digest(dir, scalars, ns, t, n, mine);
    memcpy(root, mine, sizeof root);
    MT_MPI_TRY(MPI_Bcast(root, 32, MPI_BYTE, 0, comm));
    if (valid && memcmp(mine, root, 32) != 0)
        MT_FAIL(MT_ERR_RANGE, "%s: rank %d was called with a different directory, train state or "
                "tensor list than rank 0: every rank must pass the same tensors, with the same "
                "full shapes, in the same order", what, rank);
    return MT_OK;
}

/* Rank 0's config and mesh text on every rank, packed "config\0mesh\0". */
static mt_status_t bcast_texts(MPI_Comm comm, int rank, const char *config, const char *mesh,
                               char **packed)
{
    int64_t len[2] = {0, 0};
    *packed = NULL;
    if (rank == 0) {
        len[0] = (int64_t)strlen(config ? config : "");
        len[1] = (int64_t)strlen(mesh ? mesh : "");
    }
    MT_MPI_TRY(MPI_Bcast(len, 2, MPI_INT64_T, 0, comm));
    mt_status_t s = MT_OK;
    if (len[0] > MAX_TEXT || len[1] > MAX_TEXT)
        s = mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__, "checkpoint: config text of %lld "
                         "bytes or mesh text of %lld bytes; at most %d each",
                         (long long)len[0], (long long)len[1], MAX_TEXT);
    char *p = s == MT_OK ? malloc((size_t)(len[0] + len[1] + 2)) : NULL;
    if (s == MT_OK && !p)
        s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "checkpoint: config text");
    s = mt_agree(comm, s);
    if (s != MT_OK) {
        free(p);
        return s;
    }
    if (rank == 0) {
        memcpy(p, config ? config : "", (size_t)len[0] + 1);
        memcpy(p + len[0] + 1, mesh ? mesh : "", (size_t)len[1] + 1);
    }
    int rc = MPI_Bcast(p, (int)(len[0] + len[1] + 2), MPI_CHAR, 0, comm);
    if (rc != MPI_SUCCESS) {
        free(p);
        return mt_error_mpi(rc, "MPI_Bcast(config text)", __FILE__, __LINE__);
    }
    *packed = p;
    return MT_OK;
}

/* ------------------------------------------------------------ save */

mt_status_t mt_ckpt_save(MPI_Comm comm, const char *checkpoint_dir, const mt_ckpt_tensor_t *t,
                         int n, const mt_train_state_t *state, const char *config_yaml,
                         const char *mesh_desc, int64_t keep_last_n)
{
    int rank;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));

    mt_status_t s = MT_OK;
    if (!checkpoint_dir || !checkpoint_dir[0] || strlen(checkpoint_dir) > PATH_CAP - 64)
        s = mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__,
                         "mt_ckpt_save: checkpoint_dir must be a path of 1 to %d characters",
                         PATH_CAP - 64);
    else if (!state || state->step < 0)
        s = mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__,
                         "mt_ckpt_save: needs a train state with step >= 0");
    else if (keep_last_n < 0)
        s = mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__,
                         "mt_ckpt_save: keep_last_n is %lld; 0 keeps every checkpoint",
                         (long long)keep_last_n);
    else
        s = check_tensors(t, n, 1);
    int64_t scalars[6] = {0};
    if (s == MT_OK) {
        const int64_t v[6] = {state->step,     state->consumed_samples, state->data_epoch,
                              state->rng_seed, state->rng_offset,       keep_last_n};
        memcpy(scalars, v, sizeof v);
    }
    mt_status_t same = same_as_rank0(comm, s == MT_OK, "mt_ckpt_save", checkpoint_dir, scalars, 6,
                                     t, n);
    MT_TRY(mt_agree(comm, s != MT_OK ? s : same));
    mt_ckpt_tensor_t *w = NULL;
    MT_TRY(mt_ckpt_plan_writes(comm, t, n, &w));
    char *texts;
    s = bcast_texts(comm, rank, config_yaml, mesh_desc, &texts);
    if (s != MT_OK) {
        free(w);
        MT_TRY(s);
    }

    char name[64], final[PATH_CAP], tmp[PATH_CAP] = "", file[PATH_CAP];
    snprintf(name, sizeof name, STEP_PREFIX "%08lld", (long long)state->step);
    s = mt_ckpt_join(final, checkpoint_dir, name);
    if (s == MT_OK)
        snprintf(tmp, sizeof tmp, "%s.tmp", final);
    if (s == MT_OK)
        s = mt_ckpt_join(file, tmp, MT_CKPT_FILE);
    if (s == MT_OK && rank == 0)
        s = mt_ckpt_prepare(checkpoint_dir, tmp);
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = mt_ckpt_h5_write(comm, file, w, n, state, texts, texts + strlen(texts) + 1);
    free(texts);
    free(w);
    if (s != MT_OK) {
        /* Leave no half-written step behind (best effort: it is ignored
         * and pruned anyway); the error stays the write's. */
        if (rank == 0 && tmp[0])
            mt_ckpt_remove_tree(tmp);
        mt_error_trace(__FILE__, __LINE__);
        return s;
    }
    if (rank == 0)
        s = mt_ckpt_publish(checkpoint_dir, name, tmp, state->step, keep_last_n);
    MT_TRY(mt_agree(comm, s));
    return MT_OK;
}

/* ------------------------------------------------------------ load */

static mt_status_t load(MPI_Comm comm, const char *step_dir, const mt_ckpt_tensor_t *t, int n,
                        mt_train_state_t *state, bool verify)
{
    int rank;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    mt_status_t s = MT_OK;
    if (!step_dir || !step_dir[0] || strlen(step_dir) > PATH_CAP - 64)
        s = mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__,
                         "mt_ckpt_load: step_dir must be a path of 1 to %d characters",
                         PATH_CAP - 64);
    else
        s = check_tensors(t, n, 0);
    mt_status_t same = same_as_rank0(comm, s == MT_OK, "mt_ckpt_load", step_dir, NULL, 0, t, n);
    MT_TRY(mt_agree(comm, s != MT_OK ? s : same));

    /* Hashing the whole file is rank 0's job; the others wait for it. */
    if (verify)
        MT_TRY(mt_agree(comm, rank == 0 ? mt_ckpt_verify(step_dir) : MT_OK));
    char file[PATH_CAP];
    MT_TRY(mt_ckpt_join(file, step_dir, MT_CKPT_FILE));
    MT_TRY(mt_ckpt_h5_read(comm, file, t, n, state));
    return MT_OK;
}

mt_status_t mt_ckpt_load(MPI_Comm comm, const char *step_dir, const mt_ckpt_tensor_t *t, int n,
                         mt_train_state_t *state)
{
    return load(comm, step_dir, t, n, state, true);
}

mt_status_t mt_ckpt_load_found(MPI_Comm comm, const char *step_dir, const mt_ckpt_tensor_t *t,
                               int n, mt_train_state_t *state)
{
    return load(comm, step_dir, t, n, state, false);
}

mt_status_t mt_ckpt_read_config(const char *step_dir, char **yaml)
{
    char file[PATH_CAP];
    *yaml = NULL;
    MT_TRY(mt_ckpt_join(file, step_dir, MT_CKPT_FILE));
    MT_TRY(mt_ckpt_h5_read_config(file, yaml));
    return MT_OK;
}
