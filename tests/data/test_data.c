/* test_data.c: the data subsystem without MPI: writer/reader round trips in
 * both formats, format detection, document boundaries, the sampling
 * contract (in order and shuffled, across epochs), micro-batch contents,
 * and one clear error for every kind of bad file.  Files live in a mkdtemp
 * directory that is removed at the end. */
#include <config.h>

#include "mt_data.h"
#include "mt_test.h"
#include "mt_test_dir.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    static unsigned char buf[1 << 20];
    *n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
        fclose(f);
    return buf;
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> 8 * i);
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> 8 * i);
}

/* Open must fail with MT_ERR_IO and a message containing `needle`. */
#define EXPECT_OPEN_ERROR(path, fmt, vocab, needle)                                  \
    do {                                                                             \
        mt_dataset_t ds_;                                                            \
        mt_status_t s_ = mt_dataset_open(&ds_, (path), (fmt), (vocab));              \
        CHECK(s_ == MT_ERR_IO, "open %s: status %d, expected an I/O error", (path),  \
              (int)s_);                                                              \
        CHECK_CONTAINS(mt_error_message(), (needle));                                \
        if (s_ == MT_OK)                                                             \
            mt_dataset_close(&ds_);                                                  \
    } while (0)

/* Three documents of text, as meshtrain-data makes them. */
static const char *docs[] = {"Hello, world.", "A second\ndocument.", "x"};
static int32_t corpus[64];
static int64_t corpus_start[4], corpus_n;

static void make_corpus(void)
{
    corpus_n = 0;
    for (int d = 0; d < 3; d++) {
        corpus_start[d] = corpus_n;
        corpus_n += mt_tokenize_bytes((const unsigned char *)docs[d], (int64_t)strlen(docs[d]),
                                      corpus + corpus_n);
        corpus[corpus_n++] = MT_TOKEN_EOD;
    }
    corpus_start[3] = corpus_n;
}

static void check_same_tokens(const mt_dataset_t *ds, const int32_t *want, int64_t n)
{
    int32_t got[64];
    CHECK(ds->n_tokens == n, "n_tokens %lld, want %lld", (long long)ds->n_tokens, (long long)n);
    if (ds->n_tokens != n || n > 64)
        return;
    mt_dataset_read(ds, 0, n, got);
    CHECK(memcmp(got, want, sizeof *got * (size_t)n) == 0, "tokens differ");
}

static void test_tokenizer(void)
{
    int32_t out[4];
    CHECK(mt_tokenize_bytes((const unsigned char *)"a\n\xff", 3, out) == 3, "3 bytes");
    CHECK(out[0] == 'a' && out[1] == '\n' && out[2] == 255, "bytes are ids");
    CHECK(MT_TOKEN_EOD == 256 && MT_TOKEN_PAD == 257 && MT_TOKENIZER_VOCAB == 258, "specials");
}

