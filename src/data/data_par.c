/* data_par.c: meshtrain-data's pipeline: records in, token datasets out,
 * in parallel over a communicator (mt_data_write.h).
 *
 * Every rank scans all inputs (cheap: line splitting) and tokenizes the
 * records it owns, chunk by chunk (record g: rank (g / MT_DW_CHUNK) % size).
 * An exclusive scan and a sum of the per-chunk token counts give each
 * rank where its documents go; it writes them with pwrite into the
 * shared .tmp files (tokens, the .idx arrays, the loss mask), rank 0 the
 * headers.  After agreeing that every rank succeeded, rank 0 renames the
 * files into place; after a failure it removes them.  A record's error
 * wins over later records' whichever rank found it, so the message does
 * not depend on the rank count.
 *
 * Not here: input decoding (data_input.c), SFT rendering (data_sft.c). */
#include <config.h>

#include "data_write_internal.h"

#include "mt_comm.h"
#include "mt_config.h" /* MT_PATH_MAX */

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_OUT (2 * MT_DW_MAX_KEYS) /* train and validation per key */

typedef struct { /* one key's documents on this rank, in record order */
    mt_ids_t tok;
    mt_text_t mask; /* SFT */
    int32_t *len;
    int64_t n, cap;
} stream_t;

typedef struct {
    MPI_Comm comm;
    int rank, size;
    const mt_tokenizer_t *tok;
    const mt_dw_opts_t *o;
    int n_streams, token_bytes;
    stream_t st[MT_DW_MAX_KEYS];
    int64_t n_records, bytes_in;
    int64_t err_g; /* the first bad record this rank owns, or INT64_MAX */
    mt_ids_t ids;
    mt_text_t mask, fixed;
    double t0, last_print;
    FILE *err;
} build_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int mt_dw_token_bytes(int64_t vocab_size)
{
    return vocab_size < MT_DW_UINT16_VOCAB_LIMIT ? 2 : 4;
}

static int owned(const build_t *b, int64_t g)
{
    return (int)((g / MT_DW_CHUNK) % b->size) == b->rank;
}

static void progress(build_t *b, int force)
{
    if (!b->o->progress || b->rank != 0)
        return;
    double t = now();
    if (!force && t - b->last_print < 1.0)
        return;
    b->last_print = t;
    double mb = (double)b->bytes_in / 1e6, dt = t - b->t0;
    fprintf(b->err, "meshtrain-data: %lld records, %.1f MB, %.1f MB/s\n",
            (long long)b->n_records, mb, dt > 0 ? mb / dt : 0.0);
}

/* Move the ids (and mask) of one finished document into stream k. */
static mt_status_t keep(build_t *b, int k, const char *where)
{
    stream_t *s = &b->st[k];
    if (b->ids.n == 0)
        MT_FAIL(MT_ERR_CONFIG, "%s: empty document: it has no tokens", where);
    if (b->o->seq_length > 0 && (int64_t)b->ids.n > b->o->seq_length)
        MT_FAIL(MT_ERR_CONFIG, "%s: the document has %zu tokens, more than --seq-length %lld",
                where, b->ids.n, (long long)b->o->seq_length);
    if (b->ids.n > INT32_MAX)
        MT_FAIL(MT_ERR_RANGE, "%s: %zu tokens do not fit a Megatron sequence size", where,
                b->ids.n);
    if (s->n == s->cap) {
        int64_t c = s->cap ? 2 * s->cap : 1024;
        int32_t *l = realloc(s->len, sizeof *l * (size_t)c);
        if (!l)
            MT_FAIL(MT_ERR_NOMEM, "%s: out of memory for document lengths", where);
        s->len = l;
        s->cap = c;
    }
    s->len[s->n++] = (int32_t)b->ids.n;
    if (s->tok.n + b->ids.n > s->tok.cap) {
        size_t c = s->tok.cap ? s->tok.cap : 4096;
        while (c < s->tok.n + b->ids.n)
            c *= 2;
        int32_t *v = realloc(s->tok.v, sizeof *v * c);
        if (!v)
            MT_FAIL(MT_ERR_NOMEM, "%s: out of memory for %zu tokens", where, c);
        s->tok.v = v;
        s->tok.cap = c;
    }
    memcpy(s->tok.v + s->tok.n, b->ids.v, sizeof *b->ids.v * b->ids.n);
    s->tok.n += b->ids.n;
    if (b->o->kind == MT_DW_SFT)
        MT_TRY(mt_text_append(&s->mask, b->mask.s, b->mask.n));
    return MT_OK;
}

