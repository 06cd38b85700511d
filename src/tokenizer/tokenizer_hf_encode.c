/* tokenizer_hf_encode.c: text to ids with a tokenizer.json, in the Rust
 * library's order: repair invalid UTF-8; split out the added tokens that
 * are not normalized; normalize each section between them; split out the
 * normalized added tokens; pre-tokenize; BPE each piece; wrap in the
 * post-processor's ids.  All state of a call is on its own stack/heap, so
 * calls on one tokenizer may run concurrently. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer_hf.h"

/* Order: first byte ascending, then the longest first (leftmost-longest
 * matching tries the candidates of a position in this order). */
static bool added_before(const hf_added *a, const hf_added *b)
{
    unsigned char fa = (unsigned char)a->match[0], fb = (unsigned char)b->match[0];
    return fa != fb ? fa < fb : a->mlen > b->mlen;
}

mt_status_t hf_added_index(struct mt_hftok *h)
{
    hf_scratch sc = {0};
    hf_buf nb = {0};
    mt_status_t st = MT_OK;
    size_t count[2] = {0, 0};
    for (size_t i = 0; st == MT_OK && i < h->nadded; i++) {
        hf_added *t = &h->added[i];
        t->match = t->content;
        t->mlen = t->len;
        if (t->normalized && h->norm) {
            st = hf_norm_apply(h->norm, t->content, t->len, &sc, &nb);
            if (st == MT_OK && nb.n > 0) {
                t->match = malloc(nb.n + 1);
                if (!t->match) {
                    t->match = t->content;
                    st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "tokenizer: out of memory");
                } else {
                    memcpy(t->match, nb.s, nb.n + 1);
                    t->mlen = nb.n;
                }
            }
        }
        count[t->normalized]++; /* normalized tokens are matched after normalizing, even with none */
    }
    hf_buf_free(&nb);
    hf_scratch_free(&sc);
    MT_TRY(st);
    for (int s = 0; s < 2; s++) {
        h->aidx[s] = malloc((count[s] + 1) * sizeof *h->aidx[s]);
        if (!h->aidx[s])
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        size_t k = 0;
        for (size_t i = 0; i < h->nadded; i++)
            if (h->added[i].normalized == (s == 1))
                h->aidx[s][k++] = (int32_t)i;
        for (size_t i = 1; i < k; i++) { /* insertion sort: a stable order, no context */
            int32_t x = h->aidx[s][i];
            size_t j = i;
            for (; j > 0 && added_before(&h->added[x], &h->added[h->aidx[s][j - 1]]); j--)
                h->aidx[s][j] = h->aidx[s][j - 1];
            h->aidx[s][j] = x;
        }
        memset(h->abeg[s], 0, sizeof h->abeg[s]);
        for (size_t i = 0; i < k; i++)
            h->abeg[s][(unsigned char)h->added[h->aidx[s][i]].match[0] + 1]++;
        for (int b = 0; b < 256; b++)
            h->abeg[s][b + 1] += h->abeg[s][b];
    }
    return MT_OK;
}

/* The Rust regex crate's \w, which single_word tests: letters, marks,
 * decimal and letter numbers, connector punctuation, ZWNJ and ZWJ. */
static bool is_word_char(int32_t cp)
{
    if (cp < 0x80)
        return cp == '_' || (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    if (cp == 0x200C || cp == 0x200D)
        return true;
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_ME) || c == UTF8PROC_CATEGORY_ND ||
           c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}

/* The character ending right before position i. */
static int32_t char_before(const char *s, size_t i)
{
    size_t c = i - 1;
    while (c > 0 && ((unsigned char)s[c] & 0xC0) == 0x80)
        c--;
    int32_t cp;
    hf_utf8_next(s + c, i - c, &cp);
    return cp;
}

/* Find the next added token of set `set` in s[from..n): its index in
 * added, and [*a, *b) the bytes it takes (with lstrip/rstrip whitespace). */
static int32_t find_added(const struct mt_hftok *h, int set, const char *s, size_t n,
                          size_t from, size_t floor, size_t *a, size_t *b)
{
    const uint32_t *beg = h->abeg[set];
    if (beg[256] == 0)
        return -1;
    for (size_t i = from; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        for (uint32_t k = beg[c]; k < beg[c + 1]; k++) {
            const hf_added *t = &h->added[h->aidx[set][k]];
            if (t->mlen > n - i || memcmp(s + i, t->match, t->mlen) != 0)
                continue;
            size_t end = i + t->mlen;
            if (t->single_word) {
                int32_t cp;
                bool lw = i > 0 && is_word_char(char_before(s, i));
                bool rw = end < n && (hf_utf8_next(s + end, n - end, &cp), is_word_char(cp));
                if (lw || rw) {
                    i = end - 1; /* the match is consumed, as aho-corasick's find_iter does */
                    break;
                }
            }
            size_t st = i;
            if (t->lstrip)
                while (st > floor && hf_is_whitespace(char_before(s, st))) {
                    int32_t cp = char_before(s, st);
                    st -= cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
                }
            if (t->rstrip)
                while (end < n) {
                    int32_t cp;
                    int l = hf_utf8_next(s + end, n - end, &cp);
                    if (!hf_is_whitespace(cp))
                        break;
                    end += (size_t)l;
                }
            *a = st;
            *b = end;
            return h->aidx[set][k];
        }
    }
    return -1;
}

