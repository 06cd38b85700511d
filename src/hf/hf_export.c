/* hf_export.c: a checkpoint's /model tensors as a Hugging Face model
 * directory: config.json plus model.safetensors, or model-0000i-of-0000N
 * shards plus model.safetensors.index.json.
 *
 * Every rank computes the same plan (tensor order, shards, offsets) from
 * the stored config.  Rank 0 writes the headers, config.json and the index;
 * for each tensor, every rank reads its own rows from model.h5 (collective
 * HDF5 over MPI-IO), converts them and writes them at their byte offset
 * with MPI_File_write_at_all.  So a rank holds one tensor's rows at a
 * time, never the model.  Optimizer state and /train are not exported. */
#include "hf_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_cli_internal.h"
#include "mt_comm.h"

#define CHUNK_BYTES (1 << 30) /* per MPI_File_write_at_all: counts are ints */

typedef struct {
    mt_hf_tensor_t *t; /* in the trainer's order */
    int n;
    mt_st_entry_t *e;  /* the same tensors as safetensors entries */
    int *shard;        /* shard of each tensor */
    int nshards;
    uint64_t *data_bytes; /* per shard */
    uint64_t total;
    mt_st_dtype_t dtype;
} plan_t;

static void plan_free(plan_t *p)
{
    free(p->t);
    free(p->e);
    free(p->shard);
    free(p->data_bytes);
    memset(p, 0, sizeof *p);
}

static void shard_name(const plan_t *p, int i, char *buf, size_t cap)
{
    if (p->nshards == 1)
        snprintf(buf, cap, MT_HF_SINGLE);
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", i + 1, p->nshards);
}

/* Greedy, in model order, as transformers shards: a new file starts when
 * the next tensor would take this one over the limit; a tensor larger than
 * the limit gets a file of its own. */
static mt_status_t make_plan(plan_t *p, const mt_model_config_t *m, mt_st_dtype_t dtype,
                             int64_t max_shard)
{
    memset(p, 0, sizeof *p);
    p->dtype = dtype;
    MT_TRY(mt_hf_expected_tensors(m, &p->t, &p->n));
    p->e = calloc((size_t)p->n, sizeof *p->e);
    p->shard = calloc((size_t)p->n, sizeof *p->shard);
    p->data_bytes = calloc((size_t)p->n, sizeof *p->data_bytes);
    if (!p->e || !p->shard || !p->data_bytes)
        MT_FAIL(MT_ERR_NOMEM, "export plan of %d tensors", p->n);
    uint64_t used = 0;
    int cur = 0;
    for (int i = 0; i < p->n; i++) {
        mt_st_entry_t *e = &p->e[i];
        snprintf(e->name, sizeof e->name, "%s", p->t[i].name);
        e->dtype = dtype;
        e->ndim = p->t[i].ndim;
        uint64_t bytes = mt_st_dtype_size(dtype);
        for (int d = 0; d < e->ndim; d++)
            bytes *= (uint64_t)(e->shape[d] = p->t[i].shape[d]);
        if (used > 0 && used + bytes > (uint64_t)max_shard)
            cur++, used = 0;
        e->begin = used;
        e->end = used + bytes;
        used += bytes;
        p->shard[i] = cur;
        p->data_bytes[cur] = used;
        p->total += bytes;
    }
    p->nshards = cur + 1;
    return MT_OK;
}

/* ------------------------------------------------------------ rank 0's checks */

/* The file's /model datasets must be exactly the tensors the stored config
 * describes, float32 and of the same shapes. */
static mt_status_t check_tensors(const char *step_dir, const plan_t *p)
{
    mt_ckpt_info_t in;
    mt_status_t s = mt_ckpt_info_read(step_dir, &in, 1, 1);
    int found = 0;
    for (int i = 0; i < in.nds && s == MT_OK; i++) {
        const mt_ckpt_dataset_info_t *x = &in.ds[i];
        if (strncmp(x->path, "/model/", 7) != 0)
            continue;
        int k = 0;
        while (k < p->n && strcmp(p->t[k].name, x->path + 7) != 0)
            k++;
        if (k == p->n) {
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: %s is not a tensor of the "
                             "model its /meta config describes", in.fname, x->path);
            break;
        }
        found++;
        int same = x->ndim == p->t[k].ndim && strcmp(x->dtype, "float32") == 0;
        for (int d = 0; same && d < x->ndim; d++)
            same = x->dims[d] == p->t[k].shape[d];
        if (!same)
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: %s is not a float32 tensor of "
                             "shape [%lld%s%lld] as its /meta config says", in.fname, x->path,
                             (long long)p->t[k].shape[0], p->t[k].ndim > 1 ? ", " : "",
                             p->t[k].ndim > 1 ? (long long)p->t[k].shape[1] : 0LL);
    }
    if (s == MT_OK && found != p->n)
        for (int k = 0; k < p->n; k++) {
            int have = 0;
            for (int i = 0; i < in.nds && !have; i++)
                have = strncmp(in.ds[i].path, "/model/", 7) == 0 &&
                       strcmp(in.ds[i].path + 7, p->t[k].name) == 0;
            if (!have) {
                s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: no tensor /model/%s in the "
                                 "checkpoint", in.fname, p->t[k].name);
                break;
            }
        }
    mt_ckpt_info_free(&in);
    return s;
}