/* Check (or repair) the UTF-8 of text; *out points at what to use. */
static mt_status_t utf8(build_t *b, const char *where, const char *text, size_t n,
                        const char **out, size_t *nout)
{
    *out = text;
    *nout = n;
    int64_t bad = mt_utf8_invalid_at(text, n);
    if (bad < 0)
        return MT_OK;
    if (!b->o->utf8_replace)
        MT_FAIL(MT_ERR_CONFIG, "%s: invalid UTF-8 at byte %lld of the %s (byte 0x%02x); pass "
                "--invalid-utf8 replace to substitute U+FFFD", where, (long long)bad,
                b->o->kind == MT_DW_TEXT ? "document" : "line",
                (unsigned)(unsigned char)text[bad]);
    b->fixed.n = 0;
    MT_TRY(mt_utf8_replace(text, n, &b->fixed));
    *out = b->fixed.s;
    *nout = b->fixed.n;
    return MT_OK;
}

static mt_status_t encode_doc(build_t *b, const char *text, size_t n)
{
    MT_TRY(mt_tokenizer_encode(b->tok, text, n, true, &b->ids));
    if (b->ids.n > 0) /* Megatron's --append-eod */
        MT_TRY(mt_ids_push(&b->ids, mt_tokenizer_eos_id(b->tok)));
    return MT_OK;
}

static mt_status_t json_record(build_t *b, const char *where, const char *line, size_t n)
{
    json_error_t je;
    json_t *rec = json_loadb(line, n, 0, &je);
    if (!rec)
        MT_FAIL(MT_ERR_CONFIG, "%s: not a JSON record: %s (column %d)", where, je.text,
                je.column);
    mt_status_t s = MT_OK;
    if (b->o->kind == MT_DW_SFT) {
        b->ids.n = b->mask.n = 0;
        s = mt_sft_record(b->tok, b->o, rec, where, &b->ids, &b->mask);
        if (s == MT_OK)
            s = keep(b, 0, where);
    } else if (!json_is_object(rec)) {
        s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s: the record is not a JSON "
                         "object", where);
    }
    for (int k = 0; s == MT_OK && b->o->kind == MT_DW_JSONL && k < b->o->n_keys; k++) {
        const char *key = b->o->keys[k];
        json_t *v = json_object_get(rec, key);
        if (!v)
            s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s: the record has no key "
                             "\"%s\"", where, key);
        else if (!json_is_string(v))
            s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s: \"%s\" is not a string",
                             where, key);
        else if (json_string_length(v) == 0)
            s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s: empty document: \"%s\" "
                             "is an empty string", where, key);
        else {
            b->ids.n = 0;
            s = encode_doc(b, json_string_value(v), json_string_length(v));
            if (s == MT_OK)
                s = keep(b, k, where);
        }
    }
    json_decref(rec);
    MT_TRY(s);
    return MT_OK;
}

/* One record: counted by everyone, tokenized by its owner. */
static mt_status_t record(build_t *b, const char *file, int64_t line, const char *text,
                          size_t n)
{
    int64_t g = b->n_records++;
    b->bytes_in += (int64_t)n + 1;
    if ((g & 255) == 0)
        progress(b, 0);
    if (!owned(b, g))
        return MT_OK;
    char where[MT_PATH_MAX + 64];
    snprintf(where, sizeof where, "%s:%lld (record %lld)", file, (long long)line,
             (long long)g + 1);
    const char *t;
    size_t tn;
    mt_status_t s = utf8(b, where, text, n, &t, &tn);
    if (s == MT_OK && b->o->kind == MT_DW_TEXT) {
        b->ids.n = 0;
        s = encode_doc(b, t, tn);
        if (s == MT_OK)
            s = keep(b, 0, where);
    } else if (s == MT_OK) {
        s = json_record(b, where, t, tn);
    }
    if (s != MT_OK)
        b->err_g = g;
    return s;
}