static void test_llmc_roundtrip(void)
{
    mt_dataset_t ds;
    const char *p = tmp("c.bin");
    CHECK(mt_write_llmc(p, corpus, corpus_n) == MT_OK, "%s", mt_error_message());
    size_t n;
    const unsigned char *b = slurp(p, &n);
    CHECK(n == 1024 + 2 * (size_t)corpus_n, "file size %zu", n);
    CHECK(b[0] == 0x88 && b[1] == 0xd8 && b[2] == 0x34 && b[3] == 0x01, "magic little-endian");
    CHECK(b[4] == 1 && b[8] == corpus_n && b[1024] == 'H' && b[1025] == 0, "header and tokens");

    for (int f = 0; f < 2; f++) {
        mt_data_format_t fmt = f ? MT_DATA_LLMC : MT_DATA_AUTO;
        CHECK(mt_dataset_open(&ds, p, fmt, 512) == MT_OK, "%s", mt_error_message());
        CHECK(ds.format == MT_DATA_LLMC && ds.token_bytes == 2, "llm.c, uint16");
        CHECK(strcmp(ds.path, p) == 0, "path kept");
        check_same_tokens(&ds, corpus, corpus_n);
        CHECK(ds.n_docs == 3, "3 documents, got %lld", (long long)ds.n_docs);
        for (int d = 0; d <= 3 && ds.n_docs == 3; d++)
            CHECK(ds.doc_start[d] == corpus_start[d], "doc_start[%d] = %lld", d,
                  (long long)ds.doc_start[d]);
        mt_dataset_close(&ds);
    }
    CHECK(ds.doc_start == NULL && ds.map[0] == NULL, "close clears");

    /* Any name: detection goes by the magic. */
    const char *q = tmp("tokens.dat");
    CHECK(mt_write_llmc(q, corpus, corpus_n - 1) == MT_OK, "%s", mt_error_message());
    CHECK(mt_dataset_open(&ds, q, MT_DATA_AUTO, MT_TOKENIZER_VOCAB) == MT_OK, "%s",
          mt_error_message());
    /* No final EOD: the text after the last one is a last document. */
    CHECK(ds.n_docs == 3 && ds.doc_start[3] == corpus_n - 1 && ds.doc_start[2] == corpus_start[2],
          "unterminated last document");
    mt_dataset_close(&ds);

    /* Empty files open; they have no samples. */
    CHECK(mt_write_llmc(q, corpus, 0) == MT_OK, "%s", mt_error_message());
    CHECK(mt_dataset_open(&ds, q, MT_DATA_AUTO, 512) == MT_OK, "%s", mt_error_message());
    CHECK(ds.n_tokens == 0 && ds.n_docs == 0 && ds.doc_start[0] == 0, "empty");
    CHECK(mt_dataset_num_samples(&ds, 4) == 0, "no samples");
    mt_dataset_close(&ds);

    int32_t big[2] = {1, 70000};
    CHECK(mt_write_llmc(q, big, 2) == MT_ERR_RANGE, "70000 does not fit uint16");
    CHECK_CONTAINS(mt_error_message(), "token 70000 at position 1 does not fit in uint16");
}

static void test_megatron_roundtrip(void)
{
    mt_dataset_t ds;
    const char *prefix = tmp("m");
    CHECK(mt_write_megatron(prefix, corpus, corpus_n, corpus_start, 3) == MT_OK, "%s",
          mt_error_message());
    size_t n;
    const unsigned char *b = slurp(tmp("m.idx"), &n);
    CHECK(n == 34 + 12 * 3 + 8 * 4, "idx size %zu", n);
    CHECK(memcmp(b, "MMIDIDX\0\0", 9) == 0 && b[9] == 1 && b[17] == 8 && b[18] == 3 && b[26] == 4,
          "idx header");
    slurp(tmp("m.bin"), &n);
    CHECK(n == 2 * (size_t)corpus_n, "bin size %zu", n);

    const char *names[] = {prefix, tmp("m.bin"), tmp("m.idx")};
    for (int k = 0; k < 4; k++) {
        const char *path = names[k % 3];
        mt_data_format_t fmt = k == 3 ? MT_DATA_MEGATRON : MT_DATA_AUTO;
        CHECK(mt_dataset_open(&ds, path, fmt, 300) == MT_OK, "%s: %s", path, mt_error_message());
        CHECK(ds.format == MT_DATA_MEGATRON && ds.token_bytes == 2, "megatron via %s", path);
        check_same_tokens(&ds, corpus, corpus_n);
        CHECK(ds.n_docs == 3, "3 documents, got %lld", (long long)ds.n_docs);
        for (int d = 0; d <= 3 && ds.n_docs == 3; d++)
            CHECK(ds.doc_start[d] == corpus_start[d], "doc_start[%d]", d);
        mt_dataset_close(&ds);
    }

    /* int32 tokens (dtype code 4), two sequences in one document. */
    unsigned char idx[34 + 24 + 16], bin[16];
    memcpy(idx, "MMIDIDX\0\0", 9);
    put64(idx + 9, 1);
    idx[17] = 4;
    put64(idx + 18, 2);
    put64(idx + 26, 2);
    put32(idx + 34, 3);
    put32(idx + 38, 1);
    put64(idx + 42, 0);
    put64(idx + 50, 12);
    put64(idx + 58, 0);
    put64(idx + 66, 2);
    const uint32_t vals[4] = {70000, 5, 256, 9};
    for (int i = 0; i < 4; i++)
        put32(bin + 4 * i, vals[i]);
    write_bytes(tmp("w.idx"), idx, sizeof idx);
    write_bytes(tmp("w.bin"), bin, sizeof bin);
    CHECK(mt_dataset_open(&ds, tmp("w"), MT_DATA_AUTO, 100000) == MT_OK, "%s", mt_error_message());
    int32_t got[4];
    if (ds.n_tokens == 4) {
        mt_dataset_read(&ds, 0, 4, got);
        CHECK(ds.token_bytes == 4 && got[0] == 70000 && got[3] == 9, "int32 tokens");
        CHECK(ds.n_docs == 1 && ds.doc_start[1] == 4, "one document of two sequences");
    }
    mt_dataset_close(&ds);
    EXPECT_OPEN_ERROR(tmp("w"), MT_DATA_AUTO, 65536, "w.bin: token 70000 at position 0 is >= vocab_size 65536");
    put32(bin, (uint32_t)-7);
    write_bytes(tmp("w.bin"), bin, sizeof bin);
    EXPECT_OPEN_ERROR(tmp("w"), MT_DATA_AUTO, 100, "w.bin: token -7 at position 0 is negative");
}

