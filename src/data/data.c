/* data.c: token datasets and the sampling contract of mt_data.h.
 *
 * Opens llm.c token files and Megatron-LM indexed datasets (.idx/.bin)
 * read-only with mmap, validates their structure and every token once, and
 * finds document boundaries.  Then maps a sample counter to a dataset sample
 * (in order, or through a keyed Feistel permutation per epoch) and copies
 * micro-batches out.
 *
 * Deliberately not here: tokenizing and writing files (data_write.c), and
 * any sharding of files across ranks -- every rank maps the whole dataset
 * and the page cache shares it.  Multi-byte fields are decoded as
 * little-endian bytes, so files and sample orders are the same on every
 * host. */
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

#define LLMC_MAGIC 20240520
#define LLMC_VERSION 1
#define LLMC_HEADER_BYTES (256 * 4)

#define MMIDX_MAGIC "MMIDIDX\0\0"
#define MMIDX_MAGIC_LEN 9
#define MMIDX_VERSION 1
#define MMIDX_HEADER_BYTES 34 /* magic 9, version 8, dtype 1, counts 8 + 8 */

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static int32_t token_at(const mt_dataset_t *ds, int64_t i)
{
    const unsigned char *p = (const unsigned char *)ds->tokens + i * ds->token_bytes;
    if (ds->token_bytes == 2)
        return (int32_t)(p[0] | p[1] << 8);
    return (int32_t)le32(p);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int is_regular_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Map a whole file read-only.  An empty file gives addr NULL, len 0 (mmap
 * refuses a zero length). */
static mt_status_t map_file(const char *path, const char *what, void **addr, size_t *len,
                            int *keep_fd)
{
    if (keep_fd)
        *keep_fd = -1;
    *addr = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: cannot open %s: %s", path, what,
                     strerror(e));
        if (e == ENOENT)
            mt_error_hint("make token files with meshtrain-data (doc/data.md); a relative "
                          "dataset.path is relative to the directory the run starts in");
        return MT_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        MT_FAIL(MT_ERR_IO, "%s: %s is not a regular file", path, what);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            MT_FAIL(MT_ERR_IO, "%s: cannot map %s: %s", path, what, strerror(e));
        }
        *addr = p;
        *len = (size_t)st.st_size;
        if (keep_fd) { /* the per-batch fstat of mt_dataset_check */
            *keep_fd = fd;
            return MT_OK;
        }
    }
    close(fd);
    return MT_OK;
}

/* Every token in [0, vocab_size); called once at open. */
static mt_status_t check_tokens(const mt_dataset_t *ds, const char *file, int64_t vocab_size)
{
    if (ds->token_bytes == 2 && vocab_size > UINT16_MAX)
        return MT_OK; /* every uint16 fits */
    for (int64_t i = 0; i < ds->n_tokens; i++) {
        int32_t t = token_at(ds, i);
        if (t < 0)
            MT_FAIL(MT_ERR_IO, "%s: token %d at position %lld is negative", file, (int)t,
                    (long long)i);
        if (t >= vocab_size) {
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                         "%s: token %d at position %lld is >= vocab_size %lld", file, (int)t,
                         (long long)i, (long long)vocab_size);
            mt_error_hint("model.vocab_size must exceed every token id; the byte tokenizer of "
                          "meshtrain-data needs at least %d", MT_TOKENIZER_VOCAB);
            return MT_ERR_IO;
        }
    }
    return MT_OK;
}

/* ------------------------------------------------------------------ llm.c */