static int is_blank(const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r' && p[i] != '\f' && p[i] != '\v')
            return 0;
    return 1;
}

/* Text documents: lines: each non-blank line without its line break;
 * paragraphs: each run of non-blank lines, inner line breaks kept, the
 * last dropped; file: the bytes as they are. */
static mt_status_t text_file(build_t *b, const char *path)
{
    char *t;
    size_t len;
    MT_TRY(mt_dw_read_all(path, &t, &len));
    mt_status_t s = MT_OK;
    if (b->o->docs == MT_DW_FILE) {
        s = len == 0 ? mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s: empty document: "
                                    "the file is empty", path)
                     : record(b, path, 1, t, len);
        free(t);
        MT_TRY(s);
        return MT_OK;
    }
    size_t par = 0, par_end = 0;
    int64_t lineno = 0, par_line = 0;
    int in_par = 0;
    for (size_t pos = 0; s == MT_OK && pos < len;) {
        const char *nl = memchr(t + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - t) : len, trim = end;
        lineno++;
        if (trim > pos && t[trim - 1] == '\r')
            trim--;
        int blank = is_blank(t + pos, end - pos);
        if (b->o->docs == MT_DW_LINES) {
            if (!blank)
                s = record(b, path, lineno, t + pos, trim - pos);
        } else if (blank) {
            if (in_par)
                s = record(b, path, par_line, t + par, par_end - par);
            in_par = 0;
        } else {
            if (!in_par) {
                par = pos;
                par_line = lineno;
            }
            in_par = 1;
            par_end = trim;
        }
        pos = end + 1;
    }
    if (s == MT_OK && in_par)
        s = record(b, path, par_line, t + par, par_end - par);
    free(t);
    MT_TRY(s);
    return MT_OK;
}

static mt_status_t jsonl_file(build_t *b, const char *path)
{
    mt_dw_reader_t *r;
    MT_TRY(mt_dw_reader_open(path, &r));
    mt_status_t s;
    for (;;) {
        const char *line;
        size_t n;
        int64_t lineno;
        int got;
        s = mt_dw_reader_line(r, &line, &n, &lineno, &got);
        if (s != MT_OK || !got)
            break;
        if (is_blank(line, n)) /* a blank line (one at the end, say) holds no record */
            continue;
        if ((s = record(b, path, lineno, line, n)) != MT_OK)
            break;
    }
    mt_dw_reader_close(r);
    MT_TRY(s);
    return MT_OK;
}

/* ------------------------------------------------------------------ writing */

typedef struct {
    char path[MT_PATH_MAX + 32], tmp[MT_PATH_MAX + 40];
    int fd;
} file_t;

typedef struct {  /* one dataset: a key's train or validation part */
    int stream;
    int64_t d0, d1;    /* its documents (records) */
    int64_t t0, n_tok; /* token offset of d0 in the key's tokens; count */
    file_t f[3];       /* bin (or the llm.c file), idx, lossmask */
    int nf;
    char prefix[MT_PATH_MAX + 32];
} part_t;

