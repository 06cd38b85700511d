/* hf_consolidate.c: checkpoint.save_consolidated, a training run's model
 * as a Hugging Face directory beside its checkpoint,
 * step_NNNNNNNN/model/consolidated/ (AutoModel's place for it).
 *
 * The ranks write it in parallel from what they hold, through
 * hf_export.c's writer: each rank's blocks are the ones it writes to the
 * HDF5 checkpoint (rows under FSDP, column blocks under TP, its stage's
 * tensors under PP), so no rank gathers the model.  The directory is
 * written as consolidated.tmp and renamed when complete.
 *
 * When the run's model came from a Hugging Face directory
 * (model.pretrained_model_name_or_path), each tensor goes back in the dtype
 * the source stored it in, config.json is the source's with torch_dtype
 * set, and generation_config.json and the tokenizer files are copied;
 * otherwise the dtype is the run's param_dtype and config.json is
 * generated from the model section.  It does not train, and writes no
 * optimizer state. */
#include "hf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_cli_internal.h"
#include "mt_comm.h"

#define MAX_JSON_BYTES (64u << 20)
#define SUBDIR "model"
#define NAME "consolidated"

/* What a Hugging Face model directory holds beside its weights and
 * config.json that a consolidated save carries over: the generation
 * defaults and the tokenizer, as transformers' save_pretrained writes
 * them. */
static const char *const carried[] = {
    "generation_config.json", "tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model",        "added_tokens.json", "vocab.json",          "merges.txt",
    "chat_template.jinja",    "chat_template.json", NULL};

/* FOR THE LEAD: replace with mt_hf_resolve (hf_resolve.c), which also
 * finds a hub id in the Hugging Face cache.  Until then only a local
 * directory is accepted. */
static mt_status_t resolve_source(const mt_model_config_t *m, char *dir, size_t cap)
{
    const char *name = m->pretrained_model_name_or_path;
    struct stat st;
    if (stat(name, &st) != 0 || !S_ISDIR(st.st_mode))
        MT_FAIL(MT_ERR_UNSUPPORTED, "model.pretrained_model_name_or_path %s is not a local "
                "directory; a consolidated save reads its config.json and dtypes from one", name);
    if (strlen(name) >= cap)
        MT_FAIL(MT_ERR_RANGE, "%s: path too long", name);
    snprintf(dir, cap, "%s", name);
    return MT_OK;
}

static const char *torch_name(mt_st_dtype_t d)
{
    return d == MT_ST_BF16 ? "bfloat16" : d == MT_ST_F16 ? "float16" : "float32";
}

/* ------------------------------------------------------------ the source (rank 0) */

typedef struct {
    mt_st_file_t *f;
    int nf;
} headers_t;

static void headers_free(headers_t *h)
{
    for (int k = 0; k < h->nf; k++)
        mt_st_file_free(&h->f[k]);
    free(h->f);
    memset(h, 0, sizeof *h);
}

static mt_status_t add_header(headers_t *h, const char *path)
{
    for (int k = 0; k < h->nf; k++)
        if (strcmp(h->f[k].path, path) == 0)
            return MT_OK;
    mt_st_file_t *nf = realloc(h->f, sizeof *nf * (size_t)(h->nf + 1));
    if (!nf)
        MT_FAIL(MT_ERR_NOMEM, "%s", path);
    h->f = nf;
    memset(&h->f[h->nf], 0, sizeof h->f[h->nf]);
    MT_TRY(mt_st_read_header(path, &h->f[h->nf]));
    h->nf++;
    return MT_OK;
}

/* The headers of the source's weights: model.safetensors, or the files
 * its index names. */
