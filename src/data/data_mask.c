/* data_mask.c: per-token loss masks beside token files, and datasets
 * made of several token files (mt_data.h).
 *
 * A mask is mapped read-only and checked once at open: magic, token count,
 * exact size, every byte 0 or 1.  A concatenation owns its parts and
 * forwards reads to them; documents never cross a part boundary.  Writing
 * masks is meshtrain-data's (and the tests'), not this file's. */
#include <config.h>

#include "mt_data.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MASK_MAGIC "MTLMASK1"
#define MASK_HEADER_BYTES 16

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

void mt_dataset_mask_path(const mt_dataset_t *ds, char *out, size_t cap)
{
    size_t n = strlen(ds->path);
    /* a Megatron dataset named by PREFIX.bin or PREFIX.idx: the prefix's */
    if (ds->format == MT_DATA_MEGATRON &&
        (ends_with(ds->path, ".bin") || ends_with(ds->path, ".idx")))
        n -= 4;
    snprintf(out, cap, "%.*s.lossmask", (int)n, ds->path);
}

static mt_status_t check_mask(mt_dataset_t *ds, const unsigned char *b, size_t len)
{
    const char *f = ds->mask_path;
    if (len < MASK_HEADER_BYTES || memcmp(b, MASK_MAGIC, 8) != 0) {
        if (len < 8 || memcmp(b, MASK_MAGIC, 8) != 0)
            MT_FAIL(MT_ERR_IO, "%s: not a loss mask (expected the magic \"" MASK_MAGIC "\" in "
                    "bytes 0..7)", f);
        MT_FAIL(MT_ERR_IO, "%s: truncated: %zu bytes, shorter than the %d-byte loss-mask header",
                f, len, MASK_HEADER_BYTES);
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | b[8 + i];
    if (n != (uint64_t)ds->n_tokens)
        MT_FAIL(MT_ERR_IO, "%s: the mask is for %llu tokens but %s has %lld", f,
                (unsigned long long)n, ds->path, (long long)ds->n_tokens);
    if (len != MASK_HEADER_BYTES + n)
        MT_FAIL(MT_ERR_IO, "%s: %s: %llu tokens need %llu bytes but the file has %zu", f,
                len < MASK_HEADER_BYTES + n ? "truncated" : "size mismatch",
                (unsigned long long)n, (unsigned long long)(MASK_HEADER_BYTES + n), len);
    const unsigned char *m = b + MASK_HEADER_BYTES;
    for (uint64_t j = 0; j < n; j++)
        if (m[j] > 1)
            MT_FAIL(MT_ERR_IO, "%s: byte %d at offset %llu (token %llu) is not 0 or 1", f,
                    (int)m[j], (unsigned long long)(MASK_HEADER_BYTES + j),
                    (unsigned long long)j);
    return MT_OK;
}

mt_status_t mt_dataset_open_mask(mt_dataset_t *ds, mt_loss_mask_t mode, bool *found)
{
    *found = false;
    assert(ds->n_parts == 0);
    if (mode == MT_LOSS_MASK_OFF)
        return MT_OK;
    mt_dataset_mask_path(ds, ds->mask_path, sizeof ds->mask_path);
    int fd = open(ds->mask_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT && mode == MT_LOSS_MASK_AUTO)
            return MT_OK;
        mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: cannot open the loss mask of %s: %s",
                     ds->mask_path, ds->path, strerror(e));
        if (e == ENOENT)
            mt_error_hint("dataset.loss_mask is required: every token file needs its "
                          "PATH.lossmask (meshtrain-data writes it for prompt/completion and "
                          "chat data); set loss_mask auto or off to train without one");
        return MT_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        MT_FAIL(MT_ERR_IO, "%s: the loss mask is not a regular file", ds->mask_path);
    }
    void *p = NULL;
    if (st.st_size > 0) {
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            MT_FAIL(MT_ERR_IO, "%s: cannot map the loss mask: %s", ds->mask_path, strerror(e));
        }
    }
    close(fd);
    ds->mask_map = p, ds->mask_len = (size_t)st.st_size;
    mt_status_t s = check_mask(ds, p ? p : (const void *)"", ds->mask_len);
    if (s != MT_OK) {
        if (p)
            munmap(p, ds->mask_len);
        ds->mask_map = NULL, ds->mask_len = 0;
        return s;
    }
    ds->mask = (const unsigned char *)p + MASK_HEADER_BYTES;
    *found = true;
    return MT_OK;
}

static void read_part(const mt_dataset_t *part, int64_t at, int64_t k, void *out)
{
    mt_dataset_read_mask(part, at, k, out);
}

void mt_dataset_read_mask(const mt_dataset_t *ds, int64_t start, int64_t n, unsigned char *out)
{
    assert(start >= 0 && n >= 0 && start + n <= ds->n_tokens);
    if (ds->n_parts > 0) {
        mt_dataset_each_part(ds, start, n, out, 1, read_part);
        return;
    }
    if (ds->mask)
        memcpy(out, ds->mask + start, (size_t)n);
    else
        memset(out, 1, (size_t)n);
}

int mt_dataset_masked_parts(const mt_dataset_t *ds)
{
    if (ds->n_parts == 0)
        return ds->mask != NULL;
    int k = 0;
    for (int i = 0; i < ds->n_parts; i++)
        k += ds->parts[i].mask != NULL;
    return k;
}

mt_status_t mt_dataset_concat(mt_dataset_t *ds, mt_dataset_t *parts, int n)
{
    memset(ds, 0, sizeof *ds);
    assert(n >= 1);
    for (int i = 1; i < n; i++)
        if (parts[i].token_bytes != parts[0].token_bytes)
            MT_FAIL(MT_ERR_IO, "%s has %d-byte tokens but %s has %d-byte tokens: the files of "
                    "one dataset must come from the same tokenizer", parts[i].path,
                    parts[i].token_bytes, parts[0].path, parts[0].token_bytes);
    int64_t docs = 0;
    for (int i = 0; i < n; i++)
        docs += parts[i].n_docs;
    ds->parts = malloc(sizeof *ds->parts * (size_t)n);
    ds->part_start = malloc(sizeof *ds->part_start * (size_t)(n + 1));
    ds->doc_start = malloc(sizeof *ds->doc_start * (size_t)(docs + 1));
    if (!ds->parts || !ds->part_start || !ds->doc_start) {
        free(ds->parts), free(ds->part_start), free(ds->doc_start);
        memset(ds, 0, sizeof *ds);
        MT_FAIL(MT_ERR_NOMEM, "%s: no memory for a dataset of %d files", parts[0].path, n);
    }
    snprintf(ds->path, sizeof ds->path, "%s%s", parts[0].path, n > 1 ? " (and more)" : "");
    ds->format = parts[0].format;
    ds->token_bytes = parts[0].token_bytes;
    int64_t t = 0, d = 0;
    for (int i = 0; i < n; i++) {
        ds->part_start[i] = t;
        for (int64_t k = 0; k < parts[i].n_docs; k++)
            ds->doc_start[d++] = t + parts[i].doc_start[k];
        t += parts[i].n_tokens;
        ds->parts[i] = parts[i];
    }
    ds->part_start[n] = t;
    ds->doc_start[d] = t;
    ds->n_docs = d;
    ds->n_tokens = t;
    ds->n_parts = n;
    memset(parts, 0, sizeof *parts * (size_t)n); /* moved */
    return MT_OK;
}