/* ------------------------------------------------------------------ errors */

static void test_llmc_errors(void)
{
    unsigned char f[1024 + 2 * 40];
    memset(f, 0, sizeof f);
    put32(f, 20240520);
    put32(f + 4, 1);
    put32(f + 8, 40);
    for (int i = 0; i < 40; i++)
        f[1024 + 2 * i] = (unsigned char)('a' + i % 26);
    const char *p = tmp("bad.bin");
    char want[1200];

    write_bytes(p, f, sizeof f);
    mt_dataset_t ds;
    CHECK(mt_dataset_open(&ds, p, MT_DATA_LLMC, 512) == MT_OK, "the good file: %s",
          mt_error_message());
    mt_dataset_close(&ds);

    write_bytes(p, f, sizeof f - 1);
    snprintf(want, sizeof want, "%s: truncated: header says 40 tokens (1104 bytes) but the file has 1103 bytes", p);
    EXPECT_OPEN_ERROR(p, MT_DATA_AUTO, 512, want);

    write_bytes(p, f, 100);
    snprintf(want, sizeof want, "%s: truncated: 100 bytes, shorter than the 1024-byte llm.c header", p);
    EXPECT_OPEN_ERROR(p, MT_DATA_LLMC, 512, want);

    unsigned char longer[sizeof f + 2];
    memcpy(longer, f, sizeof f);
    longer[sizeof f] = longer[sizeof f + 1] = 0;
    write_bytes(p, longer, sizeof longer);
    EXPECT_OPEN_ERROR(p, MT_DATA_LLMC, 512, "size mismatch: header says 40 tokens (1104 bytes) but the file has 1106 bytes");

    put32(f, 123);
    write_bytes(p, f, sizeof f);
    snprintf(want, sizeof want, "%s: not an llm.c token file (magic 123, expected 20240520)", p);
    EXPECT_OPEN_ERROR(p, MT_DATA_AUTO, 512, want);
    EXPECT_OPEN_ERROR(p, MT_DATA_LLMC, 512, want);

    put32(f, 20240520);
    put32(f + 4, 2);
    write_bytes(p, f, sizeof f);
    EXPECT_OPEN_ERROR(p, MT_DATA_AUTO, 512, "bad.bin: llm.c token file version 2 is not supported (expected 1");

    put32(f + 4, 1);
    f[1024 + 2 * 17] = 600 & 0xff;
    f[1024 + 2 * 17 + 1] = 600 >> 8;
    write_bytes(p, f, sizeof f);
    snprintf(want, sizeof want, "%s: token 600 at position 17 is >= vocab_size 512", p);
    EXPECT_OPEN_ERROR(p, MT_DATA_AUTO, 512, want);
    CHECK_CONTAINS(mt_error_hint_text(), "vocab_size");
    CHECK(mt_dataset_open(&ds, p, MT_DATA_AUTO, 601) == MT_OK, "600 < 601");
    mt_dataset_close(&ds);

    /* Missing files. */
    snprintf(want, sizeof want, "%s: cannot open dataset: No such file or directory", tmp("none.bin"));
    EXPECT_OPEN_ERROR(tmp("none.bin"), MT_DATA_AUTO, 512, want);
    CHECK_CONTAINS(mt_error_hint_text(), "meshtrain-data");
    EXPECT_OPEN_ERROR(tmp("none.bin"), MT_DATA_LLMC, 512, "none.bin: cannot open llm.c token file: No such file");
    EXPECT_OPEN_ERROR(mt_test_dir, MT_DATA_AUTO, 512, "not a regular file");
    EXPECT_OPEN_ERROR(tmp("empty"), MT_DATA_AUTO, 512, "no Megatron-LM index");
    write_bytes(tmp("tiny"), "ab", 2);
    EXPECT_OPEN_ERROR(tmp("tiny"), MT_DATA_AUTO, 512, "tiny: not an llm.c token file (2 bytes");
}

