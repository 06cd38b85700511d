/* test_pack.c: packed sequences (src/data/pack.c).  A Megatron file of
 * documents with known lengths and contents is packed; every packable
 * token must appear exactly once, in document order within its piece,
 * rows hold exactly S tokens, pieces are at most S long, the first-fit rule
 * holds, targets are the next token of the same document (ignored at a
 * document's end and on padding), positions restart per document,
 * doc_start points at the document's first token, and the packing depends
 * only on the seed. */
#include <config.h>

#include "mt_pack.h"
#include "mt_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* document d, token i: a value that names both (all < 32768) */
static int32_t tok(int64_t d, int64_t i) { return (int32_t)((d * 131 + i * 7) % 30000); }

static const int64_t lens[] = {5, 40, 1, 17, 64, 3, 100, 2, 31, 31, 9, 150, 12, 1, 48, 20, 7};
#define ND ((int64_t)(sizeof lens / sizeof lens[0]))

static void check_packing(const mt_dataset_t *ds, int64_t S, bool shuffle, uint64_t seed)
{
    mt_packing_t pk;
    if (mt_pack_init(&pk, ds, S, shuffle, seed) != MT_OK) {
        CHECK(0, "pack S=%lld: %s", (long long)S, mt_error_message());
        return;
    }
    int64_t expect_tokens = 0;
    for (int64_t d = 0; d < ND; d++)
        for (int64_t a = 0; a < lens[d]; a += S)
            expect_tokens += lens[d] - a >= 2 ? (lens[d] - a < S ? lens[d] - a : S) : 0;
    CHECK(pk.tokens == expect_tokens, "S=%lld: %lld tokens packed, expected %lld", (long long)S,
          (long long)pk.tokens, (long long)expect_tokens);

    int32_t *in = malloc(sizeof(int32_t) * (size_t)S), *tg = malloc(sizeof(int32_t) * (size_t)S);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)S), *ds_ = malloc(sizeof(int32_t) * (size_t)S);
    char *seen = calloc((size_t)ds->n_tokens, 1);
    int64_t counted = 0, targets = 0;
    for (int64_t r = 0; r < pk.rows; r++) {
        int64_t used = 0;
        for (int64_t k = pk.row_seg[r]; k < pk.row_seg[r + 1]; k++) {
            CHECK(pk.seg_len[k] >= 2 && pk.seg_len[k] <= S, "piece length %d", pk.seg_len[k]);
            for (int64_t i = 0; i < pk.seg_len[k]; i++)
                seen[pk.seg_start[k] + i]++;
            used += pk.seg_len[k];
        }
        CHECK(used <= S, "row %lld holds %lld > %lld tokens", (long long)r, (long long)used,
              (long long)S);
        mt_pack_fill_row(&pk, ds, r, in, tg, pos, ds_);
        for (int64_t t = 0; t < S; t++) {
            bool first = t == 0 || ds_[t] != ds_[t - 1];
            CHECK(ds_[t] <= t && (first ? ds_[t] == t : ds_[t] == ds_[t - 1]),
                  "row %lld token %lld: doc_start %d", (long long)r, (long long)t, ds_[t]);
            CHECK(pos[t] == t - ds_[t], "row %lld token %lld: position %d, doc start %d",
                  (long long)r, (long long)t, pos[t], ds_[t]);
            bool last = t + 1 == S || ds_[t + 1] != ds_[t];
            if (t < used) {
                CHECK(last ? tg[t] == MT_IGNORE_INDEX : tg[t] == in[t + 1],
                      "row %lld token %lld: target %d", (long long)r, (long long)t, tg[t]);
            } else {
                CHECK(tg[t] == MT_IGNORE_INDEX, "padding target %d", tg[t]);
            }
            targets += tg[t] != MT_IGNORE_INDEX;
        }
        counted += used;
    }
    CHECK(counted == pk.tokens, "rows hold %lld tokens, packing says %lld", (long long)counted,
          (long long)pk.tokens);
    /* every token of a packable piece exactly once; the others never */
    int64_t off = 0;
    for (int64_t d = 0; d < ND; d++) {
        for (int64_t i = 0; i < lens[d]; i++) {
            int64_t piece = lens[d] - i / S * S;
            bool packable = piece >= 2 || i % S != 0;
            CHECK(seen[off + i] == (packable ? 1 : 0), "doc %lld token %lld seen %d times",
                  (long long)d, (long long)i, seen[off + i]);
        }
        off += lens[d];
    }
    CHECK(targets == pk.tokens - pk.pieces, "one target per token but each piece's last");
    free(in), free(tg), free(pos), free(ds_), free(seen);
    mt_pack_free(&pk);
}

