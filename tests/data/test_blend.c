/* test_blend.c: loss masks, concatenated token files and blends without
 * MPI: the mask format and one clear error per kind of bad mask file, masked
 * targets in plain and packed rows (the mask moves with its document),
 * concatenation (reads across files, document starts, masks of some
 * parts, mixed token widths refused), the dataset.paths parser, and the
 * blend's interleaving: deterministic, exact proportions per cycle, every
 * prefix within one draw of its share, each entry's draws numbered
 * 0, 1, 2, ... across cycles, and one entry equal to the plain sampler. */
#include <config.h>

#include "mt_blend.h"
#include "mt_test.h"
#include "mt_test_dir.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A mask file of n tokens: magic, count (count_delta off), bytes m. */
static void write_mask(const char *path, const unsigned char *m, int64_t n, int64_t count_delta,
                       const char *magic, size_t extra)
{
    unsigned char *b = calloc(1, 16 + (size_t)n + extra);
    memcpy(b, magic, 8);
    uint64_t c = (uint64_t)(n + count_delta);
    for (int i = 0; i < 8; i++)
        b[8 + i] = (unsigned char)(c >> 8 * i);
    memcpy(b + 16, m, (size_t)n);
    write_bytes(path, b, 16 + (size_t)n + extra);
    free(b);
}

#define N 200
static int32_t tok[N];
static unsigned char msk[N];

/* Documents of 7..25 tokens ending in EOD; the mask: 0 on each document's
 * first 4 tokens ("the prompt"), 1 after. */
static void make_data(void)
{
    int64_t j = 0, len = 7, at = 0;
    for (; j < N; j++, at++) {
        tok[j] = (int32_t)((j * 37) % 250);
        msk[j] = at >= 4;
        if (at == len - 1 || j == N - 1) {
            tok[j] = MT_TOKEN_EOD;
            at = -1, len = 7 + (len * 5) % 19;
        }
    }
}

