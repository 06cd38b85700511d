/* data_input.c: reading meshtrain-data's inputs: files as lines or whole,
 * zstd-decompressed on the fly (libzstd's streaming API), and the UTF-8
 * check and repair applied to every document.
 *
 * Not here: what a line means (JSON records: data_par.c, data_sft.c). */
#include <config.h>

#include "data_write_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

struct mt_dw_reader {
    FILE *f;
    char *path;
    ZSTD_DStream *z;       /* NULL: a plain file */
    unsigned char *zin;    /* compressed input buffer */
    size_t zin_cap;
    ZSTD_inBuffer in;
    size_t zlast;          /* ZSTD_decompressStream's last hint: 0 at a frame end */
    char *buf;             /* [start, end) not yet handed out */
    size_t start, end, cap;
    int eof;
    int64_t lineno, bytes;
};

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

mt_status_t mt_dw_reader_open(const char *path, mt_dw_reader_t **out)
{
    *out = NULL;
    mt_dw_reader_t *r = calloc(1, sizeof *r);
    if (!r)
        MT_FAIL(MT_ERR_NOMEM, "%s: out of memory", path);
    r->path = strdup(path);
    r->f = fopen(path, "rb");
    if (!r->path || !r->f) {
        int e = errno;
        mt_dw_reader_close(r);
        MT_FAIL(MT_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    unsigned char magic[4] = {0};
    size_t got = fread(magic, 1, 4, r->f);
    rewind(r->f);
    int zst = ends_with(path, ".zst") ||
              (got == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f &&
               magic[3] == 0xfd);
    r->cap = 1 << 20;
    r->buf = malloc(r->cap);
    if (zst) {
        r->z = ZSTD_createDStream();
        r->zin_cap = ZSTD_DStreamInSize();
        r->zin = malloc(r->zin_cap);
        if (r->z)
            ZSTD_initDStream(r->z);
    }
    if (!r->buf || (zst && (!r->z || !r->zin))) {
        mt_dw_reader_close(r);
        MT_FAIL(MT_ERR_NOMEM, "%s: out of memory for read buffers", path);
    }
    *out = r;
    return MT_OK;
}

void mt_dw_reader_close(mt_dw_reader_t *r)
{
    if (!r)
        return;
    if (r->f)
        fclose(r->f);
    if (r->z)
        ZSTD_freeDStream(r->z);
    free(r->zin);
    free(r->buf);
    free(r->path);
    free(r);
}

/* Append more bytes at end (the buffer grows when full); sets eof. */
static mt_status_t refill(mt_dw_reader_t *r)
{
    if (r->start > 0) { /* keep the unconsumed tail at the front */
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (r->end == r->cap) {
        char *b = realloc(r->buf, r->cap * 2);
        if (!b)
            MT_FAIL(MT_ERR_NOMEM, "%s: out of memory for a line of %zu bytes", r->path, r->cap);
        r->buf = b;
        r->cap *= 2;
    }
    if (!r->z) {
        size_t n = fread(r->buf + r->end, 1, r->cap - r->end, r->f);
        if (n == 0 && ferror(r->f))
            MT_FAIL(MT_ERR_IO, "%s: read error: %s", r->path, strerror(errno));
        r->end += n;
        r->eof = n == 0;
        return MT_OK;
    }
    for (;;) {
        if (r->in.pos == r->in.size) {
            size_t n = fread(r->zin, 1, r->zin_cap, r->f);
            if (n == 0) {
                if (ferror(r->f))
                    MT_FAIL(MT_ERR_IO, "%s: read error: %s", r->path, strerror(errno));
                if (r->zlast != 0)
                    MT_FAIL(MT_ERR_IO, "%s: truncated zstd stream (the last frame is "
                            "incomplete)", r->path);
                r->eof = 1;
                return MT_OK;
            }
            r->in.src = r->zin;
            r->in.size = n;
            r->in.pos = 0;
        }
        ZSTD_outBuffer o = {r->buf + r->end, r->cap - r->end, 0};
        size_t rc = ZSTD_decompressStream(r->z, &o, &r->in);
        if (ZSTD_isError(rc))
            MT_FAIL(MT_ERR_IO, "%s: zstd: %s (after %lld uncompressed bytes)", r->path,
                    ZSTD_getErrorName(rc), (long long)(r->bytes + (int64_t)r->end));
        r->zlast = rc;
        r->end += o.pos;
        if (o.pos > 0)
            return MT_OK;
    }
}

mt_status_t mt_dw_reader_line(mt_dw_reader_t *r, const char **line, size_t *len,
                              int64_t *lineno, int *got)
{
    *got = 0;
    size_t scanned = r->start;
    for (;;) {
        char *nl = memchr(r->buf + scanned, '\n', r->end - scanned);
        if (nl || (r->eof && r->end > r->start)) {
            size_t e = nl ? (size_t)(nl - r->buf) : r->end;
            *line = r->buf + r->start;
            *len = e - r->start;
            r->bytes += (int64_t)(e - r->start) + (nl ? 1 : 0);
            r->start = nl ? e + 1 : e;
            *lineno = ++r->lineno;
            *got = 1;
            return MT_OK;
        }
        if (r->eof)
            return MT_OK;
        size_t off = r->end - r->start;
        MT_TRY(refill(r));
        scanned = r->start + off;
    }
}

int64_t mt_dw_reader_bytes(const mt_dw_reader_t *r)
{
    return r->bytes;
}

mt_status_t mt_dw_read_all(const char *path, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    mt_dw_reader_t *r;
    MT_TRY(mt_dw_reader_open(path, &r));
    mt_status_t s = MT_OK;
    while (s == MT_OK && !r->eof)
        s = refill(r);
    if (s == MT_OK) {
        *len = r->end - r->start;
        *buf = r->buf; /* refill keeps start at 0 */
        r->buf = NULL;
    }
    mt_dw_reader_close(r);
    if (s != MT_OK)
        mt_error_trace(__FILE__, __LINE__);
    return s;
}

/* ------------------------------------------------------------------ UTF-8 */

/* The length of the well-formed sequence at s[0..n) (1..4), or, when it
 * is ill-formed, minus the length of its maximal subpart (Unicode 3.9,
 * "U+FFFD substitution of maximal subparts"). */
static int utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else
        return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n)
            return -k;
        unsigned b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf))
            return -k;
    }
    return need + 1;
}

int64_t mt_utf8_invalid_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_seq(u + i, n - i);
        if (k < 0)
            return (int64_t)i;
        i += (size_t)k;
    }
    return -1;
}

mt_status_t mt_utf8_replace(const char *s, size_t n, mt_text_t *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t run = 0; /* start of the current valid run */
    for (size_t i = 0; i < n;) {
        int k = u[i] < 0x80 ? 1 : utf8_seq(u + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        MT_TRY(mt_text_append(out, s + run, i - run));
        MT_TRY(mt_text_append(out, "\xef\xbf\xbd", 3));
        i += (size_t)(-k);
        run = i;
    }
    MT_TRY(mt_text_append(out, s + run, n - run));
    return MT_OK;
}