static mt_status_t read_headers(const char *dir, headers_t *h)
{
    char single[MT_CKPT_PATH_CAP], index[MT_CKPT_PATH_CAP], path[MT_CKPT_PATH_CAP];
    MT_TRY(mt_ckpt_join(single, dir, MT_HF_SINGLE));
    MT_TRY(mt_ckpt_join(index, dir, MT_HF_INDEX));
    if (access(single, F_OK) == 0)
        return add_header(h, single);
    if (access(index, F_OK) != 0)
        MT_FAIL(MT_ERR_IO, "%s: no " MT_HF_SINGLE " and no " MT_HF_INDEX ": the source's "
                "dtypes are read from its safetensors headers", dir);
    json_t *j;
    MT_TRY(mt_hf_json_load(index, MAX_JSON_BYTES, &j));
    const json_t *wm = json_object_get(j, "weight_map");
    mt_status_t s = json_is_object(wm) ? MT_OK
                    : mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: no \"weight_map\" object",
                                   index);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)wm, key, v) {
        if (s != MT_OK)
            break;
        if (!json_is_string(v) || strchr(json_string_value(v), '/'))
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: weight_map[\"%s\"] is not a "
                             "file name", index, key);
        if (s == MT_OK)
            s = mt_ckpt_join(path, dir, json_string_value(v));
        if (s == MT_OK)
            s = add_header(h, path);
    }
    json_decref(j);
    return s;
}

/* Each tensor of the run's model in the source, with its shape: its dtype
 * into dtypes[i]; *most: the dtype of the most bytes. */
static mt_status_t source_dtypes(const headers_t *h, const mt_hf_plan_t *p, const char *dir,
                                 mt_st_dtype_t *dtypes, mt_st_dtype_t *most)
{
    uint64_t bytes[3] = {0, 0, 0};
    for (int i = 0; i < p->n; i++) {
        const mt_hf_tensor_t *t = &p->t[i];
        const mt_st_entry_t *e = NULL;
        for (int k = 0; k < h->nf && !e; k++)
            for (int x = 0; x < h->f[k].n && !e; x++)
                if (strcmp(h->f[k].e[x].name, t->name) == 0)
                    e = &h->f[k].e[x];
        if (!e)
            MT_FAIL(MT_ERR_IO, "%s has no tensor %s: the run's model is not the model of "
                    "model.pretrained_model_name_or_path", dir, t->name);
        int same = e->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = e->shape[d] == t->shape[d];
        if (!same)
            MT_FAIL(MT_ERR_IO, "%s: tensor %s has another shape than the run's [%lld%s%lld]: the "
                    "run's model is not the model of model.pretrained_model_name_or_path", dir,
                    t->name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                    t->ndim > 1 ? (long long)t->shape[1] : 0LL);
        if (e->dtype == MT_ST_OTHER)
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s: tensor %s is %s; a consolidated save writes F32, "
                    "BF16 and F16", dir, t->name, e->dtype_text);
        dtypes[i] = e->dtype;
        bytes[e->dtype] += (e->end - e->begin);
    }
    *most = bytes[MT_ST_BF16] > bytes[MT_ST_F32] ? MT_ST_BF16 : MT_ST_F32;
    if (bytes[MT_ST_F16] > bytes[*most])
        *most = MT_ST_F16;
    return MT_OK;
}

/* The source's config.json with its dtype set, every other field as it
 * was: reals are printed with the fewest digits that read back equal. */
static mt_status_t source_config(const char *dir, mt_st_dtype_t dtype, char **text)
{
    char path[MT_CKPT_PATH_CAP];
    json_t *j;
    MT_TRY(mt_ckpt_join(path, dir, "config.json"));
    MT_TRY(mt_hf_json_load(path, MAX_JSON_BYTES, &j));
    mt_status_t s = MT_OK;
    if (!json_is_object(j))
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: a JSON %s, expected an object",
                         path, mt_hf_json_type(j));
    if (s == MT_OK) {
        json_object_set_new(j, "torch_dtype", json_string(torch_name(dtype)));
        if (json_object_get(j, "dtype")) /* transformers 4.56 and later name it so */
            json_object_set_new(j, "dtype", json_string(torch_name(dtype)));
    }
    *text = NULL;
    for (int prec = 15; s == MT_OK && prec <= 17 && !*text; prec++) {
        char *t = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(prec));
        json_t *back = t ? json_loads(t, 0, NULL) : NULL;
        if (!t)
            s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "%s: printing it", path);
        else if (prec == 17 || (back && json_equal(back, j)))
            *text = t;
        else
            free(t);
        json_decref(back);
    }
    if (s == MT_OK) {
        size_t len = strlen(*text);
        char *t = realloc(*text, len + 2); /* a final newline, as transformers writes */
        if (t)
            t[len] = '\n', t[len + 1] = '\0', *text = t;
    }
    json_decref(j);
    return s;
}

