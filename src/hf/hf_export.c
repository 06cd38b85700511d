/* hf_export.c: writing a Hugging Face model directory in parallel, and
 * meshtrain-ckpt export, a checkpoint's /model tensors as one: config.json
 * plus model.safetensors, or model-0000i-of-0000N shards plus
 * model.safetensors.index.json.
 *
 * Every rank computes the same plan (tensor order, shards, offsets).
 * Rank 0 creates each shard at its full size and writes its header; then
 * every rank converts the values it holds of each tensor and writes their
 * bytes at their offsets with pwrite, so a rank holds one tensor's block
 * at a time, never the model.  Where the values come from is the caller's
 * (mt_hf_rows_t): here, each rank's rows of model.h5 (collective HDF5 over
 * MPI-IO); in a training run's consolidated save (hf_consolidate.c), the
 * blocks the ranks hold.  Rank 0 writes the index; config.json is the
 * caller's, written last.  Optimizer state and /train are not exported.
 * The file system must take writes to disjoint ranges of one file from
 * many processes (local disks, Lustre, GPFS do). */
#include "hf_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_cli_internal.h"
#include "mt_comm.h"

#define ROW_CHUNK_BYTES (64 << 20) /* converted bytes per pwrite of whole rows */

void mt_hf_plan_free(mt_hf_plan_t *p)
{
    free(p->t);
    free(p->e);
    free(p->shard);
    free(p->data_bytes);
    memset(p, 0, sizeof *p);
}

static void shard_name(const mt_hf_plan_t *p, int i, char *buf, size_t cap)
{
    if (p->nshards == 1)
        snprintf(buf, cap, MT_HF_SINGLE);
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", i + 1, p->nshards);
}

/* Greedy, in model order, as transformers shards: a new file starts when
 * the next tensor would take this one over the limit; a tensor larger than
 * the limit gets a file of its own. */
mt_status_t mt_hf_plan(mt_hf_plan_t *p, const mt_model_config_t *m, const mt_st_dtype_t *dtypes,
                       mt_st_dtype_t dtype, int64_t max_shard)
{
    memset(p, 0, sizeof *p);
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
        e->dtype = dtypes ? dtypes[i] : dtype;
        if (!mt_st_dtype_size(e->dtype))
            MT_FAIL(MT_ERR_RANGE, "%s: no dtype to write it in", e->name);
        e->ndim = p->t[i].ndim;
        uint64_t bytes = mt_st_dtype_size(e->dtype);
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

mt_status_t mt_hf_check_writable(const mt_model_config_t *mc, const char *what)
{
    const mt_hf_arch_t *a = mt_hf_arch(mt_model_arch(mc));
    const char *why = NULL;
    if (mc->num_experts > 0 && a && a->qk_norm && !mc->qk_norm)
        why = "it has no qk_norm";
    else if (mc->num_experts > 0 && mc->moe_capacity_factor > 0)
        why = "it drops tokens over a capacity factor";
    if (why)
        MT_FAIL(MT_ERR_UNSUPPORTED, "%s: this mixture-of-experts model is not a Hugging Face %s "
                "(%s)", what, a ? a->cls : mt_arch_name(mt_model_arch(mc)), why);
    /* the rest is what its config.json could not say */
    char *text = NULL;
    mt_status_t s = mt_hf_config_json(mc, MT_ST_F32, &text);
    free(text);
    if (s != MT_OK)
        mt_error_append(" (%s)", what);
    return s;
}

const char *mt_hf_arch_name(const mt_model_config_t *m)
{
    return mt_arch_name(mt_model_arch(m));
}

/* ------------------------------------------------------------ rank 0's checks */

/* The file's /model datasets must be exactly the tensors the stored config
 * describes, float32 and of the same shapes. */
static mt_status_t check_tensors(const char *step_dir, const mt_hf_plan_t *p)
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

mt_status_t mt_hf_mkdir_p(const char *dir)
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
    MT_TRY(mt_hf_mkdir_p(dir));
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

mt_status_t mt_hf_write_text(const char *dir, const char *name, const char *text)
{
    char path[MT_CKPT_PATH_CAP];
    MT_TRY(mt_ckpt_join(path, dir, name));
    FILE *f = fopen(path, "w");
    if (!f)
        MT_FAIL(MT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad)
        MT_FAIL(MT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return MT_OK;
}

static mt_status_t write_index(const char *dir, const mt_hf_plan_t *p)
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
    mt_status_t s = mt_hf_write_text(dir, MT_HF_INDEX, t);
    free(t);
    return s;
}

/* ------------------------------------------------------------ the parallel writer */

mt_status_t mt_hf_bcast_text(MPI_Comm comm, char **text)
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

/* mt_st_encode writes F32 and BF16; a model that came as F16 goes back
 * as F16 */
uint16_t mt_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep the top of the payload, quiet */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* 65520 and up round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal: rebias the exponent, round the mantissa */
        uint32_t h = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
        h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
        return (uint16_t)(sign | h);
    }
    /* subnormal: round(|f| x 2^24) */
    int shift = 126 - (int)(ax >> 23);
    if (shift > 24)
        return sign;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u, h = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    h += rem > half || (rem == half && (h & 1u));
    return (uint16_t)(sign | h);
}