static mt_status_t open_llmc(mt_dataset_t *ds, const char *path, int64_t vocab_size)
{
    MT_TRY(map_file(path, "llm.c token file", &ds->map[0], &ds->map_len[0], &ds->tok_fd));
    ds->tok_len = ds->map_len[0]; /* from here close() owns tok_fd */
    const unsigned char *b = ds->map[0];
    size_t len = ds->map_len[0];
    if (len < 4 || le32(b) != LLMC_MAGIC) {
        if (len < 4)
            MT_FAIL(MT_ERR_IO, "%s: not an llm.c token file (%zu bytes, shorter than its magic)",
                    path, len);
        if (memcmp(b, MMIDX_MAGIC, len < MMIDX_MAGIC_LEN ? len : MMIDX_MAGIC_LEN) == 0) {
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                         "%s: not an llm.c token file (it is a Megatron-LM index)", path);
            mt_error_hint("use dataset.format auto or megatron with the prefix of PREFIX.idx");
            return MT_ERR_IO;
        }
        MT_FAIL(MT_ERR_IO, "%s: not an llm.c token file (magic %d, expected %d)", path,
                (int)(int32_t)le32(b), LLMC_MAGIC);
    }
    if (len < LLMC_HEADER_BYTES)
        MT_FAIL(MT_ERR_IO, "%s: truncated: %zu bytes, shorter than the %d-byte llm.c header",
                path, len, LLMC_HEADER_BYTES);
    int32_t version = (int32_t)le32(b + 4), count = (int32_t)le32(b + 8);
    if (version != LLMC_VERSION)
        MT_FAIL(MT_ERR_IO, "%s: llm.c token file version %d is not supported (expected %d: "
                "uint16 tokens)", path, (int)version, LLMC_VERSION);
    if (count < 0)
        MT_FAIL(MT_ERR_IO, "%s: header says %d tokens", path, (int)count);
    uint64_t want = LLMC_HEADER_BYTES + 2 * (uint64_t)count;
    if (len != want)
        MT_FAIL(MT_ERR_IO, "%s: %s: header says %d tokens (%llu bytes) but the file has %zu bytes",
                path, len < want ? "truncated" : "size mismatch", (int)count,
                (unsigned long long)want, len);

    ds->format = MT_DATA_LLMC;
    ds->token_bytes = 2;
    ds->n_tokens = count;
    ds->tokens = b + LLMC_HEADER_BYTES;
    ds->tok_off = LLMC_HEADER_BYTES;
    snprintf(ds->tok_file, sizeof ds->tok_file, "%s", path);
    MT_TRY(check_tokens(ds, path, vocab_size));

    /* Documents end with their EOD token; text after the last EOD is a
     * final document without one. */
    int64_t n_eod = 0;
    for (int64_t i = 0; i < ds->n_tokens; i++)
        n_eod += token_at(ds, i) == MT_TOKEN_EOD;
    ds->doc_start = malloc(sizeof *ds->doc_start * (size_t)(n_eod + 2));
    if (!ds->doc_start)
        MT_FAIL(MT_ERR_NOMEM, "%s: no memory for %lld document offsets", path,
                (long long)(n_eod + 2));
    int64_t nd = 0;
    ds->doc_start[0] = 0;
    for (int64_t i = 0; i < ds->n_tokens; i++)
        if (token_at(ds, i) == MT_TOKEN_EOD)
            ds->doc_start[++nd] = i + 1;
    if (ds->doc_start[nd] != ds->n_tokens)
        ds->doc_start[++nd] = ds->n_tokens;
    ds->n_docs = nd;
    return MT_OK;
}

/* ------------------------------------------------------------------ Megatron */

static const char *mmidx_dtype_name(unsigned code)
{
    static const char *names[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                  "int64", "float64", "float32", "uint16"};
    return code < sizeof names / sizeof names[0] ? names[code] : "?";
}

