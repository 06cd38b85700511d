/* hf_source.c: the safetensors weights of a Hugging Face directory, as
 * import (hf_import.c) and loading by name at start (hf_load.c) read them.
 *
 * Opening reads model.safetensors, or the index and every shard it names,
 * header by header (small); checks compare the tensors with the list the
 * model section implies; reading takes one block of rows and columns of
 * one tensor with pread, never a whole file, converting F32, BF16 or F16
 * to float32.  No MPI: the callers agree on the outcome. */
#include "hf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_internal.h"

#define MAX_JSON_BYTES (64u << 20)
#define CHUNK_BYTES (256u << 10) /* one read: pread's copy stays in the cache */

void mt_hf_source_free(mt_hf_source_t *src)
{
    for (int i = 0; i < src->nf; i++)
        mt_st_file_free(&src->f[i]);
    free(src->f);
    memset(src, 0, sizeof *src);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static mt_status_t add_file(mt_hf_source_t *src, const char *path)
{
    mt_st_file_t *f = realloc(src->f, sizeof *f * (size_t)(src->nf + 1));
    if (!f)
        MT_FAIL(MT_ERR_NOMEM, "safetensors file list");
    src->f = f;
    MT_TRY(mt_st_read_header(path, &src->f[src->nf]));
    src->nf++;
    return MT_OK;
}

const mt_st_entry_t *mt_hf_source_find(const mt_hf_source_t *src, const char *name, int *file)
{
    for (int i = 0; i < src->nf; i++)
        for (int k = 0; k < src->f[i].n; k++)
            if (strcmp(src->f[i].e[k].name, name) == 0) {
                if (file)
                    *file = i;
                return &src->f[i].e[k];
            }
    return NULL;
}

/* One weight_map member: the shard it names exists, is opened (once) and
 * its header has the tensor. */
static mt_status_t map_entry(mt_hf_source_t *src, const char *hf_dir, const char *index,
                             const char *tensor, const json_t *v)
{
    const char *file = json_string_value(v);
    if (!file || !file[0] || strchr(file, '/') || file[0] == '.')
        MT_FAIL(MT_ERR_IO, "%s: weight_map \"%s\" must name a file in the same directory", index,
                tensor);
    int known = 0;
    for (int k = 0; k < src->nf && !known; k++) {
        const char *base = strrchr(src->f[k].path, '/');
        known = strcmp(base ? base + 1 : src->f[k].path, file) == 0;
    }
    if (!known) {
        char path[MT_CKPT_PATH_CAP];
        MT_TRY(mt_ckpt_join(path, hf_dir, file));
        if (!exists(path))
            MT_FAIL(MT_ERR_IO, "%s maps %s to %s, which is missing from %s: an incomplete "
                    "download or copy", index, tensor, file, hf_dir);
        MT_TRY(add_file(src, path));
    }
    int at;
    if (!mt_hf_source_find(src, tensor, &at) ||
        strcmp(strrchr(src->f[at].path, '/') + 1, file) != 0)
        MT_FAIL(MT_ERR_IO, "%s maps %s to %s, whose header does not have it", index, tensor, file);
    return MT_OK;
}

/* The index's weight_map and the shards' headers must agree exactly. */
static mt_status_t open_index(mt_hf_source_t *src, const char *hf_dir, const char *index)
{
    json_t *j;
    MT_TRY(mt_hf_json_load(index, MAX_JSON_BYTES, &j));
    json_t *wm = json_object_get(j, "weight_map");
    mt_status_t s = MT_OK;
    if (!json_is_object(wm))
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: no \"weight_map\" object", index);
    const char *tensor;
    json_t *v;
    json_object_foreach(wm, tensor, v) /* none unless an object */
        if ((s = map_entry(src, hf_dir, index, tensor, v)) != MT_OK)
            break;
    for (int k = 0; k < src->nf && s == MT_OK; k++)
        for (int e = 0; e < src->f[k].n && s == MT_OK; e++)
            if (!json_object_get(wm, src->f[k].e[e].name))
                s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s has tensor %s, which %s "
                                 "does not list", src->f[k].path, src->f[k].e[e].name, index);
    json_decref(j);
    return s;
}