static void encode(const float *v, size_t n, mt_st_dtype_t d, unsigned char *dst)
{
    if (d != MT_ST_F16) {
        mt_st_encode(v, n, d, dst);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h = mt_f32_to_f16(v[i]);
        dst[2 * i] = (unsigned char)h, dst[2 * i + 1] = (unsigned char)(h >> 8);
    }
}

static mt_status_t pwrite_all(int fd, const char *path, const unsigned char *b, size_t len,
                              uint64_t at)
{
    while (len > 0) {
        ssize_t w = pwrite(fd, b, len, (off_t)at);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            MT_FAIL(MT_ERR_IO, "%s: writing %zu bytes at offset %llu failed: %s", path, len,
                    (unsigned long long)at, w < 0 ? strerror(errno) : "nothing written");
        b += w, len -= (size_t)w, at += (uint64_t)w;
    }
    return MT_OK;
}

/* Block b of tensor i (values v, row-major b[1] x b[3]) into the shard
 * open at fd whose data starts at data_start: whole rows are contiguous
 * in the file and go in large writes, a column block row by row. */
static mt_status_t put_block(int fd, const char *path, const mt_hf_plan_t *p, int i,
                             uint64_t data_start, const int64_t b[4], const float *v,
                             unsigned char **buf, size_t *cap)
{
    const mt_st_entry_t *e = &p->e[i];
    int64_t cols = e->ndim > 1 ? e->shape[1] : 1;
    size_t es = mt_st_dtype_size(e->dtype), row = (size_t)b[3] * es;
    int64_t per = b[3] == cols ? (int64_t)(ROW_CHUNK_BYTES / (row ? row : 1)) : 1;
    if (per < 1)
        per = 1;
    if (per > b[1])
        per = b[1];
    if ((size_t)per * row > *cap) {
        unsigned char *nb = realloc(*buf, (size_t)per * row);
        if (!nb)
            MT_FAIL(MT_ERR_NOMEM, "%s: %zu bytes of converted rows", e->name, (size_t)per * row);
        *buf = nb, *cap = (size_t)per * row;
    }
    for (int64_t r = 0; r < b[1]; r += per) {
        int64_t k = b[1] - r < per ? b[1] - r : per;
        encode(v + r * b[3], (size_t)(k * b[3]), e->dtype, *buf);
        uint64_t at = data_start + e->begin + ((uint64_t)(b[0] + r) * (uint64_t)cols +
                                               (uint64_t)b[2]) * es;
        MT_TRY(pwrite_all(fd, path, *buf, (size_t)k * row, at));
    }
    return MT_OK;
}

/* Rank 0: shard k created at its full size, header in place. */
static mt_status_t create_shard(const char *path, const unsigned char *hdr, size_t hlen,
                                uint64_t data_bytes)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    mt_status_t s = MT_OK;
    if (ftruncate(fd, (off_t)(hlen + data_bytes)) != 0)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: cannot size it to %llu bytes: %s",
                         path, (unsigned long long)(hlen + data_bytes), strerror(errno));
    if (s == MT_OK)
        s = pwrite_all(fd, path, hdr, hlen, 0);
    if (close(fd) != 0 && s == MT_OK)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: close failed: %s", path,
                         strerror(errno));
    return s;
}

static mt_status_t write_shard(MPI_Comm comm, const char *dir, const mt_hf_plan_t *p, int k,
                               mt_hf_rows_t *src, FILE *out)
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
    unsigned char *hdr = NULL, *buf = NULL;
    size_t hlen = 0, cap = 0;
    mt_status_t s = mt_agree(comm, mt_st_header_bytes(p->e + first, n, &hdr, &hlen));
    if (s == MT_OK)
        s = mt_agree(comm, rank == 0 ? create_shard(path, hdr, hlen, p->data_bytes[k]) : MT_OK);
    free(hdr);
    int fd = -1;
    if (s == MT_OK && (fd = open(path, O_WRONLY)) < 0)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: cannot open for writing: %s", path,
                         strerror(errno));
    s = mt_agree(comm, s);
    for (int i = first; i < first + n && s == MT_OK; i++) {
        int64_t b[4] = {0, 0, 0, 0};
        const float *v = NULL;
        s = src->get(src, comm, p, i, b, &v); /* agreed where it is collective */
        if (s == MT_OK && b[1] > 0 && b[3] > 0)
            s = put_block(fd, path, p, i, hlen, b, v, &buf, &cap);
        s = mt_agree(comm, s);
    }
    if (fd >= 0) {
        /* durable before anything names this file part of a model */
        int bad = s == MT_OK && fsync(fd) != 0 && errno != EINVAL;
        bad |= close(fd) != 0;
        if (bad && s == MT_OK)
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: cannot make it durable: %s",
                             path, strerror(errno));
    }
    s = mt_agree(comm, s);
    free(buf);
    if (s == MT_OK && rank == 0 && out)
        fprintf(out, "wrote %s: %d tensors, %llu bytes\n", path, n,
                (unsigned long long)(hlen + p->data_bytes[k]));
    return s;
}

