/* tokenizer_hf_bpe.c: the BPE model of a tokenizer.json: the vocabulary,
 * the merges (as "a b" strings or ["a", "b"] pairs), and the merge of one
 * piece as the Rust library does it: characters (or their <0xNN> bytes,
 * or the unknown token) first, then always the lowest-ranked pair, the
 * leftmost among equals, kept in a binary heap so long pieces (a whole
 * Metaspace section) stay O(n log n).  Dropout is refused (training
 * randomness has no place in a data pipeline). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer_hf.h"

/* ---- the merge table: (left, right) -> (rank, merged id) ---- */

static uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

static bool merge_get(const hf_merges *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged)
{
    if (!m->slot)
        return false;
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t j = mix(k) & m->mask;
    while (m->slot[j].key) {
        if (m->slot[j].key == k) {
            *rank = m->slot[j].rank;
            *merged = m->slot[j].merged;
            return true;
        }
        j = (j + 1) & m->mask;
    }
    return false;
}

/* Insert; a pair listed twice keeps its first (lowest) rank. */
static void merge_put(hf_merges *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t j = mix(k) & m->mask;
    while (m->slot[j].key) {
        if (m->slot[j].key == k)
            return;
        j = (j + 1) & m->mask;
    }
    m->slot[j] = (hf_merge_slot){k, rank, merged};
}

void hf_bpe_free(hf_bpe *m)
{
    hf_strmap_free(&m->vocab);
    free(m->cp_id);
    free(m->merges.slot);
    free(m->prefix);
    free(m->suffix);
    memset(m, 0, sizeof *m);
}

static int32_t vocab_id(const hf_bpe *m, const char *s, size_t n)
{
    return hf_strmap_get(&m->vocab, s, n);
}