mt_status_t mt_hf_source_open(mt_hf_source_t *src, const char *hf_dir)
{
    char single[MT_CKPT_PATH_CAP], index[MT_CKPT_PATH_CAP];
    memset(src, 0, sizeof *src);
    MT_TRY(mt_ckpt_join(single, hf_dir, MT_HF_SINGLE));
    MT_TRY(mt_ckpt_join(index, hf_dir, MT_HF_INDEX));
    if (exists(single))
        return add_file(src, single);
    if (exists(index))
        return open_index(src, hf_dir, index);
    MT_FAIL(MT_ERR_IO, "%s: no " MT_HF_SINGLE " and no " MT_HF_INDEX ": meshtrain reads "
            "safetensors weights (convert .bin or .pth weights with transformers first)", hf_dir);
}

mt_status_t mt_hf_check_shape(const char *path, const mt_st_entry_t *e, int ndim,
                              const int64_t *shape, const char *pre, const char *post)
{
    int same = e->ndim == ndim;
    for (int d = 0; same && d < e->ndim; d++)
        same = e->shape[d] == shape[d];
    if (same)
        return MT_OK;
    char have[MT_HF_SHAPE_TEXT_CAP], want[MT_HF_SHAPE_TEXT_CAP];
    mt_hf_shape_text(e->ndim, e->shape, have, sizeof have);
    mt_hf_shape_text(ndim, shape, want, sizeof want);
    MT_FAIL(MT_ERR_IO, "%s: tensor %s has shape %s, %s %s%s", path, e->name, have, pre, want,
            post);
}

void mt_hf_shape_text(int ndim, const int64_t *shape, char *buf, size_t cap)
{
    if (cap < 8) {
        if (cap)
            buf[0] = '\0';
        return;
    }
    /* Leave room for "...]" and the NUL so a text cut short says so. */
    size_t n = 1, room = cap - 5;
    buf[0] = '[';
    int d = 0;
    for (; d < ndim; d++) {
        char one[32];
        int k = snprintf(one, sizeof one, "%s%lld", d ? ", " : "", (long long)shape[d]);
        if (k < 0 || (size_t)k >= room - n)
            break;
        memcpy(buf + n, one, (size_t)k);
        n += (size_t)k;
    }
    snprintf(buf + n, cap - n, "%s]", d < ndim ? "..." : "");
}

static const char *arch_of(const mt_model_config_t *m)
{
    return m->architecture != MT_ARCH_AUTO ? mt_arch_name(m->architecture)
           : m->num_experts > 0 ? "Qwen3MoeForCausalLM"
           : m->qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
}

mt_status_t mt_hf_source_check(const mt_hf_source_t *src, const mt_hf_tensor_t *t, int n,
                               const mt_model_config_t *m, const char *hf_dir, FILE *note)
{
    const char *arch = arch_of(m);
    for (int i = 0; i < n; i++) {
        int fi;
        const mt_st_entry_t *e = mt_hf_source_find(src, t[i].name, &fi);
        if (!e) {
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: tensor %s is missing: config.json "
                         "describes a %s with %lld layers%s, which has it", hf_dir, t[i].name,
                         arch, (long long)m->num_hidden_layers,
                         m->tie_word_embeddings ? "" : " and an untied lm_head");
            return MT_ERR_IO;
        }
        MT_TRY(mt_hf_check_shape(src->f[fi].path, e, t[i].ndim, t[i].shape, "expected",
                                 " from config.json"));
        if (e->dtype == MT_ST_OTHER)
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s; meshtrain reads F32, BF16 "
                    "and F16", src->f[fi].path, t[i].name, e->dtype_text);
    }
    for (int k = 0; k < src->nf; k++)
        for (int x = 0; x < src->f[k].n; x++) {
            const char *name = src->f[k].e[x].name;
            int expected = 0;
            for (int i = 0; i < n && !expected; i++)
                expected = strcmp(t[i].name, name) == 0;
            if (expected)
                continue;
            size_t len = strlen(name);
            int inv_freq = len > 20 && strcmp(name + len - 20, ".rotary_emb.inv_freq") == 0;
            if (inv_freq || (m->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0)) {
                if (note)
                    fprintf(note, "note: ignoring %s in %s: %s\n", name, src->f[k].path,
                            inv_freq ? "RoPE frequencies are computed, not loaded"
                                     : "tie_word_embeddings is true, so lm_head is the embedding");
                continue;
            }
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: tensor %s is not part of the %s "
                         "config.json describes", src->f[k].path, name, arch);
            mt_error_hint("a different model's weights, or an architecture variant meshtrain "
                          "does not support (biases, MoE ...)");
            return MT_ERR_IO;
        }
    return MT_OK;
}