static mt_status_t open_megatron(mt_dataset_t *ds, const char *prefix, int64_t vocab_size)
{
    char idx[MT_PATH_MAX + 8], bin[MT_PATH_MAX + 8];
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    MT_TRY(map_file(idx, "Megatron index", &ds->map[0], &ds->map_len[0], NULL));
    const unsigned char *b = ds->map[0];
    size_t len = ds->map_len[0];

    if (len < MMIDX_MAGIC_LEN || memcmp(b, MMIDX_MAGIC, MMIDX_MAGIC_LEN) != 0) {
        char shown[64] = "";
        for (size_t i = 0, o = 0; i < len && i < MMIDX_MAGIC_LEN; i++)
            o += (size_t)snprintf(shown + o, sizeof shown - o,
                                  b[i] >= 0x20 && b[i] < 0x7f ? "%c" : "\\x%02x", b[i]);
        MT_FAIL(MT_ERR_IO, "%s: not a Megatron-LM index (magic \"%s\", expected "
                "\"MMIDIDX\\x00\\x00\")", idx, shown);
    }
    if (len < MMIDX_HEADER_BYTES)
        MT_FAIL(MT_ERR_IO, "%s: truncated: %zu bytes, shorter than the %d-byte index header",
                idx, len, MMIDX_HEADER_BYTES);
    uint64_t version = le64(b + 9);
    unsigned code = b[17];
    uint64_t nseq = le64(b + 18), ndoc = le64(b + 26);
    if (version != MMIDX_VERSION)
        MT_FAIL(MT_ERR_IO, "%s: Megatron index version %llu is not supported (expected %d)",
                idx, (unsigned long long)version, MMIDX_VERSION);
    if (code != 8 && code != 4) {
        if (code >= 1 && code <= 8)
            MT_FAIL(MT_ERR_IO, "%s: dtype code %u (%s) is not a token type: meshtrain reads "
                    "uint16 (code 8) and int32 (code 4)", idx, code, mmidx_dtype_name(code));
        MT_FAIL(MT_ERR_IO, "%s: unknown dtype code %u (Megatron-LM defines 1..8; meshtrain "
                "reads uint16 (code 8) and int32 (code 4))", idx, code);
    }
    int tb = code == 8 ? 2 : 4;
    /* 12 bytes per sequence, 8 per document index: bound the counts
     * before multiplying. */
    if (nseq > ((uint64_t)1 << 56) || ndoc > ((uint64_t)1 << 56))
        MT_FAIL(MT_ERR_IO, "%s: header says %llu sequences and %llu document indices: not "
                "a plausible index", idx, (unsigned long long)nseq, (unsigned long long)ndoc);
    uint64_t want = MMIDX_HEADER_BYTES + 12 * nseq + 8 * ndoc;
    if (len < want)
        MT_FAIL(MT_ERR_IO, "%s: truncated: header says %llu sequences and %llu document indices "
                "(%llu bytes) but the file has %zu bytes", idx, (unsigned long long)nseq,
                (unsigned long long)ndoc, (unsigned long long)want, len);
    if (len > want)
        MT_FAIL(MT_ERR_IO, "%s: size mismatch: header says %llu sequences and %llu document "
                "indices (%llu bytes) but the file has %zu bytes (per-sequence modes of "
                "multimodal datasets are not supported)", idx, (unsigned long long)nseq,
                (unsigned long long)ndoc, (unsigned long long)want, len);
    const unsigned char *sizes = b + MMIDX_HEADER_BYTES;
    const unsigned char *pointers = sizes + 4 * nseq;
    const unsigned char *doc_idx = pointers + 8 * nseq;

    /* The .bin must be the concatenation of the sequences, in order: that
     * is what the tokens of mt_dataset_t are. */
    uint64_t end = 0;
    for (uint64_t i = 0; i < nseq; i++) {
        int32_t size = (int32_t)le32(sizes + 4 * i);
        uint64_t ptr = le64(pointers + 8 * i);
        if (size < 0)
            MT_FAIL(MT_ERR_IO, "%s: sequence %llu has negative size %d", idx,
                    (unsigned long long)i, (int)size);
        if (ptr != end)
            MT_FAIL(MT_ERR_IO, "%s: sequence %llu starts at byte %llu but the sequences before "
                    "it end at byte %llu: meshtrain reads %s as the concatenation of all "
                    "sequences", idx, (unsigned long long)i, (unsigned long long)ptr,
                    (unsigned long long)end, bin);
        end += (uint64_t)size * (uint64_t)tb;
    }
    if (ndoc < 1)
        MT_FAIL(MT_ERR_IO, "%s: empty document index (it needs at least the entry 0)", idx);
    uint64_t prev = 0;
    for (uint64_t k = 0; k < ndoc; k++) {
        uint64_t d = le64(doc_idx + 8 * k);
        if ((k == 0 && d != 0) || d < prev || d > nseq)
            MT_FAIL(MT_ERR_IO, "%s: document index entry %llu is %llu: entries must rise from "
                    "0 to the sequence count %llu", idx, (unsigned long long)k,
                    (unsigned long long)d, (unsigned long long)nseq);
        prev = d;
    }
    if (prev != nseq)
        MT_FAIL(MT_ERR_IO, "%s: the document index ends at sequence %llu, expected the sequence "
                "count %llu", idx, (unsigned long long)prev, (unsigned long long)nseq);

    MT_TRY(map_file(bin, "Megatron data file", &ds->map[1], &ds->map_len[1], &ds->tok_fd));
    ds->tok_len = ds->map_len[1]; /* from here close() owns tok_fd */
    if (ds->map_len[1] != end)
        MT_FAIL(MT_ERR_IO, "%s: %s: %s describes %llu tokens (%llu bytes) but the file has %zu "
                "bytes", bin, ds->map_len[1] < end ? "truncated" : "size mismatch", idx,
                (unsigned long long)(end / (uint64_t)tb), (unsigned long long)end,
                ds->map_len[1]);

    ds->format = MT_DATA_MEGATRON;
    ds->token_bytes = tb;
    ds->n_tokens = (int64_t)(end / (uint64_t)tb);
    ds->tokens = ds->map[1];
    ds->tok_off = 0;
    snprintf(ds->tok_file, sizeof ds->tok_file, "%s", bin);
    MT_TRY(check_tokens(ds, bin, vocab_size));

    ds->n_docs = (int64_t)ndoc - 1;
    ds->doc_start = malloc(sizeof *ds->doc_start * (size_t)ndoc);
    if (!ds->doc_start)
        MT_FAIL(MT_ERR_NOMEM, "%s: no memory for %llu document offsets", idx,
                (unsigned long long)ndoc);
    for (uint64_t k = 0; k < ndoc; k++) {
        uint64_t seq = le64(doc_idx + 8 * k);
        ds->doc_start[k] = seq == nseq ? ds->n_tokens
                                       : (int64_t)(le64(pointers + 8 * seq) / (uint64_t)tb);
    }
    return MT_OK;
}