static mt_status_t opt_string(const json_t *j, const char *key, const char *file, char **out)
{
    const json_t *v = json_object_get(j, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return MT_OK;
    if (!json_is_string(v))
        MT_FAIL(MT_ERR_CONFIG, "%s: model: \"%s\" is not a string", file, key);
    if (!*json_string_value(v))
        return MT_OK; /* "" means none */
    if (!(*out = strdup(json_string_value(v))))
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    return MT_OK;
}

static mt_status_t parse_merges(hf_bpe *m, const json_t *a, const char *file)
{
    size_t n = json_array_size(a), cap = 64;
    while (cap < n * 2 + 2)
        cap *= 2;
    hf_merges *t = &m->merges;
    t->slot = calloc(cap, sizeof *t->slot);
    if (!t->slot)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory for %zu merges", n);
    t->mask = cap - 1;
    hf_buf both = {0};
    mt_status_t st = MT_OK;
    for (size_t i = 0; st == MT_OK && i < n; i++) {
        const json_t *e = json_array_get(a, i);
        const char *l = NULL, *r = NULL;
        size_t ln = 0, rn = 0;
        if (json_is_string(e)) {
            const char *s = json_string_value(e), *sp = strchr(s, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                l = s;
                ln = (size_t)(sp - s);
                r = sp + 1;
                rn = strlen(r);
            }
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            l = json_string_value(json_array_get(e, 0));
            ln = json_string_length(json_array_get(e, 0));
            r = json_string_value(json_array_get(e, 1));
            rn = json_string_length(json_array_get(e, 1));
        }
        if (!l) {
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", file, i);
            break;
        }
        int32_t li = vocab_id(m, l, ln), ri = vocab_id(m, r, rn);
        /* the merge of "a" and "##b" is "ab" under continuing_subword_prefix "##" */
        size_t pl = m->prefix ? strlen(m->prefix) : 0;
        bool strip = pl && rn >= pl && memcmp(r, m->prefix, pl) == 0;
        both.n = 0;
        st = hf_buf_add(&both, l, ln);
        if (st == MT_OK)
            st = hf_buf_add(&both, r + (strip ? pl : 0), rn - (strip ? pl : 0));
        int32_t mi = st == MT_OK ? vocab_id(m, both.s, both.n) : -1;
        if (st == MT_OK && (li < 0 || ri < 0 || mi < 0))
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: model.merges[%zu] (\"%.*s\" \"%.*s\"): %s is not in the "
                              "vocabulary", file, i, (int)ln, l, (int)rn, r,
                              li < 0 ? "the left part" : ri < 0 ? "the right part" : "the merge");
        if (st == MT_OK)
            merge_put(t, li, ri, (int32_t)i, mi);
    }
    hf_buf_free(&both);
    return st;
}

mt_status_t hf_bpe_parse(const void *json, const char *file, hf_bpe *m, int32_t *max_id)
{
    const json_t *j = json;
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    const json_t *dr = json_object_get(j, "dropout");
    if (dr && !json_is_null(dr) && !(json_is_number(dr) && json_number_value(dr) == 0.0))
        MT_FAIL(MT_ERR_UNSUPPORTED, "%s: model BPE with dropout is not supported", file);
    const json_t *v = json_object_get(j, "vocab"), *mg = json_object_get(j, "merges");
    if (!json_is_object(v))
        MT_FAIL(MT_ERR_CONFIG, "%s: model.vocab is not an object", file);
    if (!json_is_array(mg))
        MT_FAIL(MT_ERR_CONFIG, "%s: model.merges is not an array", file);
    m->cp_id = malloc(0x10000 * sizeof *m->cp_id);
    if (!m->cp_id)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    for (int i = 0; i < 0x10000; i++)
        m->cp_id[i] = -1;
    for (int i = 0; i < 256; i++)
        m->byte_id[i] = -1;
    const char *k;
    json_t *val;
    *max_id = -1;
    json_object_foreach((json_t *)v, k, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= INT32_MAX)
            MT_FAIL(MT_ERR_CONFIG, "%s: model.vocab[\"%s\"] is not an id", file, k);
        int32_t id = (int32_t)json_integer_value(val);
        size_t kn = strlen(k);
        if (!hf_utf8_valid(k, kn))
            MT_FAIL(MT_ERR_CONFIG, "%s: model.vocab: a token is not UTF-8", file);
        MT_TRY(hf_strmap_put(&m->vocab, k, kn, id));
        if (id > *max_id)
            *max_id = id;
        int32_t cp;
        if (kn && (size_t)hf_utf8_next(k, kn, &cp) == kn && cp < 0x10000)
            m->cp_id[cp] = id;
        unsigned x;
        char tail;
        if (kn == 6 && sscanf(k, "<0x%2X%c", &x, &tail) == 2 && tail == '>')
            m->byte_id[x] = id;
    }
    if (m->vocab.n == 0)
        MT_FAIL(MT_ERR_CONFIG, "%s: model.vocab is empty", file);
    m->fuse_unk = hf_json_bool(j, "fuse_unk", false);
    m->byte_fallback = hf_json_bool(j, "byte_fallback", false);
    m->ignore_merges = hf_json_bool(j, "ignore_merges", false);
    char *unk = NULL;
    MT_TRY(opt_string(j, "unk_token", file, &unk));
    if (unk) {
        m->unk_id = vocab_id(m, unk, strlen(unk));
        if (m->unk_id < 0) {
            mt_status_t st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                                          "%s: model.unk_token \"%s\" is not in the vocabulary",
                                          file, unk);
            free(unk);
            return st;
        }
        free(unk);
    }
    MT_TRY(opt_string(j, "continuing_subword_prefix", file, &m->prefix));
    MT_TRY(opt_string(j, "end_of_word_suffix", file, &m->suffix));
    return parse_merges(m, mg, file);
}

/* ---- the merge of one piece ---- */

typedef struct {
    int32_t id, prev, next;
    int32_t len; /* bytes of the piece it covers; 0 once merged away */
} sym_t;

typedef struct {
    int32_t rank, pos, merged;
} cand_t;

static bool cand_less(cand_t x, cand_t y)
{
    return x.rank != y.rank ? x.rank < y.rank : x.pos < y.pos;
}