static mt_status_t copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY);
    if (in < 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot read it to copy into the consolidated model: %s", from,
                strerror(errno));
    int o = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0) {
        int err = errno;
        close(in);
        MT_FAIL(MT_ERR_IO, "%s: cannot create: %s", to, strerror(err));
    }
    char buf[1 << 16];
    mt_status_t s = MT_OK;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: read failed: %s", from,
                             strerror(errno));
        if (r <= 0)
            break;
        for (ssize_t done = 0; done < r && s == MT_OK;) {
            ssize_t w = write(o, buf + done, (size_t)(r - done));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: write failed: %s", to,
                                 strerror(errno));
            else
                done += w;
        }
        if (s != MT_OK)
            break;
    }
    if (s == MT_OK && fsync(o) != 0 && errno != EINVAL)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: fsync failed: %s", to,
                         strerror(errno));
    if (close(o) != 0 && s == MT_OK)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: close failed: %s", to,
                         strerror(errno));
    close(in);
    return s;
}

/* The source's generation and tokenizer files that exist (a link that
 * leads nowhere is an error, not an absence). */
static mt_status_t copy_carried(const char *src, const char *dst)
{
    for (int k = 0; carried[k]; k++) {
        char from[MT_CKPT_PATH_CAP], to[MT_CKPT_PATH_CAP];
        struct stat st;
        MT_TRY(mt_ckpt_join(from, src, carried[k]));
        MT_TRY(mt_ckpt_join(to, dst, carried[k]));
        if (lstat(from, &st) == 0)
            MT_TRY(copy_file(from, to));
    }
    return MT_OK;
}

/* Rank 0: the plan's dtypes and config.json text, from the source or
 * the run's config. */
static mt_status_t describe(const mt_config_t *cfg, const mt_hf_plan_t *p, char *src,
                            mt_st_dtype_t *dtypes, char **json)
{
    const mt_model_config_t *m = &cfg->model;
    src[0] = '\0';
    if (!m->pretrained_model_name_or_path[0]) {
        mt_st_dtype_t d = cfg->distributed.mp_policy.param_dtype == MT_DTYPE_BFLOAT16 ? MT_ST_BF16
                                                                                      : MT_ST_F32;
        for (int i = 0; i < p->n; i++)
            dtypes[i] = d;
        return mt_hf_config_json(m, d, json);
    }
    MT_TRY(resolve_source(m, src, MT_CKPT_PATH_CAP));
    headers_t h = {0};
    mt_st_dtype_t most = MT_ST_F32;
    mt_status_t s = read_headers(src, &h);
    if (s == MT_OK)
        s = source_dtypes(&h, p, src, dtypes, &most);
    headers_free(&h);
    if (s == MT_OK)
        s = source_config(src, most, json);
    return s;
}

/* ------------------------------------------------------------ the rows the ranks hold */

typedef struct {
    mt_hf_rows_t base; /* first: the callback's argument is this */
    const mt_ckpt_tensor_t *w; /* the planned writes of the /model/ tensors */
    const int *at;             /* plan tensor i is w[at[i]] */
    float *buf;                /* host copy of a block in a backend's memory */
    size_t cap;
} mem_rows_t;