/* PATH, PATH.bin or PATH.idx -> the prefix. */
static mt_status_t megatron_prefix(const char *path, char *prefix)
{
    size_t n = strlen(path);
    if (ends_with(path, ".idx") || ends_with(path, ".bin"))
        n -= 4;
    if (n >= MT_PATH_MAX - 4)
        MT_FAIL(MT_ERR_IO, "%s: path too long", path);
    memcpy(prefix, path, n);
    prefix[n] = '\0';
    return MT_OK;
}

/* fmt auto: what is at PATH decides. */
static mt_status_t detect(const char *path, mt_data_format_t *fmt)
{
    char prefix[MT_PATH_MAX], idx[MT_PATH_MAX + 8];
    if (is_regular_file(path)) {
        unsigned char head[MMIDX_MAGIC_LEN] = {0};
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t got = fd >= 0 ? read(fd, head, sizeof head) : -1;
        if (fd >= 0)
            close(fd);
        if (got >= 4 && le32(head) == LLMC_MAGIC) {
            *fmt = MT_DATA_LLMC;
            return MT_OK;
        }
        if (got == MMIDX_MAGIC_LEN && memcmp(head, MMIDX_MAGIC, MMIDX_MAGIC_LEN) == 0) {
            if (!ends_with(path, ".idx"))
                MT_FAIL(MT_ERR_IO, "%s: a Megatron-LM index, but its name does not end in .idx "
                        "(expected PREFIX.idx next to PREFIX.bin)", path);
            *fmt = MT_DATA_MEGATRON;
            return MT_OK;
        }
        MT_TRY(megatron_prefix(path, prefix));
        snprintf(idx, sizeof idx, "%s.idx", prefix);
        /* A .bin next to its .idx is Megatron data; anything else is read
         * as llm.c, whose open names what is wrong with it. */
        *fmt = ends_with(path, ".bin") && is_regular_file(idx) ? MT_DATA_MEGATRON : MT_DATA_LLMC;
        return MT_OK;
    }
    struct stat st;
    if (stat(path, &st) == 0)
        MT_FAIL(MT_ERR_IO, "%s: not a regular file (expected an llm.c token file or a "
                "Megatron-LM PREFIX, PREFIX.bin or PREFIX.idx)", path);
    int e = errno;
    snprintf(idx, sizeof idx, "%s.idx", path);
    if (is_regular_file(idx)) {
        *fmt = MT_DATA_MEGATRON;
        return MT_OK;
    }
    mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                 "%s: cannot open dataset: %s (and there is no Megatron-LM index %s.idx)", path,
                 strerror(e), path);
    mt_error_hint("make token files with meshtrain-data (doc/data.md); a relative dataset.path "
                  "is relative to the directory the run starts in");
    return MT_ERR_IO;
}