static void test_mask_format(void)
{
    mt_dataset_t ds;
    bool found;
    char p[1024];
    snprintf(p, sizeof p, "%s", tmp("a.bin"));
    CHECK(mt_write_llmc(p, tok, N) == MT_OK, "%s", mt_error_message());
    CHECK(mt_dataset_open(&ds, p, MT_DATA_AUTO, 512) == MT_OK, "%s", mt_error_message());
    /* none: auto goes on without, required refuses */
    CHECK(mt_dataset_open_mask(&ds, MT_LOSS_MASK_AUTO, &found) == MT_OK && !found, "auto, none");
    CHECK(mt_dataset_open_mask(&ds, MT_LOSS_MASK_REQUIRED, &found) == MT_ERR_IO, "required");
    CHECK_CONTAINS(mt_error_message(), "a.bin.lossmask: cannot open the loss mask of");
    CHECK_CONTAINS(mt_error_hint_text(), "dataset.loss_mask is required");

    write_mask(tmp("a.bin.lossmask"), msk, N, 0, "MTLMASK1", 0);
    CHECK(mt_dataset_open_mask(&ds, MT_LOSS_MASK_OFF, &found) == MT_OK && !found && !ds.mask,
          "off ignores it");
    CHECK(mt_dataset_open_mask(&ds, MT_LOSS_MASK_AUTO, &found) == MT_OK && found, "%s",
          mt_error_message());
    unsigned char got[N];
    mt_dataset_read_mask(&ds, 0, N, got);
    CHECK(memcmp(got, msk, N) == 0, "mask bytes");
    /* plain samples: targets whose mask is 0 are ignored, inputs as they are */
    int32_t in[16], tg[16];
    int masked = 0;
    for (int64_t i = 0; i < mt_dataset_num_samples(&ds, 16); i++) {
        mt_data_fill_sample(&ds, i, 16, in, tg);
        for (int t = 0; t < 16; t++) {
            int64_t j = i * 16 + t;
            CHECK(in[t] == tok[j], "input %lld", (long long)j);
            int32_t want = msk[j + 1] ? tok[j + 1] : MT_IGNORE_INDEX;
            CHECK(tg[t] == want, "target of token %lld: %d, want %d", (long long)j, tg[t], want);
            masked += tg[t] == MT_IGNORE_INDEX;
        }
    }
    CHECK(masked > 20, "the mask excludes targets (%d)", masked);
    mt_dataset_close(&ds);
    CHECK(ds.mask == NULL && ds.mask_map == NULL, "close clears the mask");

    /* bad files, each named, with what is wrong */
    struct {
        int64_t delta;
        const char *magic;
        size_t extra;
        int cut;
        const char *needle;
    } bad[] = {
        {0, "MTLMASK2", 0, 0, "not a loss mask (expected the magic \"MTLMASK1\""},
        {1, "MTLMASK1", 0, 0, "the mask is for 201 tokens but"},
        {0, "MTLMASK1", 3, 0, "size mismatch: 200 tokens need 216 bytes but the file has 219"},
        {0, "MTLMASK1", 0, 5, "truncated: 200 tokens need 216 bytes but the file has 211"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_mask(tmp("a.bin.lossmask"), msk, N - bad[k].cut, bad[k].delta + bad[k].cut,
                   bad[k].magic, bad[k].extra);
        CHECK(mt_dataset_open(&ds, p, MT_DATA_AUTO, 512) == MT_OK, "%s", mt_error_message());
        CHECK(mt_dataset_open_mask(&ds, MT_LOSS_MASK_AUTO, &found) == MT_ERR_IO, "bad %zu", k);
        CHECK_CONTAINS(mt_error_message(), bad[k].needle);
        CHECK_CONTAINS(mt_error_message(), "a.bin.lossmask");
        CHECK(ds.mask == NULL, "nothing kept of a bad mask");
        mt_dataset_close(&ds);
    }
    unsigned char two[N];
    memcpy(two, msk, N);
    two[123] = 2;
    write_mask(tmp("a.bin.lossmask"), two, N, 0, "MTLMASK1", 0);
    CHECK(mt_dataset_open(&ds, p, MT_DATA_AUTO, 512) == MT_OK, "%s", mt_error_message());
    CHECK(mt_dataset_open_mask(&ds, MT_LOSS_MASK_AUTO, &found) == MT_ERR_IO, "byte 2");
    CHECK_CONTAINS(mt_error_message(), "a.bin.lossmask: byte 2 at offset 139 (token 123) is not 0 or 1");
    mt_dataset_close(&ds);
    write_mask(tmp("a.bin.lossmask"), msk, N, 0, "MTLMASK1", 0);

    /* Megatron: PREFIX.lossmask, however the dataset is named */
    int64_t starts[3] = {0, 90, N};
    CHECK(mt_write_megatron(tmp("m"), tok, N, starts, 2) == MT_OK, "%s", mt_error_message());
    write_mask(tmp("m.lossmask"), msk, N, 0, "MTLMASK1", 0);
    const char *names[] = {tmp("m"), tmp("m.bin"), tmp("m.idx")};
    for (int k = 0; k < 3; k++) {
        CHECK(mt_dataset_open(&ds, names[k], MT_DATA_AUTO, 512) == MT_OK, "%s",
              mt_error_message());
        CHECK(mt_dataset_open_mask(&ds, MT_LOSS_MASK_REQUIRED, &found) == MT_OK && found,
              "%s: %s", names[k], mt_error_message());
        mt_dataset_close(&ds);
    }
}

/* Packed rows: each target is masked by its own token's byte, wherever
 * the piece landed. */
static void test_pack_mask(void)
{
    mt_dataset_t ds;
    bool found;
    CHECK(mt_dataset_open(&ds, tmp("a.bin"), MT_DATA_AUTO, 512) == MT_OK, "%s", mt_error_message());
    CHECK(mt_dataset_open_mask(&ds, MT_LOSS_MASK_AUTO, &found) == MT_OK && found, "mask");
    mt_packing_t pk;
    CHECK(mt_pack_init(&pk, &ds, 32, true, 5) == MT_OK, "%s", mt_error_message());
    int32_t in[32], tg[32], pos[32], doc[32];
    int64_t masked = 0, checked = 0;
    for (int64_t r = 0; r < pk.rows; r++) {
        mt_pack_fill_row(&pk, &ds, r, in, tg, pos, doc);
        int64_t t = 0;
        for (int64_t k = pk.row_seg[r]; k < pk.row_seg[r + 1]; k++) {
            for (int64_t i = 0; i < pk.seg_len[k]; i++, t++) {
                int64_t j = pk.seg_start[k] + i;
                int32_t want = i + 1 == pk.seg_len[k] ? MT_IGNORE_INDEX
                               : msk[j + 1]          ? tok[j + 1]
                                                     : MT_IGNORE_INDEX;
                CHECK(tg[t] == want, "row %lld slot %lld: %d, want %d", (long long)r,
                      (long long)t, tg[t], want);
                masked += i + 1 < pk.seg_len[k] && !msk[j + 1];
                checked++;
            }
        }
    }
    CHECK(checked == pk.tokens && masked > 20, "%lld tokens, %lld masked", (long long)checked,
          (long long)masked);
    mt_pack_free(&pk);
    mt_dataset_close(&ds);
}

static void test_concat(void)
{
    /* a.bin (masked) + b.bin (no mask) + c.bin (masked) = tok[0..200) + tok[0..120) + tok[0..50) */
    CHECK(mt_write_llmc(tmp("b.bin"), tok, 120) == MT_OK, "%s", mt_error_message());
    CHECK(mt_write_llmc(tmp("c.bin"), tok, 50) == MT_OK, "%s", mt_error_message());
    write_mask(tmp("c.bin.lossmask"), msk, 50, 0, "MTLMASK1", 0);
    const char *names[3] = {tmp("a.bin"), tmp("b.bin"), tmp("c.bin")};
    int64_t len[3] = {N, 120, 50};
    mt_dataset_t parts[3], ds;
    bool found;
    for (int k = 0; k < 3; k++) {
        CHECK(mt_dataset_open(&parts[k], names[k], MT_DATA_AUTO, 512) == MT_OK, "%s",
              mt_error_message());
        CHECK(mt_dataset_open_mask(&parts[k], MT_LOSS_MASK_AUTO, &found) == MT_OK, "%s",
              mt_error_message());
    }
    int64_t docs0 = parts[0].n_docs + parts[1].n_docs + parts[2].n_docs;
    CHECK(mt_dataset_concat(&ds, parts, 3) == MT_OK, "%s", mt_error_message());
    CHECK(ds.n_tokens == N + 120 + 50 && ds.n_parts == 3, "%lld tokens", (long long)ds.n_tokens);
    CHECK(ds.n_docs == docs0 && ds.doc_start[ds.n_docs] == ds.n_tokens, "documents");
    CHECK(mt_dataset_masked_parts(&ds) == 2, "two of three files masked");
    /* every read, across file boundaries */
    int32_t all[N + 170], got[N + 170];
    unsigned char mall[N + 170], mgot[N + 170];
    int64_t at = 0;
    for (int k = 0; k < 3; k++)
        for (int64_t j = 0; j < len[k]; j++, at++) {
            all[at] = tok[j];
            mall[at] = k == 1 ? 1 : msk[j];
        }
    bool same = true;
    for (int64_t a = 0; a < ds.n_tokens && same; a += 13)
        for (int64_t n = 0; a + n <= ds.n_tokens && n < 140 && same; n += 29) {
            mt_dataset_read(&ds, a, n, got);
            mt_dataset_read_mask(&ds, a, n, mgot);
            same = !memcmp(got, all + a, sizeof *got * (size_t)n) && !memcmp(mgot, mall + a, (size_t)n);
        }
    CHECK(same, "reads across files");
    /* b's last document does not run into c: a document starts at c */
    bool boundary = false;
    for (int64_t d = 0; d <= ds.n_docs; d++)
        boundary |= ds.doc_start[d] == N + 120;
    CHECK(boundary, "a file boundary is a document boundary");
    mt_dataset_close(&ds);

    /* an int32 Megatron file with a uint16 one: refused */
    unsigned char idx[34 + 12 + 16] = "MMIDIDX\0\0";
    idx[9] = 1, idx[17] = 4, idx[18] = 1, idx[26] = 2;
    idx[34] = 3;       /* one sequence of 3 tokens */
    idx[34 + 12 + 8] = 1; /* document index 0, 1 */
    write_bytes(tmp("w.idx"), idx, sizeof idx);
    int32_t three[3] = {1, 2, 3};
    write_bytes(tmp("w.bin"), three, sizeof three);
    CHECK(mt_dataset_open(&parts[0], tmp("a.bin"), MT_DATA_AUTO, 512) == MT_OK, "%s", mt_error_message());
    CHECK(mt_dataset_open(&parts[1], tmp("w"), MT_DATA_AUTO, 512) == MT_OK, "%s", mt_error_message());
    CHECK(parts[1].token_bytes == 4, "int32");
    CHECK(mt_dataset_concat(&ds, parts, 2) == MT_ERR_IO, "mixed widths");
    CHECK_CONTAINS(mt_error_message(), "w has 4-byte tokens but");
    CHECK_CONTAINS(mt_error_message(), "the same tokenizer");
    mt_dataset_close(&parts[0]);
    mt_dataset_close(&parts[1]);
}

static int parse(const char *const *items, int n, mt_blend_spec_t *s, char *why)
{
    static char buf[MT_DATA_MAX_PATHS + 1][MT_PATH_MAX];
    for (int i = 0; i < n; i++)
        snprintf(buf[i], MT_PATH_MAX, "%s", items[i]);
    return mt_blend_spec_parse((const char (*)[MT_PATH_MAX])buf, n, s, why, 512);
}

static void test_spec(void)
{
    mt_blend_spec_t s;
    char why[512];
    const char *plain[] = {"x", "y", "z"};
    CHECK(parse(plain, 3, &s, why) == -1 && s.n == 1 && !s.weighted && s.first[1] == 3 &&
          s.shard[2] == 2, "a plain list is one entry");
    const char *zipped[] = {"30", "a", "70", "b0", "b1", "0.5", "c"};
    CHECK(parse(zipped, 7, &s, why) == -1, "%s", why);
    CHECK(s.n == 3 && s.weighted && s.weight[0] == 30 && s.weight[2] == 0.5, "weights");
    CHECK(s.first[0] == 0 && s.first[1] == 1 && s.first[2] == 3 && s.first[3] == 4 &&
          s.shard[1] == 3 && s.shard[2] == 4 && s.shard[3] == 6, "shards");
    struct {
        const char *items[4];
        int n, at;
        const char *needle;
    } bad[] = {
        {{"-1", "a"}, 2, 0, "weight -1: a blend weight must be a positive number"},
        {{"1", "a", "0", "b"}, 4, 2, "weight 0: a blend weight must be a positive number"},
        {{"1", "a", "nan", "b"}, 4, 2, "weight nan"},
        {{"a", "1", "b"}, 3, 0, "a blend starts with a weight"},
        {{"1", "a", "2"}, 3, 2, "weight 2 is not followed by a path"},
        {{"1", "2", "a"}, 3, 0, "weight 1 is not followed by a path"},
        {{"1", ""}, 2, 1, "an empty path"},
        {{NULL}, 0, 0, "the list is empty"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int at = parse(bad[k].items, bad[k].n, &s, why);
        CHECK(at == bad[k].at, "bad %zu: at %d, want %d (%s)", k, at, bad[k].at, why);
        CHECK_CONTAINS(why, bad[k].needle);
    }
}

static void test_blend(void)
{
    static char paths[8][MT_PATH_MAX];
    snprintf(paths[0], MT_PATH_MAX, "0.3");
    snprintf(paths[1], MT_PATH_MAX, "%s", tmp("a.bin"));
    snprintf(paths[2], MT_PATH_MAX, "0.7");
    snprintf(paths[3], MT_PATH_MAX, "%s", tmp("b.bin"));
    snprintf(paths[4], MT_PATH_MAX, "%s", tmp("c.bin"));
    mt_blend_spec_t spec;
    char why[512];
    CHECK(mt_blend_spec_parse((const char (*)[MT_PATH_MAX])paths, 5, &spec, why, sizeof why) == -1,
          "%s", why);
    mt_blend_options_t o = {MT_DATA_AUTO, 512, 8, false, true, 11, MT_LOSS_MASK_AUTO};
    mt_blend_t b, b2;
    CHECK(mt_blend_open(&b, &spec, (const char (*)[MT_PATH_MAX])paths, &o) == MT_OK, "%s",
          mt_error_message());
    CHECK(mt_blend_open(&b2, &spec, (const char (*)[MT_PATH_MAX])paths, &o) == MT_OK, "%s",
          mt_error_message());
    CHECK(b.n == 2 && b.samples[0] == (N - 1) / 8 && b.samples[1] == (170 - 1) / 8, "samples");
    /* largest remainder: 0.3 x 65536 = 19660.8 */
    CHECK(b.per_cycle[0] == 19661 && b.per_cycle[1] == 45875, "per cycle %lld %lld",
          (long long)b.per_cycle[0], (long long)b.per_cycle[1]);
    CHECK(memcmp(b.cyc_entry, b2.cyc_entry, sizeof *b.cyc_entry * MT_BLEND_CYCLE) == 0 &&
          memcmp(b.cyc_k, b2.cyc_k, sizeof *b.cyc_k * MT_BLEND_CYCLE) == 0, "deterministic");
    /* every prefix within one draw of its share; draws numbered in order */
    int64_t taken[2] = {0, 0}, worst = 0;
    bool ordered = true;
    for (int64_t p = 0; p < MT_BLEND_CYCLE; p++) {
        int e = b.cyc_entry[p];
        ordered &= b.cyc_k[p] == taken[e];
        taken[e]++;
        for (int f = 0; f < 2; f++) {
            int64_t dev = llabs(taken[f] * MT_BLEND_CYCLE - b.per_cycle[f] * (p + 1));
            worst = dev > worst ? dev : worst;
        }
    }
    CHECK(ordered && taken[0] == 19661 && taken[1] == 45875, "one cycle: exact counts");
    CHECK(worst <= MT_BLEND_CYCLE, "every prefix within one draw of its share (%lld)",
          (long long)worst);
    /* over three cycles (and a part): entry e's k-th draw is its sampler's k */
    int64_t k[2] = {0, 0};
    bool same = true;
    for (int64_t c = 0; c < 3 * MT_BLEND_CYCLE + 1000; c += 1) {
        int e, e2;
        int64_t i, i2;
        mt_blend_sample(&b, c, &e, &i);
        mt_blend_sample(&b2, c, &e2, &i2);
        mt_sampler_t s = {b.samples[e], 8, true, 11 + (uint64_t)e};
        same &= e == e2 && i == i2 && i == mt_sampler_index(&s, k[e]++);
    }
    CHECK(same, "entries' samplers at their own draw counts");
    CHECK(mt_blend_draws(&b, 3 * MT_BLEND_CYCLE + 1000, 0) == k[0] &&
          mt_blend_draws(&b, 3 * MT_BLEND_CYCLE + 1000, 1) == k[1], "draw counts");
    /* a batch holds the masked targets of its entries */
    int32_t in[4 * 8], tg[4 * 8];
    mt_blend_fill_batch(&b, 3, 8, 1, 2, 0, 4, in, tg, NULL, NULL);
    for (int j = 0; j < 4; j++) {
        int e;
        int64_t i;
        int32_t win[8], wtg[8];
        mt_blend_sample(&b, 3 * 8 + 4 + j, &e, &i);
        mt_data_fill_sample(&b.ds[e], i, 8, win, wtg);
        CHECK(!memcmp(win, in + 8 * j, sizeof win) && !memcmp(wtg, tg + 8 * j, sizeof wtg),
              "row %d", j);
    }
    mt_blend_close(&b2);
    mt_blend_close(&b);

    /* one entry is the plain sampler, with the run's seed */
    spec.n = 1, spec.first[1] = 1, spec.weight[0] = 1;
    CHECK(mt_blend_open(&b, &spec, (const char (*)[MT_PATH_MAX])paths, &o) == MT_OK, "%s",
          mt_error_message());
    mt_sampler_t s = {b.samples[0], 8, true, 11};
    same = true;
    for (int64_t c = 0; c < 100; c++) {
        int e;
        int64_t i;
        mt_blend_sample(&b, c, &e, &i);
        same &= e == 0 && i == mt_sampler_index(&s, c);
    }
    CHECK(same, "one entry: the plain sampler");
    mt_blend_close(&b);

    /* a missing shard is named; required masks are required of every shard */
    snprintf(paths[4], MT_PATH_MAX, "%s", tmp("nope.bin"));
    spec.n = 2, spec.first[1] = 1, spec.first[2] = 3, spec.weight[0] = 1;
    CHECK(mt_blend_open(&b, &spec, (const char (*)[MT_PATH_MAX])paths, &o) == MT_ERR_IO, "missing");
    CHECK_CONTAINS(mt_error_message(), "nope.bin");
    snprintf(paths[4], MT_PATH_MAX, "%s", tmp("c.bin"));
    o.loss_mask = MT_LOSS_MASK_REQUIRED;
    CHECK(mt_blend_open(&b, &spec, (const char (*)[MT_PATH_MAX])paths, &o) == MT_ERR_IO, "required");
    CHECK_CONTAINS(mt_error_message(), "b.bin.lossmask: cannot open the loss mask");
    spec.weight[1] = -1;
    o.loss_mask = MT_LOSS_MASK_AUTO;
    CHECK(mt_blend_open(&b, &spec, (const char (*)[MT_PATH_MAX])paths, &o) == MT_ERR_CONFIG, "w<0");
    CHECK_CONTAINS(mt_error_message(), "weight -1 must be a positive number");
}

int main(void)
{
    if (mt_test_dir_make("blend") != 0)
        return 99;
    make_data();
    test_mask_format();
    test_pack_mask();
    test_concat();
    test_spec();
    test_blend();
    mt_test_dir_remove();
    return mt_test_exit("test_blend");
}