/* A valid two-document Megatron dataset to corrupt: sequences of 3 and 2
 * uint16 tokens. */
static unsigned char good_idx[34 + 24 + 24];
static unsigned char good_bin[10];

static void make_good_megatron(void)
{
    unsigned char *b = good_idx;
    memcpy(b, "MMIDIDX\0\0", 9);
    put64(b + 9, 1);
    b[17] = 8;
    put64(b + 18, 2);
    put64(b + 26, 3);
    put32(b + 34, 3);
    put32(b + 38, 2);
    put64(b + 42, 0);
    put64(b + 50, 6);
    put64(b + 58, 0);
    put64(b + 66, 1);
    put64(b + 74, 2);
    for (int i = 0; i < 5; i++)
        good_bin[2 * i] = (unsigned char)(10 + i);
}

static void expect_megatron_error(const unsigned char *idx, size_t idx_len, size_t bin_len,
                                  const char *needle)
{
    write_bytes(tmp("e.idx"), idx, idx_len);
    write_bytes(tmp("e.bin"), good_bin, bin_len);
    EXPECT_OPEN_ERROR(tmp("e"), MT_DATA_AUTO, 512, needle);
}

static void test_megatron_errors(void)
{
    make_good_megatron();
    unsigned char b[sizeof good_idx + 8];
    mt_dataset_t ds;
    char want[1200];
    write_bytes(tmp("e.idx"), good_idx, sizeof good_idx);
    write_bytes(tmp("e.bin"), good_bin, sizeof good_bin);
    CHECK(mt_dataset_open(&ds, tmp("e"), MT_DATA_MEGATRON, 512) == MT_OK, "good: %s",
          mt_error_message());
    CHECK(ds.n_docs == 2 && ds.doc_start[1] == 3 && ds.doc_start[2] == 5, "two documents");
    mt_dataset_close(&ds);

    snprintf(want, sizeof want, "%s: truncated: header says 2 sequences and 3 document indices "
             "(82 bytes) but the file has 81 bytes", tmp("e.idx"));
    expect_megatron_error(good_idx, sizeof good_idx - 1, sizeof good_bin, want);
    expect_megatron_error(good_idx, 20, sizeof good_bin, "e.idx: truncated: 20 bytes, shorter than the 34-byte index header");
    memcpy(b, good_idx, sizeof good_idx);
    memset(b + sizeof good_idx, 0, 2);
    expect_megatron_error(b, sizeof good_idx + 2, sizeof good_bin, "e.idx: size mismatch: header says 2 sequences");

    snprintf(want, sizeof want, "%s: truncated: %s describes 5 tokens (10 bytes) but the file "
             "has 9 bytes", tmp("e.bin"), tmp("e.idx"));
    expect_megatron_error(good_idx, sizeof good_idx, sizeof good_bin - 1, want);
    expect_megatron_error(good_idx, sizeof good_idx, 0, "e.bin: truncated");

    memcpy(b, good_idx, sizeof good_idx);
    b[17] = 7;
    expect_megatron_error(b, sizeof good_idx, sizeof good_bin, "e.idx: dtype code 7 (float32) is not a token type: meshtrain reads uint16 (code 8) and int32 (code 4)");
    b[17] = 42;
    expect_megatron_error(b, sizeof good_idx, sizeof good_bin, "e.idx: unknown dtype code 42");

    memcpy(b, good_idx, sizeof good_idx);
    b[9] = 2;
    expect_megatron_error(b, sizeof good_idx, sizeof good_bin, "e.idx: Megatron index version 2 is not supported (expected 1)");

    memcpy(b, good_idx, sizeof good_idx);
    b[0] = 'X';
    expect_megatron_error(b, sizeof good_idx, sizeof good_bin, "e.idx: not a Megatron-LM index (magic \"XMIDIDX\\x00\\x00\"");

    memcpy(b, good_idx, sizeof good_idx);
    put64(b + 50, 8);
    expect_megatron_error(b, sizeof good_idx, sizeof good_bin, "e.idx: sequence 1 starts at byte 8 but the sequences before it end at byte 6");

    memcpy(b, good_idx, sizeof good_idx);
    put32(b + 38, (uint32_t)-1);
    expect_megatron_error(b, sizeof good_idx, sizeof good_bin, "e.idx: sequence 1 has negative size -1");

    memcpy(b, good_idx, sizeof good_idx);
    put64(b + 74, 1);
    expect_megatron_error(b, sizeof good_idx, sizeof good_bin, "e.idx: the document index ends at sequence 1, expected the sequence count 2");
    put64(b + 66, 5);
    expect_megatron_error(b, sizeof good_idx, sizeof good_bin, "e.idx: document index entry 1 is 5");

    unsigned char bad_bin[sizeof good_bin];
    memcpy(bad_bin, good_bin, sizeof bad_bin);
    bad_bin[7] = 2; /* token 3 becomes 13 + 512 */
    write_bytes(tmp("e.idx"), good_idx, sizeof good_idx);
    write_bytes(tmp("e.bin"), bad_bin, sizeof bad_bin);
    EXPECT_OPEN_ERROR(tmp("e"), MT_DATA_AUTO, 512, "e.bin: token 525 at position 3 is >= vocab_size 512");

    /* Misnamed and missing pieces. */
    write_bytes(tmp("e.bin"), good_bin, sizeof good_bin);
    write_bytes(tmp("index.dat"), good_idx, sizeof good_idx);
    EXPECT_OPEN_ERROR(tmp("index.dat"), MT_DATA_AUTO, 512, "index.dat: a Megatron-LM index, but its name does not end in .idx");
    EXPECT_OPEN_ERROR(tmp("e.idx"), MT_DATA_LLMC, 512, "e.idx: not an llm.c token file (it is a Megatron-LM index)");
    write_bytes(tmp("lone.idx"), good_idx, sizeof good_idx);
    snprintf(want, sizeof want, "%s: cannot open Megatron data file: No such file", tmp("lone.bin"));
    EXPECT_OPEN_ERROR(tmp("lone"), MT_DATA_AUTO, 512, want);
    EXPECT_OPEN_ERROR(tmp("lone.idx"), MT_DATA_AUTO, 512, want);
    EXPECT_OPEN_ERROR(tmp("nothing"), MT_DATA_MEGATRON, 512, "nothing.idx: cannot open Megatron index: No such file");
    /* A .bin that is neither llm.c nor next to an .idx. */
    write_bytes(tmp("orphan.bin"), good_bin, sizeof good_bin);
    EXPECT_OPEN_ERROR(tmp("orphan.bin"), MT_DATA_AUTO, 512, "orphan.bin: not an llm.c token file (magic 720906");

    CHECK(mt_write_megatron(tmp("x"), corpus, corpus_n, (int64_t[]){0, 5, 3, corpus_n}, 3) ==
          MT_ERR_RANGE, "decreasing document starts");
    CHECK_CONTAINS(mt_error_message(), "document 1 spans [5, 3)");
    CHECK(mt_write_megatron(tmp("x"), corpus, corpus_n, (int64_t[]){0, 5}, 1) == MT_ERR_RANGE,
          "starts must end at n");
}