mt_status_t mt_dataset_open(mt_dataset_t *ds, const char *path, mt_data_format_t fmt,
                            int64_t vocab_size)
{
    memset(ds, 0, sizeof *ds);
    if (!path || !path[0])
        MT_FAIL(MT_ERR_CONFIG, "no dataset path given (dataset.path)");
    if (strlen(path) >= MT_PATH_MAX - 8)
        MT_FAIL(MT_ERR_IO, "%s: path too long (at most %d bytes)", path, MT_PATH_MAX - 9);
    if (vocab_size < 1)
        MT_FAIL(MT_ERR_RANGE, "%s: vocab_size %lld must be positive", path, (long long)vocab_size);
    snprintf(ds->path, sizeof ds->path, "%s", path);
    ds->vocab_size = vocab_size;

    mt_status_t s = MT_OK;
    if (fmt == MT_DATA_AUTO)
        s = detect(path, &fmt);
    if (s == MT_OK && fmt == MT_DATA_LLMC) {
        s = open_llmc(ds, path, vocab_size);
    } else if (s == MT_OK) {
        char prefix[MT_PATH_MAX];
        s = megatron_prefix(path, prefix);
        if (s == MT_OK)
            s = open_megatron(ds, prefix, vocab_size);
    }
    if (s != MT_OK) {
        mt_error_trace(__FILE__, __LINE__);
        mt_dataset_close(ds);
        snprintf(ds->path, sizeof ds->path, "%s", path);
    }
    return s;
}

void mt_dataset_close(mt_dataset_t *ds)
{
    if (ds->tok_len > 0 && ds->tok_fd >= 0)
        close(ds->tok_fd);
    for (int i = 0; i < 2; i++)
        if (ds->map[i])
            munmap(ds->map[i], ds->map_len[i]);
    if (ds->mask_map)
        munmap(ds->mask_map, ds->mask_len);
    for (int i = 0; i < ds->n_parts; i++)
        mt_dataset_close(&ds->parts[i]);
    free(ds->parts);
    free(ds->part_start);
    free(ds->doc_start);
    memset(ds, 0, sizeof *ds);
}

/* fstat is a few hundred nanoseconds, so it runs per window rather than
 * once a step: a file truncated between two windows of one batch is still
 * caught before the read that would fault.  (A window read can still race
 * a truncation in the instant after the fstat; catching that needs a
 * SIGBUS handler around every copy, which we do not install.) */