static mt_status_t pw(const file_t *f, const void *buf, size_t n, int64_t off)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(f->fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            MT_FAIL(MT_ERR_IO, "%s: write failed at offset %lld: %s", f->tmp, (long long)off,
                    w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return MT_OK;
}

static void le(unsigned char *p, uint64_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Rank 0's headers (and the .idx's last document-index entry). */
static mt_status_t headers(const build_t *b, const part_t *p)
{
    unsigned char h[1024] = {0};
    int64_t nd = p->d1 - p->d0;
    if (!b->o->megatron) { /* llm.c: magic, version, token count */
        le(h, 20240520u, 4);
        le(h + 4, 1, 4);
        le(h + 8, (uint64_t)p->n_tok, 4);
        MT_TRY(pw(&p->f[0], h, 1024, 0));
        return MT_OK;
    }
    memcpy(h, "MMIDIDX\0\0", 9);
    le(h + 9, 1, 8);
    h[17] = b->token_bytes == 2 ? 8 : 4; /* Megatron dtype codes: uint16, int32 */
    le(h + 18, (uint64_t)nd, 8);
    le(h + 26, (uint64_t)nd + 1, 8);
    MT_TRY(pw(&p->f[1], h, 34, 0));
    le(h, (uint64_t)nd, 8);
    MT_TRY(pw(&p->f[1], h, 8, 34 + 12 * nd + 8 * nd));
    if (p->nf == 3) {
        memcpy(h, "MTLMASK1", 8);
        le(h + 8, (uint64_t)p->n_tok, 8);
        MT_TRY(pw(&p->f[2], h, 16, 0));
    }
    return MT_OK;
}

/* This rank's documents [g0, g1) of part p, whose tokens start at tok (the
 * key's token offset off) and whose lengths are len. */
static mt_status_t write_docs(const build_t *b, const part_t *p, int64_t g0, int64_t g1,
                              const int32_t *tok, const int32_t *len, const char *mask,
                              int64_t off)
{
    int64_t nd = p->d1 - p->d0, n = 0, tb = b->o->megatron ? b->token_bytes : 2;
    for (int64_t g = g0; g < g1; g++)
        n += len[g - g0];
    unsigned char *buf = malloc((size_t)(n * tb > 20 * (g1 - g0) ? n * tb : 20 * (g1 - g0)));
    if (!buf)
        MT_FAIL(MT_ERR_NOMEM, "%s: out of memory for a write buffer", p->f[0].tmp);
    for (int64_t i = 0; i < n; i++)
        le(buf + i * tb, (uint64_t)(uint32_t)tok[i], (int)tb);
    int64_t rel = off - p->t0; /* token offset in this part */
    mt_status_t s = pw(&p->f[0], buf, (size_t)(n * tb), (b->o->megatron ? 0 : 1024) + rel * tb);
    if (s == MT_OK && b->o->megatron) {
        int64_t k = g1 - g0, d = g0 - p->d0, at = rel;
        for (int64_t i = 0; i < k; i++)
            le(buf + 4 * i, (uint64_t)len[i], 4);
        s = pw(&p->f[1], buf, (size_t)(4 * k), 34 + 4 * d);
        for (int64_t i = 0; s == MT_OK && i < k; at += len[i], i++)
            le(buf + 8 * i, (uint64_t)(at * tb), 8);
        if (s == MT_OK)
            s = pw(&p->f[1], buf, (size_t)(8 * k), 34 + 4 * nd + 8 * d);
        for (int64_t i = 0; s == MT_OK && i < k; i++)
            le(buf + 8 * i, (uint64_t)(d + i), 8);
        if (s == MT_OK)
            s = pw(&p->f[1], buf, (size_t)(8 * k), 34 + 12 * nd + 8 * d);
    }
    if (s == MT_OK && p->nf == 3)
        s = pw(&p->f[2], mask, (size_t)n, 16 + rel);
    free(buf);
    MT_TRY(s);
    return MT_OK;
}

static void part_files(const build_t *b, part_t *p, const char *prefix)
{
    snprintf(p->prefix, sizeof p->prefix, "%s", prefix);
    if (!b->o->megatron) {
        p->nf = 1;
        snprintf(p->f[0].path, sizeof p->f[0].path, "%s", prefix);
    } else {
        p->nf = b->o->kind == MT_DW_SFT ? 3 : 2;
        snprintf(p->f[0].path, sizeof p->f[0].path, "%s.bin", prefix);
        snprintf(p->f[1].path, sizeof p->f[1].path, "%s.idx", prefix);
        snprintf(p->f[2].path, sizeof p->f[2].path, "%s.lossmask", prefix);
    }
    for (int i = 0; i < p->nf; i++) {
        snprintf(p->f[i].tmp, sizeof p->f[i].tmp, "%s.tmp", p->f[i].path);
        p->f[i].fd = -1;
    }
}

/* PATH with ".val" before its extension (llm.c: out.bin -> out.val.bin),
 * or appended (a Megatron prefix). */
static void val_name(const char *path, int megatron, char *out, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    if (megatron || !dot || dot == base)
        snprintf(out, cap, "%s.val", path);
    else
        snprintf(out, cap, "%.*s.val%s", (int)(dot - path), path, dot);
}

static void close_all(part_t *parts, int np)
{
    for (int i = 0; i < np; i++)
        for (int j = 0; j < parts[i].nf; j++)
            if (parts[i].f[j].fd >= 0) {
                close(parts[i].f[j].fd);
                parts[i].f[j].fd = -1;
            }
}

/* Open the .tmp files: rank 0 creates them, then everyone opens them. */
static mt_status_t open_all(const build_t *b, part_t *parts, int np, int create)
{
    for (int i = 0; i < np; i++)
        for (int j = 0; j < parts[i].nf; j++) {
            file_t *f = &parts[i].f[j];
            f->fd = open(f->tmp, O_WRONLY | (create ? O_CREAT | O_TRUNC : 0), 0644);
            if (f->fd < 0)
                MT_FAIL(MT_ERR_IO, "%s: cannot %s: %s", f->tmp, create ? "create" : "open",
                        strerror(errno));
        }
    (void)b;
    return MT_OK;
}

static mt_status_t write_all(build_t *b, part_t *parts, int np, const int64_t *chunk_off,
                             int64_t n_chunks)
{
    int K = b->n_streams;
    for (int k = 0; k < K; k++) {
        const stream_t *s = &b->st[k];
        int64_t di = 0, ti = 0; /* this rank's next document and token */
        for (int64_t q = 0, c = b->rank; c < n_chunks; q++, c += b->size) {
            int64_t c0 = c * MT_DW_CHUNK, c1 = c0 + MT_DW_CHUNK;
            c1 = c1 < b->n_records ? c1 : b->n_records;
            int64_t off = chunk_off[q * K + k];
            for (int i = 0; i < np; i++) { /* the parts this chunk overlaps */
                const part_t *p = &parts[i];
                if (p->stream != k || p->d1 <= c0 || p->d0 >= c1)
                    continue;
                int64_t g0 = c0 > p->d0 ? c0 : p->d0, g1 = c1 < p->d1 ? c1 : p->d1;
                int64_t skip = 0; /* tokens of the chunk's documents before g0 */
                for (int64_t g = c0; g < g0; g++)
                    skip += s->len[di + g - c0];
                MT_TRY(write_docs(b, p, g0, g1, s->tok.v + ti + skip, s->len + di + g0 - c0,
                                  s->mask.s ? s->mask.s + ti + skip : NULL, off + skip));
            }
            for (int64_t g = c0; g < c1; g++)
                ti += s->len[di++];
        }
    }
    return MT_OK;
}

static mt_status_t finish(build_t *b, FILE *out)
{
    const mt_dw_opts_t *o = b->o;
    int K = b->n_streams;
    int64_t N = b->n_records, n_chunks = (N + MT_DW_CHUNK - 1) / MT_DW_CHUNK;
    if (N == 0)
        MT_FAIL(MT_ERR_CONFIG, "no documents: the input is empty or blank");
    int64_t n_train = N;
    if (o->val_fraction > 0) {
        if (N < 2)
            MT_FAIL(MT_ERR_CONFIG, "--split-validation needs at least 2 documents, the input "
                    "has %lld", (long long)N);
        int64_t n_val = llround(o->val_fraction * (double)N);
        n_val = n_val < 1 ? 1 : n_val > N - 1 ? N - 1 : n_val;
        n_train = N - n_val;
    }
    /* Offsets by an exscan: in round q every rank owns chunk q * size +
     * rank, so the chunk starts after the rounds before q (their totals,
     * summed over the ranks) and after the lower ranks' chunks of round q
     * (an exclusive scan).  Each rank holds rounds x keys counts. */
    int64_t R = (n_chunks + b->size - 1) / b->size, RK = R * K;
    int64_t *mine = calloc((size_t)(4 * RK + 2 * K + 1), sizeof *mine);
    if (!mine)
        MT_FAIL(MT_ERR_NOMEM, "out of memory for %lld chunk counts", (long long)R);
    int64_t *lower = mine + RK, *rtot = lower + RK, *chunk_off = rtot + RK;
    int64_t *train_tok = chunk_off + RK; /* [K]: tokens before n_train, then [K] totals */
    int64_t *tot = train_tok + K;
    for (int k = 0; k < K; k++) {
        int64_t di = 0;
        for (int64_t q = 0; q < R; q++)
            for (int64_t g = (q * b->size + b->rank) * MT_DW_CHUNK, e = g + MT_DW_CHUNK;
                 g < e && g < N; g++, di++) {
                mine[q * K + k] += b->st[k].len[di];
                if (g < n_train)
                    train_tok[k] += b->st[k].len[di];
            }
    }
    int rc = MPI_Exscan(mine, lower, (int)RK, MPI_INT64_T, MPI_SUM, b->comm);
    if (b->rank == 0) /* MPI_Exscan leaves rank 0's result undefined */
        memset(lower, 0, sizeof *lower * (size_t)RK);
    mt_status_t s = rc == MPI_SUCCESS ? MT_OK : mt_error_mpi(rc, "MPI_Exscan", __FILE__, __LINE__);
    if (s == MT_OK)
        s = mt_allreduce(mine, rtot, (int)RK, MPI_INT64_T, MPI_SUM, b->comm);
    if (s == MT_OK)
        s = mt_allreduce(MPI_IN_PLACE, train_tok, K, MPI_INT64_T, MPI_SUM, b->comm);
    if (s != MT_OK) {
        free(mine);
        MT_TRY(s);
    }
    for (int64_t q = 0; q < R; q++)
        for (int k = 0; k < K; k++) {
            chunk_off[q * K + k] = tot[k] + lower[q * K + k];
            tot[k] += rtot[q * K + k];
        }

    part_t parts[MAX_OUT];
    int np = 0;
    for (int k = 0; k < K; k++) {
        char prefix[MT_PATH_MAX + 32], val[MT_PATH_MAX + 40];
        if (o->kind == MT_DW_JSONL) /* Megatron's preprocess_data.py naming */
            snprintf(prefix, sizeof prefix, "%s_%s_document", o->output, o->keys[k]);
        else
            snprintf(prefix, sizeof prefix, "%s", o->output);
        part_t *p = &parts[np++];
        memset(p, 0, sizeof *p);
        p->stream = k;
        p->d1 = n_train;
        p->n_tok = train_tok[k];
        part_files(b, p, prefix);
        if (n_train < N) {
            val_name(prefix, o->megatron, val, sizeof val);
            p = &parts[np++];
            memset(p, 0, sizeof *p);
            p->stream = k;
            p->d0 = n_train;
            p->d1 = N;
            p->t0 = train_tok[k];
            p->n_tok = tot[k] - train_tok[k];
            part_files(b, p, val);
        }
    }
    for (int i = 0; i < np; i++)
        if (!o->megatron && parts[i].n_tok > INT32_MAX) {
            free(mine);
            MT_FAIL(MT_ERR_RANGE, "%s: %lld tokens do not fit an llm.c header (at most %d)",
                    parts[i].f[0].path, (long long)parts[i].n_tok, INT32_MAX);
        }

    s = b->rank == 0 ? open_all(b, parts, np, 1) : MT_OK;
    s = mt_agree(b->comm, s);
    if (s == MT_OK && b->rank != 0)
        s = open_all(b, parts, np, 0);
    if (s == MT_OK && b->rank == 0)
        for (int i = 0; s == MT_OK && i < np; i++)
            s = headers(b, &parts[i]);
    if (s == MT_OK)
        s = write_all(b, parts, np, chunk_off, n_chunks);
    for (int i = 0; s == MT_OK && i < np; i++)
        for (int j = 0; s == MT_OK && j < parts[i].nf; j++)
            if (close(parts[i].f[j].fd) != 0)
                s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: close failed: %s",
                                 parts[i].f[j].tmp, strerror(errno));
            else
                parts[i].f[j].fd = -1;
    close_all(parts, np);
    free(mine);
    s = mt_agree(b->comm, s);
    int renamed = 0; /* files moved into place, in order; undone if a later one fails */
    if (b->rank == 0) {
        for (int i = 0; i < np; i++)
            for (int j = 0; j < parts[i].nf; j++) {
                file_t *f = &parts[i].f[j];
                if (s != MT_OK)
                    remove(f->tmp);
                else if (rename(f->tmp, f->path) != 0)
                    s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: cannot rename %s into "
                                     "place: %s", f->path, f->tmp, strerror(errno));
                else
                    renamed++;
            }
    }
    s = mt_agree(b->comm, s);
    if (s != MT_OK) {
        /* Only a failed rename gets here with files in place: take back
         * this run's, so that no dataset is left half renamed. */
        for (int i = 0, k = 0; b->rank == 0 && i < np; i++)
            for (int j = 0; j < parts[i].nf; j++, k++) {
                remove(parts[i].f[j].tmp);
                if (k < renamed)
                    remove(parts[i].f[j].path);
            }
        MT_TRY(s);
    }
    for (int i = 0; b->rank == 0 && out && i < np; i++) {
        const part_t *p = &parts[i];
        if (o->megatron)
            fprintf(out, "wrote %s.bin + %s.idx%s%s%s: Megatron-LM indexed dataset, %lld "
                    "tokens in %lld documents, %s ids\n", p->prefix, p->prefix,
                    p->nf == 3 ? " + " : "", p->nf == 3 ? p->prefix : "",
                    p->nf == 3 ? ".lossmask" : "", (long long)p->n_tok,
                    (long long)(p->d1 - p->d0), b->token_bytes == 2 ? "uint16" : "int32");
        else
            fprintf(out, "wrote %s: llm.c token file, %lld tokens in %lld documents\n",
                    p->f[0].path, (long long)p->n_tok, (long long)(p->d1 - p->d0));
    }
    return MT_OK;
}