/* The word cache: natural text repeats its words, and a piece met before
 * needs no merging.  It belongs to one call (the tokenizer stays
 * read-only), so only a long text gets one; short pieces with few ids
 * only, in a direct-mapped table where a new piece replaces an old one. */
enum { CACHE_SLOTS = 2048, CACHE_KEY = 15, CACHE_IDS = 7, CACHE_MIN_TEXT = 4096 };

typedef struct {
    uint32_t hash;
    uint8_t klen, nids;
    char key[CACHE_KEY];
    int32_t ids[CACHE_IDS];
} cache_slot;

static uint32_t piece_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static mt_status_t encode_cached(const struct mt_hftok *h, const char *s, size_t n,
                                 hf_scratch *sc, mt_ids_t *ids)
{
    cache_slot *c = sc->cache;
    if (!c || n > CACHE_KEY)
        return hf_bpe_encode(&h->bpe, s, n, ids);
    uint32_t hs = piece_hash(s, n);
    cache_slot *e = &c[hs & (CACHE_SLOTS - 1)];
    if (e->klen == n && e->hash == hs && memcmp(e->key, s, n) == 0) {
        MT_TRY(mt_tok_grow((void **)&ids->v, &ids->cap, ids->n + e->nids, sizeof *ids->v));
        memcpy(ids->v + ids->n, e->ids, e->nids * sizeof *ids->v);
        ids->n += e->nids;
        return MT_OK;
    }
    size_t before = ids->n;
    MT_TRY(hf_bpe_encode(&h->bpe, s, n, ids));
    size_t k = ids->n - before;
    if (k <= CACHE_IDS) {
        e->hash = hs;
        e->klen = (uint8_t)n;
        e->nids = (uint8_t)k;
        memcpy(e->key, s, n);
        memcpy(e->ids, ids->v + before, k * sizeof *ids->v);
    }
    return MT_OK;
}

static mt_status_t encode_piece(const struct mt_hftok *h, const char *s, size_t n, bool first,
                                hf_scratch *sc, mt_ids_t *ids)
{
    if (!h->pretok)
        return hf_bpe_encode(&h->bpe, s, n, ids);
    hf_pieces *ps = &sc->a;
    hf_pieces_reset(ps);
    MT_TRY(hf_pieces_add(ps, s, n, first));
    MT_TRY(hf_pretok_apply(h->pretok, &ps, sc));
    for (size_t k = 0; k < ps->np; k++)
        MT_TRY(encode_cached(h, ps->buf.s + ps->p[k].off, ps->p[k].len, sc, ids));
    return MT_OK;
}

static mt_status_t encode_normalized(const struct mt_hftok *h, const char *s, size_t n,
                                     bool first, hf_scratch *sc, mt_ids_t *ids)
{
    size_t pos = 0, a, b;
    for (;;) {
        int32_t k = find_added(h, 1, s, n, pos, pos, &a, &b);
        size_t gap_end = k >= 0 ? a : n;
        if (gap_end > pos)
            MT_TRY(encode_piece(h, s + pos, gap_end - pos, first && pos == 0, sc, ids));
        if (k < 0)
            return MT_OK;
        MT_TRY(mt_ids_push(ids, h->added[k].id));
        pos = b;
    }
}

static mt_status_t encode_text(const struct mt_hftok *h, const char *s, size_t n, hf_scratch *sc,
                               hf_buf *nb, mt_ids_t *ids)
{
    size_t pos = 0, a, b;
    for (;;) {
        int32_t k = find_added(h, 0, s, n, pos, pos, &a, &b);
        size_t gap_end = k >= 0 ? a : n;
        if (gap_end > pos) {
            if (h->norm) {
                MT_TRY(hf_norm_apply(h->norm, s + pos, gap_end - pos, sc, nb));
                MT_TRY(encode_normalized(h, nb->s, nb->n, pos == 0, sc, ids));
            } else
                MT_TRY(encode_normalized(h, s + pos, gap_end - pos, pos == 0, sc, ids));
        }
        if (k < 0)
            return MT_OK;
        MT_TRY(mt_ids_push(ids, h->added[k].id));
        pos = b;
    }
}

mt_status_t hf_encode(const struct mt_hftok *h, const char *text, size_t len, bool add_special,
                      mt_ids_t *ids)
{
    hf_scratch sc = {0};
    hf_buf clean = {0}, nb = {0};
    mt_status_t st = MT_OK;
    const char *s = text;
    if (!hf_utf8_valid(text, len)) {
        st = hf_utf8_sanitize(text, len, &clean);
        s = clean.s;
        len = clean.n;
    }
    for (size_t i = 0; st == MT_OK && add_special && i < h->npre; i++)
        st = mt_ids_push(ids, h->pre[i]);
    if (st == MT_OK && len >= CACHE_MIN_TEXT && h->pretok &&
        !(sc.cache = calloc(CACHE_SLOTS, sizeof(cache_slot))))
        st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "tokenizer: out of memory");
    if (st == MT_OK)
        st = encode_text(h, s, len, &sc, &nb, ids);
    for (size_t i = 0; st == MT_OK && add_special && i < h->npost; i++)
        st = mt_ids_push(ids, h->post[i]);
    hf_buf_free(&clean);
    hf_buf_free(&nb);
    hf_scratch_free(&sc);
    return st;
}