/* ------------------------------------------------------------------ sampling */

/* tokens[p] = p, so a sample shows where it came from. */
static void make_counting(mt_dataset_t *ds, int64_t n)
{
    int32_t *t = malloc(sizeof *t * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)i;
    CHECK(mt_write_llmc(tmp("count.bin"), t, n) == MT_OK, "%s", mt_error_message());
    free(t);
    CHECK(mt_dataset_open(ds, tmp("count.bin"), MT_DATA_AUTO, 65536) == MT_OK, "%s",
          mt_error_message());
}

static void test_sampling_in_order(void)
{
    mt_dataset_t ds;
    make_counting(&ds, 1001);
    const int64_t S = 4;
    CHECK(mt_dataset_num_samples(&ds, S) == 250, "floor(1000 / 4)");
    CHECK(mt_dataset_num_samples(&ds, 1000) == 1 && mt_dataset_num_samples(&ds, 1001) == 0,
          "the last token is only a target");
    mt_sampler_t s = {.num_samples = 250, .seq_len = S, .shuffle = false, .seed = 1};
    CHECK(mt_sampler_index(&s, 0) == 0 && mt_sampler_index(&s, 249) == 249, "identity");
    CHECK(mt_sampler_index(&s, 250) == 0 && mt_sampler_index(&s, 523) == 23, "epochs roll over");

    /* G = 8, dp 2, local 2: rank d's block is 4 samples, 2 micro-steps. */
    const int64_t G = 8, dp = 2, L = 2;
    int32_t in[2 * 4], tg[2 * 4];
    int bad = 0;
    for (int64_t t = 0; t < 40; t++)
        for (int64_t d = 0; d < dp; d++)
            for (int64_t m = 0; m < 2; m++) {
                mt_data_fill_batch(&ds, &s, t, G, d, dp, m, L, in, tg);
                for (int64_t j = 0; j < L; j++) {
                    int64_t want = (t * G + d * 4 + m * L + j) % 250;
                    for (int64_t k = 0; k < S; k++)
                        bad += in[j * S + k] != want * S + k || tg[j * S + k] != want * S + k + 1;
                }
            }
    CHECK(bad == 0, "%d tokens differ from sample t*G + d*G/dp + m*L + j", bad);

    /* Spot values from the contract's formula, by hand. */
    mt_data_fill_batch(&ds, &s, 1, G, 1, dp, 1, L, in, tg);
    CHECK(in[0] == 14 * 4 && tg[3] == 14 * 4 + 4 && in[4] == 15 * 4, "step 1 rank 1 micro 1: "
          "samples 14, 15 (got inputs from %d)", (int)in[0]);
    mt_data_fill_batch(&ds, &s, 31, G, 0, dp, 0, L, in, tg);
    CHECK(in[0] == (248 * 4) && in[4] == 249 * 4, "step 31: samples 248, 249");
    mt_data_fill_batch(&ds, &s, 31, G, 1, dp, 0, L, in, tg);
    CHECK(in[0] == 2 * 4 && in[4] == 3 * 4 && tg[7] == 16,
          "step 31 rank 1: counts 252, 253 are the next epoch's samples 2, 3");
    mt_dataset_close(&ds);
}