mt_status_t mt_data_build(MPI_Comm comm, const mt_tokenizer_t *tok, const mt_dw_opts_t *o,
                          FILE *out, FILE *err)
{
    build_t *b = calloc(1, sizeof *b);
    if (!b)
        MT_FAIL(MT_ERR_NOMEM, "out of memory");
    b->comm = comm;
    MPI_Comm_rank(comm, &b->rank);
    MPI_Comm_size(comm, &b->size);
    b->tok = tok;
    b->o = o;
    b->err = err ? err : stderr;
    b->n_streams = o->kind == MT_DW_JSONL ? o->n_keys : 1;
    int64_t vocab = o->vocab_size > 0 ? o->vocab_size : mt_tokenizer_vocab_size(tok);
    b->token_bytes = mt_dw_token_bytes(vocab);
    b->err_g = INT64_MAX;
    b->t0 = b->last_print = now();
    mt_status_t s = MT_OK;
    if (o->kind == MT_DW_JSONL && (o->n_keys < 1 || o->n_keys > MT_DW_MAX_KEYS))
        s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "between 1 and %d JSON keys, not "
                         "%d", MT_DW_MAX_KEYS, o->n_keys);
    if (s == MT_OK && mt_tokenizer_eos_id(tok) < 0)
        s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s: the tokenizer has no EOS "
                         "token to end documents with", mt_tokenizer_path(tok));
    if (s == MT_OK && !o->megatron && o->kind != MT_DW_TEXT)
        s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "JSONL and SFT input write "
                         "Megatron datasets only (--format megatron)");
    for (int i = 0; s == MT_OK && i < o->n_inputs; i++)
        s = o->kind == MT_DW_TEXT ? text_file(b, o->inputs[i]) : jsonl_file(b, o->inputs[i]);
    progress(b, 1);

    /* A record's error: the first in input order wins on every rank. */
    int64_t first = b->err_g;
    int rc = MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT64_T, MPI_MIN, comm);
    if (rc != MPI_SUCCESS)
        s = mt_error_mpi(rc, "MPI_Allreduce", __FILE__, __LINE__);
    else if (first != INT64_MAX && b->err_g != first)
        s = MT_OK;
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = finish(b, out);
    for (int k = 0; k < MT_DW_MAX_KEYS; k++) {
        mt_ids_free(&b->st[k].tok);
        mt_text_free(&b->st[k].mask);
        free(b->st[k].len);
    }
    mt_ids_free(&b->ids);
    mt_text_free(&b->mask);
    mt_text_free(&b->fixed);
    free(b);
    MT_TRY(s);
    return MT_OK;
}