mt_status_t mt_hf_write_weights(MPI_Comm comm, const char *dir, const mt_hf_plan_t *p,
                                mt_hf_rows_t *src, FILE *out)
{
    int rank;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    mt_status_t s = MT_OK;
    for (int k = 0; k < p->nshards && s == MT_OK; k++)
        s = write_shard(comm, dir, p, k, src, out);
    if (s == MT_OK && rank == 0 && p->nshards > 1)
        s = write_index(dir, p);
    return mt_agree(comm, s);
}

/* ------------------------------------------------------------ export: rows from model.h5 */


/* This rank's rows [*lo, *lo + *count) of R rows over P ranks. */
static void my_rows(int64_t R, int P, int r, int64_t *lo, int64_t *count)
{
    *lo = R * r / P;
    *count = R * (r + 1) / P - *lo;
}

mt_status_t mt_hf_h5_get(mt_hf_rows_t *base, MPI_Comm comm, const mt_hf_plan_t *p, int i,
                         int64_t b[4], const float **v)
{
    mt_hf_h5_rows_t *r = (mt_hf_h5_rows_t *)base;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const mt_hf_tensor_t *t = &p->t[i];
    int64_t cols = t->ndim > 1 ? t->shape[1] : 1, lo, count;
    my_rows(t->shape[0], size, rank, &lo, &count);
    size_t need = (size_t)(count * cols > 0 ? count * cols : 1);
    mt_status_t s = MT_OK;
    if (need > r->cap) {
        float *nb = realloc(r->buf, sizeof(float) * need);
        if (nb)
            r->buf = nb, r->cap = need;
        else
            s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "%s: %lld rows", t->name,
                             (long long)count);
    }
    MT_TRY(mt_agree(comm, s));
    mt_ckpt_tensor_t ct = {.ndim = t->ndim, .row_offset = lo, .row_count = count, .data = r->buf};
    snprintf(ct.path, sizeof ct.path, "/model/%s", t->name);
    ct.shape[0] = t->shape[0];
    ct.shape[1] = t->shape[1];
    MT_TRY(mt_ckpt_h5_read_rows(r->rd, &ct));
    b[0] = lo, b[1] = count, b[2] = 0, b[3] = cols;
    *v = r->buf;
    return MT_OK;
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
        s = mt_agree(comm, mt_hf_bcast_text(comm, &yaml));
    mt_config_t *cfg = calloc(1, sizeof *cfg);
    mt_hf_plan_t p = {0};
    if (s == MT_OK && !cfg)
        s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "config");
    if (s == MT_OK) {
        char name[MT_CKPT_PATH_CAP + 32];
        snprintf(name, sizeof name, "%s /meta config", file);
        mt_config_init(cfg);
        s = mt_config_load_string(cfg, yaml, name);
    }
    if (s == MT_OK)
        s = mt_hf_check_writable(&cfg->model, file);
    if (s == MT_OK)
        s = mt_hf_plan(&p, &cfg->model, NULL, dtype, opts->max_shard_bytes);
    if (s == MT_OK)
        s = mt_hf_config_json(&cfg->model, dtype, &json);
    s = mt_agree(comm, s);
    if (s == MT_OK && rank == 0)
        s = check_tensors(step_dir, &p);
    if (s == MT_OK && rank == 0)
        s = prepare_dir(hf_dir);
    s = mt_agree(comm, s);

    mt_hf_h5_rows_t src = {{mt_hf_h5_get}, NULL, NULL, 0};
    if (s == MT_OK)
        s = mt_ckpt_h5_open(comm, file, &src.rd);
    if (s == MT_OK)
        s = mt_hf_write_weights(comm, hf_dir, &p, &src.base, out);
    if (src.rd)
        s = mt_ckpt_h5_close(src.rd, s);
    free(src.buf);
    /* config.json last: a directory without it is not a model yet */
    if (s == MT_OK && rank == 0)
        s = mt_hf_write_text(hf_dir, "config.json", json);
    s = mt_agree(comm, s);
    if (s == MT_OK && rank == 0 && out)
        fprintf(out, "exported %s to %s: %s, %d tensors, %llu bytes of %s in %d file%s\n",
                step_dir, hf_dir, mt_hf_arch_name(&cfg->model), p.n, (unsigned long long)p.total,
                opts->bf16 ? "bfloat16" : "float32", p.nshards,
                p.nshards > 1 ? "s plus " MT_HF_INDEX : "");
    mt_hf_plan_free(&p);
    free(json);
    free(cfg);
    free(yaml);
    return s;
}