static mt_status_t mem_get(mt_hf_rows_t *base, MPI_Comm comm, const mt_hf_plan_t *p, int i,
                           int64_t b[4], const float **v)
{
    (void)comm, (void)p;
    mem_rows_t *r = (mem_rows_t *)base;
    const mt_ckpt_tensor_t *x = &r->w[r->at[i]];
    mt_ckpt_block(x, b);
    *v = x->data;
    size_t n = (size_t)(b[1] * b[3]);
    if (b[1] == 0 || !x->be)
        return MT_OK;
    if (n > r->cap) {
        float *nb = realloc(r->buf, sizeof(float) * n);
        if (!nb)
            MT_FAIL(MT_ERR_NOMEM, "%s: a host copy of %zu values", x->path, n);
        r->buf = nb, r->cap = n;
    }
    x->be->copy_to_host(r->buf, x->data, sizeof(float) * n);
    *v = r->buf;
    return MT_OK;
}

/* at[i]: the tensor of t (the run's /model/ tensors) that is plan tensor
 * i, which it must match in shape; every tensor of t must be one of the
 * plan's.  The same on every rank (the lists are). */
static mt_status_t match(const mt_hf_plan_t *p, const mt_model_config_t *m,
                         const mt_ckpt_tensor_t *t, int n, int *at)
{
    if (n != p->n)
        MT_FAIL(MT_ERR_RANGE, "the run's checkpoint has %d /model/ tensors, the Hugging Face %s "
                "%d", n, mt_hf_arch_name(m), p->n);
    for (int i = 0; i < p->n; i++)
        at[i] = -1;
    for (int k = 0; k < n; k++) {
        int i = 0;
        while (i < p->n && strcmp(p->t[i].name, t[k].path + 7) != 0)
            i++;
        if (i == p->n || at[i] >= 0)
            MT_FAIL(MT_ERR_UNSUPPORTED, "checkpoint tensor %s is not a tensor of the Hugging Face "
                    "%s", t[k].path, mt_hf_arch_name(m));
        int same = t[k].ndim == p->t[i].ndim;
        for (int d = 0; same && d < t[k].ndim; d++)
            same = t[k].shape[d] == p->t[i].shape[d];
        if (!same)
            MT_FAIL(MT_ERR_RANGE, "checkpoint tensor %s: another shape than the Hugging Face "
                    "tensor's", t[k].path);
        at[i] = k;
    }
    return MT_OK;
}

/* ------------------------------------------------------------ the directory */