static mt_status_t check_plain(const mt_dataset_t *ds, int64_t start, int64_t n)
{
    if (n <= 0)
        return MT_OK;
    uint64_t first = ds->tok_off + (uint64_t)start * (uint64_t)ds->token_bytes;
    uint64_t end = first + (uint64_t)n * (uint64_t)ds->token_bytes;
    if (ds->tok_len > 0 && ds->tok_fd >= 0) { /* a zeroed struct has no file */
        struct stat st;
        if (fstat(ds->tok_fd, &st) != 0)
            MT_FAIL(MT_ERR_IO, "%s: cannot fstat the token file before reading bytes %llu..%llu: "
                    "%s", ds->tok_file, (unsigned long long)first, (unsigned long long)end,
                    strerror(errno));
        if ((uint64_t)st.st_size < end) {
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                         "%s: truncated while mapped: %llu bytes now, %zu when opened; the "
                         "window of tokens %lld..%lld (bytes %llu..%llu) is gone",
                         ds->tok_file, (unsigned long long)st.st_size, ds->tok_len,
                         (long long)start, (long long)(start + n), (unsigned long long)first,
                         (unsigned long long)end);
            mt_error_hint("a token file must not change while a run reads it; write a new "
                          "file and point dataset.path at it");
            return MT_ERR_IO;
        }
    }
    int64_t v = ds->vocab_size;
    const unsigned char *p = (const unsigned char *)ds->tokens + (size_t)start * ds->token_bytes;
    if (ds->token_bytes == 2) {
        /* the common case: one compare per id, no early exit, so the loop
         * vectorises; the offending id is looked for only on failure */
        unsigned bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad |= (int64_t)(p[2 * i] | p[2 * i + 1] << 8) >= v;
        if (!bad)
            return MT_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t t = token_at(ds, start + i);
        if (t < 0 || t >= v) {
            unsigned long long off = ds->tok_off +
                                     (unsigned long long)(start + i) * (unsigned)ds->token_bytes;
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                         "%s: token %d at byte offset %llu (token %lld) is out of range "
                         "[0, %lld): the file changed after it was opened and checked",
                         ds->tok_file, (int)t, off, (long long)(start + i), (long long)v);
            mt_error_hint("a token file must not change while a run reads it; write a new "
                          "file and point dataset.path at it");
            return MT_ERR_IO;
        }
    }
    return MT_OK;
}

mt_status_t mt_dataset_check(const mt_dataset_t *ds, int64_t start, int64_t n)
{
    if (ds->n_parts == 0)
        return check_plain(ds, start, n);
    for (int p = 0; p < ds->n_parts && n > 0; p++) {
        int64_t a = ds->part_start[p], b = ds->part_start[p + 1];
        if (start >= b)
            continue;
        int64_t k = b - start < n ? b - start : n;
        MT_TRY(check_plain(&ds->parts[p], start - a, k));
        start += k;
        n -= k;
    }
    return MT_OK;
}

static void read_part(const mt_dataset_t *part, int64_t at, int64_t k, void *out)
{
    mt_dataset_read(part, at, k, out);
}

void mt_dataset_read(const mt_dataset_t *ds, int64_t start, int64_t n, int32_t *out)
{
    assert(start >= 0 && n >= 0 && start + n <= ds->n_tokens);
    if (ds->n_parts > 0) { /* a concatenation: part by part */
        mt_dataset_each_part(ds, start, n, out, sizeof *out, read_part);
        return;
    }
    if (ds->token_bytes == 2) {
        const unsigned char *p = (const unsigned char *)ds->tokens + 2 * start;
        for (int64_t i = 0; i < n; i++)
            out[i] = (int32_t)(p[2 * i] | p[2 * i + 1] << 8);
    } else {
        for (int64_t i = 0; i < n; i++)
            out[i] = token_at(ds, start + i);
    }
}

int64_t mt_dataset_num_samples(const mt_dataset_t *ds, int64_t seq_len)
{
    if (seq_len < 1 || ds->n_tokens < 2)
        return 0;
    return (ds->n_tokens - 1) / seq_len;
}

/* ------------------------------------------------------------------ sampling */

/* splitmix64's output function: a fixed 64-bit mixer, the same on every
 * platform. */
