/* data_write.c: the byte-level tokenizer, the serial token-file writers
 * (tests, small tools) and meshtrain-data --inspect.
 *
 * Files are written to PATH.tmp and renamed into place, so a failed or
 * interrupted run never leaves a partial file under the final name (make
 * would take it as up to date).  Fields are written as little-endian bytes
 * whatever the host.  Not here: reading and validation (data.c), and the
 * parallel tokenize-and-write pipeline of meshtrain-data (data_par.c). */
#include <config.h>

#include "mt_data.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int64_t mt_tokenize_bytes(const unsigned char *text, int64_t len, int32_t *out)
{
    for (int64_t i = 0; i < len; i++)
        out[i] = text[i];
    return len;
}

/* ------------------------------------------------------------------ writers */

typedef struct {
    FILE *f;
    const char *path;
    char tmp[MT_PATH_MAX + 16];
    unsigned char buf[1 << 16];
    size_t used;
} writer_t;

static mt_status_t w_open(writer_t *w, const char *path)
{
    w->path = path;
    w->used = 0;
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    w->f = fopen(w->tmp, "wb");
    if (!w->f)
        MT_FAIL(MT_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
    return MT_OK;
}

static void w_flush(writer_t *w)
{
    if (w->used)
        fwrite(w->buf, 1, w->used, w->f); /* errors surface in w_close */
    w->used = 0;
}

static void w_bytes(writer_t *w, const void *p, size_t n)
{
    if (w->used + n > sizeof w->buf)
        w_flush(w);
    memcpy(w->buf + w->used, p, n);
    w->used += n;
}

static void w_le(writer_t *w, uint64_t v, int nbytes)
{
    unsigned char b[8];
    for (int i = 0; i < nbytes; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    w_bytes(w, b, (size_t)nbytes);
}

/* Close and rename into place; on any earlier write error remove the
 * temporary file. */
static mt_status_t w_close(writer_t *w)
{
    w_flush(w);
    int bad = ferror(w->f);
    int e = errno;
    if (fclose(w->f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    w->f = NULL;
    if (bad) {
        remove(w->tmp);
        MT_FAIL(MT_ERR_IO, "%s: write failed: %s", w->tmp, strerror(e));
    }
    if (rename(w->tmp, w->path) != 0) {
        e = errno;
        remove(w->tmp);
        MT_FAIL(MT_ERR_IO, "%s: cannot rename %s into place: %s", w->path, w->tmp, strerror(e));
    }
    return MT_OK;
}

static mt_status_t check_uint16(const char *path, const int32_t *tokens, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] > UINT16_MAX)
            MT_FAIL(MT_ERR_RANGE, "%s: token %d at position %lld does not fit in uint16", path,
                    (int)tokens[i], (long long)i);
    return MT_OK;
}

static mt_status_t write_file(const char *path, const void *hdr, size_t hdr_len,
                              const int32_t *tokens, int64_t n)
{
    writer_t *w = malloc(sizeof *w);
    if (!w)
        MT_FAIL(MT_ERR_NOMEM, "%s: no memory for a write buffer", path);
    mt_status_t s = w_open(w, path);
    if (s == MT_OK) {
        if (hdr_len)
            w_bytes(w, hdr, hdr_len);
        for (int64_t i = 0; i < n; i++)
            w_le(w, (uint64_t)tokens[i], 2);
        s = w_close(w);
    }
    free(w);
    if (s != MT_OK)
        mt_error_trace(__FILE__, __LINE__);
    return s;
}

mt_status_t mt_write_llmc(const char *path, const int32_t *tokens, int64_t n)
{
    if (n < 0 || n > INT32_MAX)
        MT_FAIL(MT_ERR_RANGE, "%s: %lld tokens do not fit an llm.c header (at most %d)", path,
                (long long)n, INT32_MAX);
    MT_TRY(check_uint16(path, tokens, n));
    unsigned char hdr[256 * 4] = {0};
    const uint32_t fields[3] = {20240520u, 1u, (uint32_t)n}; /* magic, version, count */
    for (int f = 0; f < 3; f++)
        for (int b = 0; b < 4; b++)
            hdr[4 * f + b] = (unsigned char)(fields[f] >> (8 * b));
    MT_TRY(write_file(path, hdr, sizeof hdr, tokens, n));
    return MT_OK;
}

mt_status_t mt_write_megatron(const char *prefix, const int32_t *tokens, int64_t n,
                              const int64_t *doc_start, int64_t n_docs)
{
    char idx[MT_PATH_MAX + 8], bin[MT_PATH_MAX + 8];
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    if (n_docs < 0 || doc_start[0] != 0 || doc_start[n_docs] != n)
        MT_FAIL(MT_ERR_RANGE, "%s: document starts must run from 0 to the token count %lld",
                idx, (long long)n);
    for (int64_t k = 0; k < n_docs; k++)
        if (doc_start[k + 1] < doc_start[k] || doc_start[k + 1] - doc_start[k] > INT32_MAX)
            MT_FAIL(MT_ERR_RANGE, "%s: document %lld spans [%lld, %lld): not an int32 sequence "
                    "size", idx, (long long)k, (long long)doc_start[k],
                    (long long)doc_start[k + 1]);
    MT_TRY(check_uint16(bin, tokens, n));
    MT_TRY(write_file(bin, NULL, 0, tokens, n));

    writer_t *w = malloc(sizeof *w);
    if (!w)
        MT_FAIL(MT_ERR_NOMEM, "%s: no memory for a write buffer", idx);
    mt_status_t s = w_open(w, idx);
    if (s == MT_OK) {
        w_bytes(w, "MMIDIDX\0\0", 9);
        w_le(w, 1, 8);                     /* version */
        w_le(w, 8, 1);                     /* dtype code: uint16 */
        w_le(w, (uint64_t)n_docs, 8);      /* sequences: one per document */
        w_le(w, (uint64_t)n_docs + 1, 8);  /* document index entries */
        for (int64_t k = 0; k < n_docs; k++)
            w_le(w, (uint64_t)(doc_start[k + 1] - doc_start[k]), 4);
        for (int64_t k = 0; k < n_docs; k++)
            w_le(w, (uint64_t)doc_start[k] * 2, 8);
        for (int64_t k = 0; k <= n_docs; k++)
            w_le(w, (uint64_t)k, 8);
        s = w_close(w);
    }
    free(w);
    MT_TRY(s);
    return MT_OK;
}

/* ------------------------------------------------------------------ inspect */

static void put_token(FILE *out, int32_t t)
{
    if (t == MT_TOKEN_EOD)
        fputs("<|eod|>", out);
    else if (t == MT_TOKEN_PAD)
        fputs("<|pad|>", out);
    else if (t > 255)
        fprintf(out, "<|%d|>", (int)t);
    else if (t == '\n')
        fputs("\\n", out);
    else if (t == '\t')
        fputs("\\t", out);
    else if (t == '\\' || t == '"')
        fprintf(out, "\\%c", t);
    else if (t < 0x20 || t == 0x7f)
        fprintf(out, "\\x%02x", (unsigned)t);
    else
        fputc(t, out); /* UTF-8 bytes pass through and recombine */
}

int mt_data_inspect(const char *path, int64_t vocab, FILE *out, FILE *err)
{
    mt_dataset_t ds;
    mt_status_t s = mt_dataset_open(&ds, path, MT_DATA_AUTO, vocab);
    if (s != MT_OK) {
        fprintf(err, "meshtrain-data: %s\n", mt_error_message());
        if (mt_error_hint_text()[0])
            fprintf(err, "hint: %s\n", mt_error_hint_text());
        return 1;
    }
    int32_t lo = INT32_MAX, hi = INT32_MIN, buf[4096];
    for (int64_t i = 0; i < ds.n_tokens; i += 4096) {
        int64_t k = ds.n_tokens - i < 4096 ? ds.n_tokens - i : 4096;
        mt_dataset_read(&ds, i, k, buf);
        for (int64_t j = 0; j < k; j++) {
            lo = buf[j] < lo ? buf[j] : lo;
            hi = buf[j] > hi ? buf[j] : hi;
        }
    }
    fprintf(out, "path:       %s\n", path);
    if (ds.format == MT_DATA_LLMC)
        fprintf(out, "format:     llm.c token file (version 1, uint16 tokens)\n");
    else
        fprintf(out, "format:     Megatron-LM indexed dataset (%s tokens)\n",
                ds.token_bytes == 2 ? "uint16" : "int32");
    fprintf(out, "tokens:     %lld\n", (long long)ds.n_tokens);
    fprintf(out, "documents:  %lld\n", (long long)ds.n_docs);
    if (ds.n_tokens) {
        fprintf(out, "min token:  %d\nmax token:  %d\n", (int)lo, (int)hi);
        if (hi >= MT_TOKENIZER_VOCAB)
            fprintf(out, "note:       ids above %d are not from the byte tokenizer; they show "
                    "as <|id|>\n", MT_TOKENIZER_VOCAB - 1);
    } else {
        fprintf(out, "min token:  -\nmax token:  -\n");
    }
    int64_t k = ds.n_tokens < 64 ? ds.n_tokens : 64;
    mt_dataset_read(&ds, 0, k, buf);
    fprintf(out, "first %lld tokens: \"", (long long)k);
    for (int64_t j = 0; j < k; j++)
        put_token(out, buf[j]);
    fprintf(out, "\"\n");
    mt_dataset_close(&ds);
    return 0;
}