/* bytes at `at` of f into b, all of them */
static mt_status_t pread_all(int fd, const mt_st_file_t *f, const mt_st_entry_t *e,
                             unsigned char *b, size_t bytes, uint64_t at)
{
    size_t done = 0;
    while (done < bytes) {
        ssize_t r = pread(fd, b + done, bytes - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            MT_FAIL(MT_ERR_IO, "%s: reading %s failed: %s", f->path, e->name,
                    r == 0 ? "the file is shorter than its header says (truncated)"
                           : strerror(errno));
        done += (size_t)r;
    }
    return MT_OK;
}

mt_status_t mt_hf_read_block(const mt_st_file_t *f, const mt_st_entry_t *e, int64_t row_lo,
                             int64_t rows, int64_t col_lo, int64_t ncols, float *dst)
{
    int64_t cols = 1;
    for (int d = 1; d < e->ndim; d++)
        cols *= e->shape[d];
    if (ncols == 0)
        col_lo = 0, ncols = cols;
    int64_t have_rows = e->ndim ? e->shape[0] : 1;
    if (rows == 0)
        return MT_OK;
    if (row_lo < 0 || rows < 0 || row_lo + rows > have_rows || col_lo < 0 ||
        col_lo + ncols > cols)
        MT_FAIL(MT_ERR_RANGE, "%s: tensor %s: block rows [%lld, %lld) x columns [%lld, %lld) "
                "is outside its shape", f->path, e->name, (long long)row_lo,
                (long long)(row_lo + rows), (long long)col_lo, (long long)(col_lo + ncols));
    size_t es = mt_st_dtype_size(e->dtype);
    /* whole rows are one contiguous range; a column block is one range
     * per row.  Each range is read in chunks small enough to stay in the
     * cache between pread and the conversion. */
    int whole_rows = ncols == cols;
    uint64_t run = (uint64_t)(whole_rows ? rows * cols : ncols) * es;
    size_t cap = run < CHUNK_BYTES ? (size_t)run : CHUNK_BYTES;
    unsigned char *b = malloc(cap ? cap : 1);
    if (!b)
        MT_FAIL(MT_ERR_NOMEM, "%s: a buffer of %zu bytes for %s", f->path, cap, e->name);
    int fd = open(f->path, O_RDONLY);
    mt_status_t s = fd >= 0 ? MT_OK
                            : mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: %s", f->path,
                                           strerror(errno));
    int64_t nruns = whole_rows ? 1 : rows;
    for (int64_t r = 0; r < nruns && s == MT_OK; r++) {
        uint64_t at = f->data_start + e->begin +
                      ((uint64_t)(row_lo + r) * (uint64_t)cols + (uint64_t)col_lo) * es;
        float *out = dst + r * ncols;
        for (uint64_t off = 0; off < run && s == MT_OK; off += cap) {
            size_t k = run - off < cap ? (size_t)(run - off) : cap;
            s = pread_all(fd, f, e, b, k, at + off);
            if (s == MT_OK)
                mt_st_decode(b, k / es, e->dtype, out + off / es);
        }
    }
    if (fd >= 0)
        close(fd);
    free(b);
    return s;
}