static void heap_push(cand_t *h, size_t *n, cand_t c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(c, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand_t heap_pop(cand_t *h, size_t *n)
{
    cand_t top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        cand_t best = last;
        if (l < *n && cand_less(h[l], best)) {
            m = l;
            best = h[l];
        }
        if (r < *n && cand_less(h[r], best))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* One character as the model looks it up: with continuing_subword_prefix
 * unless first, end_of_word_suffix if last.  Returns its length in tmp, or
 * 0 when the character is used as is (no copy). */
static size_t char_token(const hf_bpe *m, const char *c, int k, bool first, bool last,
                         char *tmp, size_t cap)
{
    size_t pl = m->prefix && !first ? strlen(m->prefix) : 0;
    size_t sl = m->suffix && last ? strlen(m->suffix) : 0;
    if (pl + sl == 0 || pl + sl + (size_t)k > cap)
        return 0;
    memcpy(tmp, m->prefix, pl);
    memcpy(tmp + pl, c, (size_t)k);
    memcpy(tmp + pl + k, m->suffix, sl);
    return pl + (size_t)k + sl;
}

mt_status_t hf_bpe_encode(const hf_bpe *m, const char *s, size_t n, mt_ids_t *ids)
{
    if (n == 0)
        return MT_OK;
    if (m->ignore_merges) {
        int32_t id = vocab_id(m, s, n);
        if (id >= 0)
            return mt_ids_push(ids, id);
    }
    /* one symbol per byte at most, more where byte_fallback spells out a
     * prefix or suffix too */
    size_t extra = (m->prefix ? strlen(m->prefix) : 0) + (m->suffix ? strlen(m->suffix) : 0);
    size_t cap = m->byte_fallback && extra ? n * (1 + extra) : n;
    sym_t stack_sym[64];
    cand_t stack_heap[3 * 64 + 1]; /* each merge pushes at most two pairs */
    sym_t *sym = cap <= 64 ? stack_sym : malloc(cap * sizeof *sym);
    cand_t *heap = cap <= 64 ? stack_heap : malloc((3 * cap + 1) * sizeof *heap);
    if (!sym || !heap) {
        if (sym != stack_sym)
            free(sym);
        if (heap != stack_heap)
            free(heap);
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
    }
    size_t ns = 0, nh = 0;
    int32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = hf_utf8_next(s + i, n - i, &cp);
        char tmp[512];
        size_t tl = char_token(m, s + i, k, i == 0, i + (size_t)k == n, tmp, sizeof tmp);
        const char *tok = tl ? tmp : s + i;
        if (!tl)
            tl = (size_t)k;
        int32_t id = tok != tmp && cp < 0x10000 ? m->cp_id[cp] : vocab_id(m, tok, tl);
        bool bytes_ok = id < 0 && m->byte_fallback;
        for (size_t b = 0; bytes_ok && b < tl; b++)
            bytes_ok = m->byte_id[(unsigned char)tok[b]] >= 0;
        if (id >= 0) {
            if (unk_len) {
                sym[ns] = (sym_t){m->unk_id, (int32_t)ns - 1, (int32_t)ns + 1, unk_len};
                ns++;
                unk_len = 0;
            }
            sym[ns] = (sym_t){id, (int32_t)ns - 1, (int32_t)ns + 1, k};
            ns++;
        } else if (bytes_ok) {
            /* the Rust library leaves a pending unknown token pending here:
             * it comes after these bytes */
            for (size_t b = 0; b < tl; b++, ns++)
                sym[ns] = (sym_t){m->byte_id[(unsigned char)tok[b]], (int32_t)ns - 1,
                                  (int32_t)ns + 1, 1};
        } else if (m->unk_id >= 0) {
            if (unk_len && !m->fuse_unk) {
                sym[ns] = (sym_t){m->unk_id, (int32_t)ns - 1, (int32_t)ns + 1, unk_len};
                ns++;
                unk_len = 0;
            }
            unk_len += k;
        } /* without an unknown token the character is dropped, as in Rust */
        i += (size_t)k;
    }
    if (unk_len) {
        sym[ns] = (sym_t){m->unk_id, (int32_t)ns - 1, (int32_t)ns + 1, unk_len};
        ns++;
    }
    if (ns)
        sym[ns - 1].next = -1;
    int32_t rank, merged;
    for (size_t i = 0; i + 1 < ns; i++)
        if (merge_get(&m->merges, sym[i].id, sym[i + 1].id, &rank, &merged))
            heap_push(heap, &nh, (cand_t){rank, (int32_t)i, merged});
    while (nh) {
        cand_t c = heap_pop(heap, &nh);
        sym_t *a = &sym[c.pos];
        if (a->len == 0 || a->next < 0)
            continue;
        sym_t *b = &sym[a->next];
        if (!merge_get(&m->merges, a->id, b->id, &rank, &merged) || merged != c.merged)
            continue;
        a->id = merged;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (a->next >= 0)
            sym[a->next].prev = c.pos;
        if (a->prev >= 0 && merge_get(&m->merges, sym[a->prev].id, a->id, &rank, &merged))
            heap_push(heap, &nh, (cand_t){rank, a->prev, merged});
        if (a->next >= 0 && merge_get(&m->merges, a->id, sym[a->next].id, &rank, &merged))
            heap_push(heap, &nh, (cand_t){rank, c.pos, merged});
    }
    mt_status_t st = MT_OK;
    for (size_t i = 0; st == MT_OK && i < ns; i++)
        if (sym[i].len)
            st = mt_ids_push(ids, sym[i].id);
    if (sym != stack_sym)
        free(sym);
    if (heap != stack_heap)
        free(heap);
    return st;
}