static mt_status_t mkdir_p(const char *dir)
{
    char buf[MT_CKPT_PATH_CAP];
    if (strlen(dir) >= sizeof buf)
        MT_FAIL(MT_ERR_RANGE, "%s: path too long", dir);
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *q = buf + 1;; q++) {
        if (*q == '/' || !*q) {
            char c = *q;
            *q = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                MT_FAIL(MT_ERR_IO, "%s: cannot create the directory: %s", buf, strerror(errno));
            *q = c;
            if (!c)
                break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        MT_FAIL(MT_ERR_IO, "%s: not a directory", dir);
    return MT_OK;
}

/* Never overwrite a model: a directory may hold a tokenizer and such, but
 * not config.json or safetensors files already. */
static mt_status_t prepare_dir(const char *dir)
{
    MT_TRY(mkdir_p(dir));
    DIR *d = opendir(dir);
    if (!d)
        MT_FAIL(MT_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *x;
    char clash[300] = "";
    while ((x = readdir(d)) && !clash[0]) {
        size_t n = strlen(x->d_name);
        if (strcmp(x->d_name, "config.json") == 0 || strcmp(x->d_name, MT_HF_INDEX) == 0 ||
            (strncmp(x->d_name, "model", 5) == 0 && n > 12 &&
             strcmp(x->d_name + n - 12, ".safetensors") == 0))
            snprintf(clash, sizeof clash, "%s", x->d_name);
    }
    closedir(d);
    if (clash[0]) {
        mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s already holds %s: export writes a new "
                     "model and never overwrites one", dir, clash);
        mt_error_hint("choose a new directory, or remove config.json and the model*.safetensors "
                      "files first");
        return MT_ERR_IO;
    }
    return MT_OK;
}

static mt_status_t write_text(const char *dir, const char *name, const char *text)
{
    char path[MT_CKPT_PATH_CAP];
    MT_TRY(mt_ckpt_join(path, dir, name));
    FILE *f = fopen(path, "w");
    if (!f)
        MT_FAIL(MT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    if (bad)
        MT_FAIL(MT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return MT_OK;
}

static mt_status_t write_index(const char *dir, const plan_t *p)
{
    char *t = NULL, file[64];
    size_t len = 0;
    FILE *o = open_memstream(&t, &len);
    if (!o)
        MT_FAIL(MT_ERR_NOMEM, MT_HF_INDEX);
    fprintf(o, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
            (unsigned long long)p->total);
    for (int i = 0; i < p->n; i++) {
        shard_name(p, p->shard[i], file, sizeof file);
        fprintf(o, "%s\n    \"%s\": \"%s\"", i ? "," : "", p->t[i].name, file);
    }
    fputs("\n  }\n}\n", o);
    if (fclose(o) != 0 || !t) {
        free(t);
        MT_FAIL(MT_ERR_NOMEM, MT_HF_INDEX);
    }
    mt_status_t s = write_text(dir, MT_HF_INDEX, t);
    free(t);
    return s;
}

/* ------------------------------------------------------------ collective pieces */

static mt_status_t mpi_file_fail(int rc, const char *path, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    MT_FAIL(MT_ERR_IO, "%s: %s failed: %s", path, what, msg);
}

static mt_status_t bcast_text(MPI_Comm comm, char **text)
{
    int rank;
    long long len = 0;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    if (rank == 0)
        len = (long long)strlen(*text);
    MT_MPI_TRY(MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, comm));
    if (rank != 0 && !(*text = calloc((size_t)len + 1, 1)))
        MT_FAIL(MT_ERR_NOMEM, "%lld bytes of config text", len);
    MT_MPI_TRY(MPI_Bcast(*text, (int)len, MPI_CHAR, 0, comm));
    return MT_OK;
}

/* This rank's rows [*lo, *lo + *count) of R rows over P ranks. */
static void my_rows(int64_t R, int P, int r, int64_t *lo, int64_t *count)
{
    *lo = R * r / P;
    *count = R * (r + 1) / P - *lo;
}

/* Write my bytes of a tensor at `at`, in rounds that every rank joins. */
static mt_status_t write_rows(MPI_File fh, const char *path, uint64_t at, const unsigned char *b,
                              uint64_t mine, uint64_t most)
{
    uint64_t rounds = (most + CHUNK_BYTES - 1) / CHUNK_BYTES;
    mt_status_t s = MT_OK;
    for (uint64_t k = 0; k < (rounds ? rounds : 1); k++) {
        uint64_t off = k * CHUNK_BYTES;
        int n = off < mine ? (int)(mine - off < CHUNK_BYTES ? mine - off : CHUNK_BYTES) : 0;
        int rc = MPI_File_write_at_all(fh, (MPI_Offset)(at + off), n ? b + off : b, n, MPI_BYTE,
                                       MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS && s == MT_OK)
            s = mpi_file_fail(rc, path, "MPI_File_write_at_all");
    }
    return s;
}

static mt_status_t write_tensor(MPI_Comm comm, mt_ckpt_h5_reader_t *rd, MPI_File fh,
                                const char *path, const plan_t *p, int i, uint64_t data_start)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const mt_hf_tensor_t *t = &p->t[i];
    int64_t cols = t->ndim > 1 ? t->shape[1] : 1, lo, count;
    my_rows(t->shape[0], size, rank, &lo, &count);
    size_t es = mt_st_dtype_size(p->dtype);
    float *buf = malloc(sizeof(float) * (size_t)(count * cols > 0 ? count * cols : 1));
    mt_status_t s = mt_agree(comm, buf ? MT_OK : mt_error_set(MT_ERR_NOMEM, __FILE__,
                                  __LINE__, "%s: %lld rows", t->name, (long long)count));
    mt_ckpt_tensor_t ct = {.ndim = t->ndim, .row_offset = lo, .row_count = count, .data = buf};
    snprintf(ct.path, sizeof ct.path, "/model/%s", t->name);
    ct.shape[0] = t->shape[0];
    ct.shape[1] = t->shape[1];
    if (s == MT_OK)
        s = mt_ckpt_h5_read_rows(rd, &ct);
    if (s == MT_OK) {
        /* in place: element i's bytes never land past element i */
        mt_st_encode(buf, (size_t)(count * cols), p->dtype, (unsigned char *)buf);
        uint64_t row_bytes = (uint64_t)cols * es;
        uint64_t most = (uint64_t)((t->shape[0] + size - 1) / size) * row_bytes;
        s = write_rows(fh, path, data_start + p->e[i].begin + (uint64_t)lo * row_bytes,
                       (unsigned char *)buf, (uint64_t)count * row_bytes, most);
        s = mt_agree(comm, s);
    }
    free(buf);
    return s;
}

static mt_status_t write_shard(MPI_Comm comm, mt_ckpt_h5_reader_t *rd, const char *dir,
                               const plan_t *p, int k, FILE *out)
{
    int rank;
    MPI_Comm_rank(comm, &rank);
    char name[64], path[MT_CKPT_PATH_CAP];
    shard_name(p, k, name, sizeof name);
    MT_TRY(mt_ckpt_join(path, dir, name));
    int first = 0, n = 0;
    while (p->shard[first] != k)
        first++;
    while (first + n < p->n && p->shard[first + n] == k)
        n++;
    unsigned char *hdr = NULL;
    size_t hlen = 0;
    mt_status_t s = mt_agree(comm, mt_st_header_bytes(p->e + first, n, &hdr, &hlen));
    if (s != MT_OK)
        return s;
    MPI_File fh;
    int rc = MPI_File_open(comm, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh);
    s = mt_agree(comm, rc == MPI_SUCCESS ? MT_OK : mpi_file_fail(rc, path, "MPI_File_open"));
    if (s != MT_OK) {
        free(hdr);
        return s;
    }
    rc = MPI_File_set_size(fh, (MPI_Offset)(hlen + p->data_bytes[k]));
    s = rc == MPI_SUCCESS ? MT_OK : mpi_file_fail(rc, path, "MPI_File_set_size");
    if (s == MT_OK) {
        rc = MPI_File_write_at_all(fh, 0, hdr, rank == 0 ? (int)hlen : 0, MPI_BYTE,
                                   MPI_STATUS_IGNORE);
        s = rc == MPI_SUCCESS ? MT_OK : mpi_file_fail(rc, path, "writing the header");
    }
    s = mt_agree(comm, s);
    for (int i = first; i < first + n && s == MT_OK; i++)
        s = write_tensor(comm, rd, fh, path, p, i, hlen);
    rc = MPI_File_close(&fh);
    if (s == MT_OK)
        s = mt_agree(comm, rc == MPI_SUCCESS ? MT_OK
                                                  : mpi_file_fail(rc, path, "MPI_File_close"));
    free(hdr);
    if (s == MT_OK && rank == 0 && out)
        fprintf(out, "wrote %s: %d tensors, %llu bytes\n", path, n,
                (unsigned long long)(hlen + p->data_bytes[k]));
    return s;
}

/* ------------------------------------------------------------ export */

mt_status_t mt_hf_export(MPI_Comm comm, const char *step_dir, const char *hf_dir,
                         const mt_hf_export_opts_t *opts, FILE *out)
{
    int rank;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    mt_st_dtype_t dtype = opts->bf16 ? MT_ST_BF16 : MT_ST_F32;
    char *yaml = NULL, file[MT_CKPT_PATH_CAP], *json = NULL;
    mt_status_t s = mt_ckpt_join(file, step_dir, MT_CKPT_FILE);
    /* The manifest is checked once, by rank 0, as a load does. */
    if (s == MT_OK && rank == 0)
        s = mt_ckpt_verify(step_dir);
    if (s == MT_OK && rank == 0)
        s = mt_ckpt_read_config(step_dir, &yaml);
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = mt_agree(comm, bcast_text(comm, &yaml));
    mt_config_t *cfg = calloc(1, sizeof *cfg);
    plan_t p = {0};
    if (s == MT_OK && !cfg)
        s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "config");
    if (s == MT_OK) {
        char name[MT_CKPT_PATH_CAP + 32];
        snprintf(name, sizeof name, "%s /meta config", file);
        mt_config_init(cfg);
        s = mt_config_load_string(cfg, yaml, name);
    }
    const mt_model_config_t *mc = &cfg->model;
    if (s == MT_OK && mc->num_experts > 0 &&
        (!mc->qk_norm || mc->num_shared_experts > 0 || mc->moe_capacity_factor > 0 ||
         mc->moe_router_bias_update_rate > 0))
        s = mt_error_set(MT_ERR_UNSUPPORTED, __FILE__, __LINE__, "%s: this mixture-of-experts "
                         "model is not a Hugging Face Qwen3-MoE (%s); export writes Llama, "
                         "Qwen3 and Qwen3-MoE models only", file,
                         !mc->qk_norm ? "it has no qk_norm"
                         : mc->num_shared_experts > 0 ? "it has shared experts"
                         : mc->moe_capacity_factor > 0 ? "it drops tokens over a capacity factor"
                                                       : "it balances with a router bias");
    if (s == MT_OK)
        s = make_plan(&p, &cfg->model, dtype, opts->max_shard_bytes);
    if (s == MT_OK)
        s = mt_hf_config_json(&cfg->model, dtype, &json);
    s = mt_agree(comm, s);
    if (s == MT_OK && rank == 0)
        s = check_tensors(step_dir, &p);
    if (s == MT_OK && rank == 0)
        s = prepare_dir(hf_dir);
    s = mt_agree(comm, s);

    mt_ckpt_h5_reader_t *rd = NULL;
    if (s == MT_OK)
        s = mt_ckpt_h5_open(comm, file, &rd);
    for (int k = 0; k < p.nshards && s == MT_OK; k++)
        s = write_shard(comm, rd, hf_dir, &p, k, out);
    if (rd)
        s = mt_ckpt_h5_close(rd, s);
    /* config.json last: a directory without it is not a model yet */
    if (s == MT_OK && rank == 0 && p.nshards > 1)
        s = write_index(hf_dir, &p);
    if (s == MT_OK && rank == 0)
        s = write_text(hf_dir, "config.json", json);
    s = mt_agree(comm, s);
    if (s == MT_OK && rank == 0 && out)
        fprintf(out, "exported %s to %s: %s, %d tensors, %llu bytes of %s in %d file%s\n",
                step_dir, hf_dir, cfg->model.num_experts > 0 ? "Qwen3MoeForCausalLM"
                                  : cfg->model.qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM",
                p.n, (unsigned long long)p.total, opts->bf16 ? "bfloat16" : "float32", p.nshards,
                p.nshards > 1 ? "s plus " MT_HF_INDEX : "");
    plan_free(&p);
    free(json);
    free(cfg);
    free(yaml);
    return s;
}