static int is_permutation(const mt_sampler_t *s, int64_t epoch, int64_t *first)
{
    int64_t n = s->num_samples;
    unsigned char *seen = calloc((size_t)n, 1);
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        int64_t x = mt_sampler_index(s, epoch * n + i);
        if (x < 0 || x >= n || seen[x]++)
            ok = 0;
        if (i < 8)
            first[i] = x;
    }
    free(seen);
    return ok;
}

static void test_sampling_shuffled(void)
{
    const int64_t sizes[] = {1, 2, 3, 7, 100, 255, 256, 257, 1000, 4097, 65536 + 3};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int64_t n = sizes[k], a[8], b[8], c[8], a2[8];
        mt_sampler_t s = {.num_samples = n, .seq_len = 4, .shuffle = true, .seed = 1234};
        mt_sampler_t t = s, u = s;
        t.seed = 1235;
        CHECK(is_permutation(&s, 0, a), "n=%lld epoch 0 is a permutation", (long long)n);
        CHECK(is_permutation(&s, 1, b), "n=%lld epoch 1 is a permutation", (long long)n);
        CHECK(is_permutation(&t, 0, c), "n=%lld seed 1235 is a permutation", (long long)n);
        CHECK(is_permutation(&u, 0, a2), "same seed again");
        int m = n < 8 ? (int)n : 8;
        CHECK(memcmp(a, a2, sizeof *a * (size_t)m) == 0, "n=%lld: same seed, same order",
              (long long)n);
        if (n >= 100) {
            int same_epoch = memcmp(a, b, sizeof a) == 0, same_seed = memcmp(a, c, sizeof a) == 0;
            int identity = 1;
            for (int i = 0; i < 8; i++)
                identity &= a[i] == i;
            CHECK(!same_epoch && !same_seed && !identity,
                  "n=%lld: epochs and seeds give different orders", (long long)n);
        }
    }
    /* Pinned values: the order must not change across platforms or
     * releases (doc/data.md gives the algorithm). */
    mt_sampler_t s = {.num_samples = 1000, .seq_len = 8, .shuffle = true, .seed = 1234};
    const int64_t golden[8] = {977, 140, 723, 258, 667, 456, 771, 716};
    for (int i = 0; i < 8; i++)
        CHECK(mt_sampler_index(&s, i) == golden[i], "golden[%d]: got %lld", i,
              (long long)mt_sampler_index(&s, i));

    /* Huge datasets: indices stay in range and distinct. */
    mt_sampler_t h = {.num_samples = INT64_C(1) << 40, .seq_len = 1, .shuffle = true, .seed = 7};
    int64_t seen[64];
    int ok = 1;
    for (int i = 0; i < 64; i++) {
        seen[i] = mt_sampler_index(&h, (INT64_C(1) << 40) * 3 + i);
        ok &= seen[i] >= 0 && seen[i] < h.num_samples;
        for (int j = 0; j < i; j++)
            ok &= seen[j] != seen[i];
    }
    CHECK(ok, "2^40 samples: in range and distinct");
    mt_sampler_t g = {.num_samples = INT64_MAX / 2, .seq_len = 1, .shuffle = true, .seed = 7};
    CHECK(mt_sampler_index(&g, INT64_MAX - 1) < g.num_samples, "largest counts");

    /* A shuffled batch holds the permuted samples. */
    mt_dataset_t ds;
    make_counting(&ds, 1001);
    mt_sampler_t p = {.num_samples = 250, .seq_len = 4, .shuffle = true, .seed = 99};
    int32_t in[3 * 4], tg[3 * 4];
    mt_data_fill_batch(&ds, &p, 5, 12, 2, 4, 0, 3, in, tg);
    int bad = 0;
    for (int j = 0; j < 3; j++) {
        int64_t i = mt_sampler_index(&p, 5 * 12 + 2 * 3 + j);
        for (int k = 0; k < 4; k++)
            bad += in[j * 4 + k] != i * 4 + k || tg[j * 4 + k] != i * 4 + k + 1;
    }
    CHECK(bad == 0, "shuffled batch contents");
    mt_dataset_close(&ds);
}

int main(void)
{
    if (mt_test_dir_make("data") != 0)
        return 99;
    make_corpus();
    test_tokenizer();
    test_llmc_roundtrip();
    test_megatron_roundtrip();
    test_llmc_errors();
    test_megatron_errors();
    test_sampling_in_order();
    test_sampling_shuffled();
    mt_test_dir_remove();
    return mt_test_exit("test_data");
}