/* First fit: without shuffle the pieces go, in document order, into the
 * oldest row with room. */
static void check_first_fit(const mt_dataset_t *ds)
{
    mt_packing_t pk;
    const int64_t S = 64;
    if (mt_pack_init(&pk, ds, S, false, 0) != MT_OK) {
        CHECK(0, "pack: %s", mt_error_message());
        return;
    }
    /* replay: rows' room, pieces in order */
    int64_t room[64], rows = 0, k = 0;
    int64_t *where = malloc(sizeof(int64_t) * (size_t)pk.pieces);
    for (int64_t r = 0; r < pk.rows; r++)
        for (int64_t j = pk.row_seg[r]; j < pk.row_seg[r + 1]; j++)
            where[j] = r;
    /* pieces in packing order are sorted by data offset (no shuffle) */
    int64_t *order = malloc(sizeof(int64_t) * (size_t)pk.pieces);
    for (int64_t j = 0; j < pk.pieces; j++)
        order[j] = j;
    for (int64_t a = 1; a < pk.pieces; a++) /* insertion sort by seg_start */
        for (int64_t b = a; b > 0 && pk.seg_start[order[b - 1]] > pk.seg_start[order[b]]; b--) {
            int64_t t = order[b];
            order[b] = order[b - 1], order[b - 1] = t;
        }
    for (; k < pk.pieces; k++) {
        int64_t j = order[k], len = pk.seg_len[j], r = 0;
        while (r < rows && room[r] < len)
            r++;
        if (r == rows)
            room[rows++] = S;
        CHECK(where[j] == r, "piece at %lld (length %lld) in row %lld, first fit says %lld",
              (long long)pk.seg_start[j], (long long)len, (long long)where[j], (long long)r);
        room[r] -= len;
    }
    CHECK(rows == pk.rows, "%lld rows, first fit makes %lld", (long long)pk.rows, (long long)rows);
    free(where), free(order);
    mt_pack_free(&pk);
}

static void check_seed(const mt_dataset_t *ds)
{
    mt_packing_t a, b, c;
    mt_pack_init(&a, ds, 48, true, 5);
    mt_pack_init(&b, ds, 48, true, 5);
    mt_pack_init(&c, ds, 48, true, 6);
    CHECK(a.pieces == b.pieces && memcmp(a.seg_start, b.seg_start, sizeof(int64_t) * (size_t)a.pieces) == 0 &&
              memcmp(a.row_seg, b.row_seg, sizeof(int64_t) * (size_t)(a.rows + 1)) == 0,
          "same seed, same packing");
    CHECK(c.pieces == a.pieces && memcmp(a.seg_start, c.seg_start, sizeof(int64_t) * (size_t)a.pieces) != 0,
          "another seed, another order");
    mt_pack_free(&a), mt_pack_free(&b), mt_pack_free(&c);
}

int main(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/meshtrain-test-pack.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir))
        return 99;
    int64_t n = 0, starts[ND + 1];
    for (int64_t d = 0; d < ND; d++)
        starts[d] = n, n += lens[d];
    starts[ND] = n;
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t d = 0; d < ND; d++)
        for (int64_t i = 0; i < lens[d]; i++)
            tokens[starts[d] + i] = tok(d, i);
    char prefix[600], path[640];
    snprintf(prefix, sizeof prefix, "%s/docs", dir);
    mt_dataset_t ds;
    if (mt_write_megatron(prefix, tokens, n, starts, ND) != MT_OK ||
        mt_dataset_open(&ds, prefix, MT_DATA_AUTO, 32768) != MT_OK) {
        fprintf(stderr, "test data: %s\n", mt_error_message());
        return 99;
    }
    CHECK(ds.n_docs == ND, "%lld documents", (long long)ds.n_docs);
    for (int64_t S = 2; S <= 160; S = S < 16 ? S + 3 : S * 2)
        for (int sh = 0; sh < 2; sh++)
            check_packing(&ds, S, sh, 11);
    check_first_fit(&ds);
    check_seed(&ds);
    mt_packing_t pk;
    CHECK(mt_pack_init(&pk, &ds, 1, false, 0) != MT_OK, "S = 1 refused");
    mt_dataset_close(&ds);
    snprintf(path, sizeof path, "%s.bin", prefix);
    unlink(path);
    snprintf(path, sizeof path, "%s.idx", prefix);
    unlink(path);
    rmdir(dir);
    free(tokens);
    return mt_test_exit("test_pack");
}