static uint64_t mix64(uint64_t z)
{
    z += UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

#define FEISTEL_ROUNDS 6
#define FEISTEL_MIN_HALF 4 /* a domain of at least 256 mixes small datasets too */

/* A balanced Feistel network on 2h bits is a bijection of [0, 4^h) for any
 * round function; cycle-walking (apply again until the value is < n) turns
 * it into a bijection of [0, n).  4^h < 4n, so a walk takes fewer than 4
 * steps on average, and the permutation needs O(1) memory. */
static int64_t permute(uint64_t i, uint64_t n, uint64_t seed, uint64_t epoch)
{
    int half = FEISTEL_MIN_HALF;
    while (half < 32 && (UINT64_C(1) << (2 * half)) < n)
        half++;
    uint64_t mask = (UINT64_C(1) << half) - 1;
    uint64_t key = mix64(seed ^ mix64(epoch)), round_key[FEISTEL_ROUNDS];
    for (int r = 0; r < FEISTEL_ROUNDS; r++)
        round_key[r] = mix64(key + (uint64_t)r);
    uint64_t x = i;
    do {
        uint64_t left = x >> half, right = x & mask;
        for (int r = 0; r < FEISTEL_ROUNDS; r++) {
            uint64_t t = left ^ (mix64(right ^ round_key[r]) & mask);
            left = right;
            right = t;
        }
        x = left << half | right;
    } while (x >= n);
    return (int64_t)x;
}

int64_t mt_sampler_index(const mt_sampler_t *s, int64_t c)
{
    assert(s->num_samples > 0 && c >= 0);
    int64_t epoch = c / s->num_samples, i = c % s->num_samples;
    if (!s->shuffle)
        return i;
    return permute((uint64_t)i, (uint64_t)s->num_samples, s->seed, (uint64_t)epoch);
}

int64_t mt_batch_first(int64_t step, int64_t global, int64_t dp_rank, int64_t dp_size,
                       int64_t micro, int64_t local)
{
    int64_t per_rank = dp_size > 0 ? global / dp_size : 0;
    assert(dp_size > 0 && global % dp_size == 0);
    assert(dp_rank >= 0 && dp_rank < dp_size && step >= 0 && micro >= 0 && local > 0);
    assert((micro + 1) * local <= per_rank);
    return step * global + dp_rank * per_rank + micro * local;
}

mt_status_t mt_data_fill_batch(const mt_dataset_t *ds, const mt_sampler_t *s, int64_t step,
                               int64_t global, int64_t dp_rank, int64_t dp_size,
                               int64_t micro, int64_t local, int32_t *inputs,
                               int32_t *targets)
{
    int64_t S = s->seq_len;
    assert(S > 0);
    int64_t first = mt_batch_first(step, global, dp_rank, dp_size, micro, local);
    for (int64_t j = 0; j < local; j++)
        MT_TRY(mt_data_fill_sample(ds, mt_sampler_index(s, first + j), S, inputs + j * S,
                                   targets + j * S));
    return MT_OK;
}

mt_status_t mt_data_fill_sample(const mt_dataset_t *ds, int64_t i, int64_t S, int32_t *inputs,
                                int32_t *targets)
{
    assert(i >= 0 && (i + 1) * S + 1 <= ds->n_tokens);
    MT_TRY(mt_dataset_check(ds, i * S, S + 1));
    mt_dataset_read(ds, i * S, S, inputs);
    mt_dataset_read(ds, i * S + 1, S, targets);
    if (!ds->mask && ds->n_parts == 0)
        return MT_OK;
    unsigned char m[512]; /* the targets' masks, a block at a time */
    for (int64_t a = 0; a < S; a += (int64_t)sizeof m) {
        int64_t k = S - a < (int64_t)sizeof m ? S - a : (int64_t)sizeof m;
        mt_dataset_read_mask(ds, i * S + 1 + a, k, m);
        for (int64_t t = 0; t < k; t++)
            if (!m[t])
                targets[a + t] = MT_IGNORE_INDEX;
    }
    return MT_OK;
}
