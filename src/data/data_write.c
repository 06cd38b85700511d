/* data_write.c: the byte-level tokenizer, the token-file writers and the
 * meshtrain-data tool (make token files from text, inspect token files).
 *
 * Files are written to PATH.tmp and renamed into place, so a failed or
 * interrupted run never leaves a partial file under the final name (make
 * would take it as up to date).  Fields are written as little-endian bytes
 * whatever the host.  Not here: reading and validation (data.c), and any
 * tokenizer other than bytes -- tokens from a BPE tokenizer come from other
 * tools in either format. */
#include <config.h>

#include "mt_data.h"

#include <errno.h>
#include <math.h>
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

/* ------------------------------------------------------------------ the tool */

typedef enum { DOCS_PARAGRAPHS, DOCS_LINES, DOCS_FILE } doc_mode_t;

/* Growing token and document-start arrays. */
typedef struct {
    int32_t *tok;
    int64_t n, cap;
    int64_t *start;
    int64_t n_docs, cap_docs;
} corpus_t;

static int grow(void **p, int64_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    int64_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* One document: its bytes, then EOD.  Empty documents are dropped. */
static int add_doc(corpus_t *c, const unsigned char *p, size_t len)
{
    if (len == 0)
        return 1;
    if (!grow((void **)&c->tok, &c->cap, c->n + (int64_t)len + 1, sizeof *c->tok) ||
        !grow((void **)&c->start, &c->cap_docs, c->n_docs + 2, sizeof *c->start))
        return 0;
    if (c->n_docs == 0)
        c->start[0] = 0;
    c->n += mt_tokenize_bytes(p, (int64_t)len, c->tok + c->n);
    c->tok[c->n++] = MT_TOKEN_EOD;
    c->start[++c->n_docs] = c->n;
    return 1;
}

static int is_blank(const unsigned char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r' && p[i] != '\f' && p[i] != '\v')
            return 0;
    return 1;
}

/* Split text into documents.  lines: each non-blank line, without its
 * line break.  paragraphs: each run of non-blank lines, inner line breaks
 * kept, the last one dropped.  file: the bytes as they are. */
static int add_text(corpus_t *c, const unsigned char *t, size_t len, doc_mode_t mode)
{
    if (mode == DOCS_FILE)
        return add_doc(c, t, len);
    size_t par = 0, par_end = 0; /* current paragraph [par, par_end) */
    int in_par = 0;
    for (size_t pos = 0; pos < len;) {
        const unsigned char *nl = memchr(t + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - t) : len; /* line [pos, end) */
        size_t trim = end;
        if (trim > pos && t[trim - 1] == '\r')
            trim--;
        int blank = is_blank(t + pos, end - pos);
        if (mode == DOCS_LINES) {
            if (!blank && !add_doc(c, t + pos, trim - pos))
                return 0;
        } else if (blank) {
            if (in_par && !add_doc(c, t + par, par_end - par))
                return 0;
            in_par = 0;
        } else {
            if (!in_par)
                par = pos;
            in_par = 1;
            par_end = trim;
        }
        pos = end + 1;
    }
    return !in_par || add_doc(c, t + par, par_end - par);
}

static unsigned char *read_all(const char *path, size_t *len, FILE *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(err, "meshtrain-data: %s: cannot open: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0, got;
    unsigned char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            unsigned char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                buf = NULL;
            }
            buf = b;
        }
    }
    int bad = !buf || ferror(f);
    if (bad)
        fprintf(err, "meshtrain-data: %s: %s\n", path, buf ? "read error" : "out of memory");
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* PATH with ".val" before its extension: out.bin -> out.val.bin,
 * dir.d/out -> dir.d/out.val. */
static void val_path(const char *path, char *out, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    if (!dot || dot == base)
        snprintf(out, cap, "%s.val", path);
    else
        snprintf(out, cap, "%.*s.val%s", (int)(dot - path), path, dot);
}

static int write_part(const char *path, int megatron, const corpus_t *c, int64_t d0, int64_t d1,
                      FILE *out, FILE *err)
{
    int64_t t0 = c->start[d0], n = c->start[d1] - t0, nd = d1 - d0;
    int64_t *starts = malloc(sizeof *starts * (size_t)(nd + 1));
    if (!starts) {
        fprintf(err, "meshtrain-data: out of memory\n");
        return 1;
    }
    for (int64_t k = 0; k <= nd; k++)
        starts[k] = c->start[d0 + k] - t0;
    mt_status_t s = megatron ? mt_write_megatron(path, c->tok + t0, n, starts, nd)
                             : mt_write_llmc(path, c->tok + t0, n);
    free(starts);
    if (s != MT_OK) {
        fprintf(err, "meshtrain-data: %s\n", mt_error_message());
        return 1;
    }
    if (megatron)
        fprintf(out, "wrote %s.bin + %s.idx: Megatron-LM indexed dataset, ", path, path);
    else
        fprintf(out, "wrote %s: llm.c token file, ", path);
    fprintf(out, "%lld tokens in %lld documents\n", (long long)n, (long long)nd);
    return 0;
}

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

static int inspect(const char *path, int64_t vocab, FILE *out, FILE *err)
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

static void usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain-data --output PATH [--format llmc|megatron]\n"
            "                      [--documents paragraphs|lines|file]\n"
            "                      [--split-validation FRACTION] INPUT.txt...\n"
            "       meshtrain-data --inspect PATH [--vocab-size N]\n"
            "Tokenizes text with the byte-level tokenizer (ids 0..255 are bytes, %d ends each\n"
            "document) into an llm.c token file PATH or a Megatron-LM dataset PATH.bin +\n"
            "PATH.idx. Documents are paragraphs (split at blank lines, the default), lines,\n"
            "or whole files. --split-validation writes the last FRACTION of the documents to\n"
            "PATH with .val before its extension (out.bin -> out.val.bin). --inspect prints\n"
            "a token file's format, counts, token range and first 64 tokens, checking every\n"
            "token against N if given. Exit status: 0 ok, 1 error, 2 usage. See doc/data.md.\n",
            MT_TOKEN_EOD);
}