/* Rank 0: a fresh, empty final.tmp (mkdir -p its parent). */
static mt_status_t prepare(const char *parent, const char *tmp)
{
    MT_TRY(mt_hf_mkdir_p(parent));
    if (mt_ckpt_remove_tree(tmp) != 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot remove the unfinished copy: %s", tmp, strerror(errno));
    if (mkdir(tmp, 0777) != 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    return MT_OK;
}

/* Rank 0, once every shard is written: the carried files, config.json
 * (last: what makes a directory a model), then the rename. */
static mt_status_t finish(const char *src, const char *tmp, const char *final, const char *parent,
                          const char *json)
{
    if (src[0])
        MT_TRY(copy_carried(src, tmp));
    MT_TRY(mt_hf_write_text(tmp, "config.json", json));
    if (mt_ckpt_remove_tree(final) != 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot remove the older copy: %s", final, strerror(errno));
    if (rename(tmp, final) != 0)
        MT_FAIL(MT_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    int fd = open(parent, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { /* the rename durable too, where the file system can say */
        fsync(fd);
        close(fd);
    }
    return MT_OK;
}

mt_status_t mt_hf_check_consolidated(const mt_config_t *cfg)
{
    if (cfg->checkpoint.save_consolidated == MT_CONSOLIDATE_NEVER)
        return MT_OK;
    MT_TRY(mt_hf_check_writable(&cfg->model, "checkpoint.save_consolidated"));
    return MT_OK;
}

mt_status_t mt_hf_save_consolidated(MPI_Comm comm, const mt_config_t *cfg, const char *step_dir,
                                    const mt_ckpt_tensor_t *t, int n, FILE *out)
{
    int rank;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    const mt_model_config_t *m = &cfg->model;
    char parent[MT_CKPT_PATH_CAP], final[MT_CKPT_PATH_CAP], tmp[MT_CKPT_PATH_CAP] = "";
    char src[MT_CKPT_PATH_CAP] = "", *json = NULL;
    mt_hf_plan_t p = {0};
    mt_ckpt_tensor_t *sub = NULL, *w = NULL;
    int nsub = 0, *at = NULL, *dt = NULL;
    mt_st_dtype_t *dtypes = NULL;

    /* the same on every rank: the layout, the run's tensors */
    mt_status_t s = mt_ckpt_join(parent, step_dir, SUBDIR);
    if (s == MT_OK)
        s = mt_ckpt_join(final, parent, NAME);
    if (s == MT_OK && strlen(final) + 5 > sizeof tmp)
        s = mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__, "%s: path too long", final);
    if (s == MT_OK)
        snprintf(tmp, sizeof tmp, "%s.tmp", final);
    if (s == MT_OK)
        s = mt_hf_check_writable(m, "checkpoint.save_consolidated");
    if (s == MT_OK)
        s = mt_hf_expected_tensors(m, &p.t, &p.n);
    if (s == MT_OK) {
        sub = malloc(sizeof *sub * (size_t)(n > 0 ? n : 1));
        at = malloc(sizeof *at * (size_t)(p.n > 0 ? p.n : 1));
        dt = malloc(sizeof *dt * (size_t)(p.n > 0 ? p.n : 1));
        dtypes = malloc(sizeof *dtypes * (size_t)(p.n > 0 ? p.n : 1));
        if (!sub || !at || !dt || !dtypes)
            s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "%d tensors", n);
    }
    for (int k = 0; k < n && s == MT_OK; k++)
        if (strncmp(t[k].path, "/model/", 7) == 0)
            sub[nsub++] = t[k];
    if (s == MT_OK)
        s = match(&p, m, sub, nsub, at);
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = mt_ckpt_plan_writes(comm, sub, nsub, &w); /* agreed */

    /* rank 0 reads the source and prepares the directory; all learn the dtypes */
    if (s == MT_OK && rank == 0)
        s = describe(cfg, &p, src, dtypes, &json);
    if (s == MT_OK && rank == 0)
        s = prepare(parent, tmp);
    s = mt_agree(comm, s);
    for (int i = 0; i < p.n && s == MT_OK && rank == 0; i++)
        dt[i] = (int)dtypes[i];
    if (s == MT_OK) {
        int rc = MPI_Bcast(dt, p.n, MPI_INT, 0, comm);
        s = rc == MPI_SUCCESS ? MT_OK : mt_error_mpi(rc, "MPI_Bcast(dtypes)", __FILE__, __LINE__);
    }
    for (int i = 0; i < p.n && s == MT_OK; i++)
        dtypes[i] = (mt_st_dtype_t)dt[i];
    mt_hf_plan_t plan = {0};
    if (s == MT_OK)
        s = mt_agree(comm, mt_hf_plan(&plan, m, dtypes, MT_ST_F32, MT_HF_DEFAULT_SHARD_BYTES));

    mem_rows_t rows = {{mem_get}, w, at, NULL, 0};
    if (s == MT_OK)
        s = mt_hf_write_weights(comm, tmp, &plan, &rows.base, NULL);
    free(rows.buf);
    if (s == MT_OK && rank == 0)
        s = finish(src, tmp, final, parent, json);
    s = mt_agree(comm, s);
    if (s != MT_OK && rank == 0 && tmp[0])
        mt_ckpt_remove_tree(tmp); /* best effort: the error stays the save's */
    if (s == MT_OK && rank == 0 && out)
        fprintf(out, "wrote %s: %s, %d tensors, %llu bytes in %d file%s\n", final,
                mt_hf_arch_name(m), plan.n, (unsigned long long)plan.total, plan.nshards,
                plan.nshards > 1 ? "s" : "");
    mt_hf_plan_free(&plan);
    mt_hf_plan_free(&p);
    free(json);
    free(sub);
    free(w);
    free(at);
    free(dt);
    free(dtypes);
    if (s != MT_OK)
        mt_error_trace(__FILE__, __LINE__);
    return s;
}