static int usage_error(FILE *err, const char *what, const char *arg)
{
    fprintf(err, "meshtrain-data: %s%s%s%s\n", what, arg ? " '" : "", arg ? arg : "",
            arg ? "'" : "");
    usage(err);
    return 2;
}

int mt_data_main(int argc, char **argv, FILE *out, FILE *err)
{
    const char *output = NULL, *inspect_path = NULL;
    int megatron = 0, ninputs = 0;
    doc_mode_t mode = DOCS_PARAGRAPHS;
    double val_fraction = 0;
    long long vocab = INT64_MAX;
    char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs)
        return 1;
    int code = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(out);
            code = 0;
            goto done;
        } else if (!strcmp(a, "--version")) {
            fprintf(out, "meshtrain-data (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
            code = 0;
            goto done;
        } else if (!strcmp(a, "--output") && v) {
            output = argv[++i];
        } else if (!strcmp(a, "--inspect") && v) {
            inspect_path = argv[++i];
        } else if (!strcmp(a, "--format") && v) {
            if (strcmp(v, "llmc") && strcmp(v, "megatron")) {
                code = usage_error(err, "--format must be llmc or megatron, got", v);
                goto done;
            }
            megatron = !strcmp(argv[++i], "megatron");
        } else if (!strcmp(a, "--documents") && v) {
            if (!strcmp(v, "paragraphs"))
                mode = DOCS_PARAGRAPHS;
            else if (!strcmp(v, "lines"))
                mode = DOCS_LINES;
            else if (!strcmp(v, "file"))
                mode = DOCS_FILE;
            else {
                code = usage_error(err, "--documents must be paragraphs, lines or file, got", v);
                goto done;
            }
            i++;
        } else if (!strcmp(a, "--split-validation") && v) {
            errno = 0;
            val_fraction = strtod(argv[++i], &end);
            if (errno || end == v || *end || !(val_fraction > 0 && val_fraction < 1)) {
                code = usage_error(err, "--split-validation needs a fraction in (0, 1), got", v);
                goto done;
            }
        } else if (!strcmp(a, "--vocab-size") && v) {
            errno = 0;
            vocab = strtoll(argv[++i], &end, 10);
            if (errno || end == v || *end || vocab < 1) {
                code = usage_error(err, "--vocab-size needs a positive integer, got", v);
                goto done;
            }
        } else if (a[0] == '-' && a[1]) {
            static const char *valued[] = {"--output", "--inspect", "--format", "--documents",
                                           "--split-validation", "--vocab-size"};
            const char *what = "unknown option";
            for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
                if (!strcmp(a, valued[k]))
                    what = "missing value after";
            code = usage_error(err, what, a);
            goto done;
        } else {
            inputs[ninputs++] = argv[i];
        }
    }
    if (inspect_path) {
        if (output || ninputs) {
            code = usage_error(err, "--inspect takes one token file and no --output or inputs",
                               NULL);
            goto done;
        }
        code = inspect(inspect_path, vocab, out, err);
        goto done;
    }
    if (!output || !ninputs) {
        code = usage_error(err, !output ? "--output PATH is required" : "no input files", NULL);
        goto done;
    }

    code = 1;
    corpus_t c = {0};
    for (int k = 0; k < ninputs; k++) {
        size_t len = 0;
        unsigned char *text = read_all(inputs[k], &len, err);
        if (!text)
            goto free_corpus;
        int ok = add_text(&c, text, len, mode);
        free(text);
        if (!ok) {
            fprintf(err, "meshtrain-data: out of memory after %lld tokens\n", (long long)c.n);
            goto free_corpus;
        }
    }
    if (c.n_docs == 0) {
        fprintf(err, "meshtrain-data: no documents: the input is empty or blank\n");
        goto free_corpus;
    }
    /* Megatron output takes a prefix; accept PREFIX.bin or PREFIX.idx too. */
    char target[MT_PATH_MAX], val[MT_PATH_MAX + 8];
    size_t olen = strlen(output);
    if (olen >= MT_PATH_MAX - 16) {
        fprintf(err, "meshtrain-data: %s: path too long\n", output);
        goto free_corpus;
    }
    if (megatron && olen > 4 &&
        (!strcmp(output + olen - 4, ".bin") || !strcmp(output + olen - 4, ".idx")))
        olen -= 4;
    snprintf(target, sizeof target, "%.*s", (int)olen, output);

    int64_t n_train = c.n_docs;
    if (val_fraction > 0) {
        if (c.n_docs < 2) {
            fprintf(err, "meshtrain-data: --split-validation needs at least 2 documents, the "
                    "input has %lld\n", (long long)c.n_docs);
            goto free_corpus;
        }
        int64_t n_val = llround(val_fraction * (double)c.n_docs);
        n_val = n_val < 1 ? 1 : n_val > c.n_docs - 1 ? c.n_docs - 1 : n_val;
        n_train = c.n_docs - n_val;
        if (megatron)
            snprintf(val, sizeof val, "%s.val", target);
        else
            val_path(target, val, sizeof val);
    }
    if (write_part(target, megatron, &c, 0, n_train, out, err) == 0 &&
        (n_train == c.n_docs || write_part(val, megatron, &c, n_train, c.n_docs, out, err) == 0))
        code = 0;
free_corpus:
    free(c.tok);
    free(c.start);
done:
    free(inputs);
    return code;
}
