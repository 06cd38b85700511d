/* tokenizer_hf_util.c: what the Hugging Face pipeline shares: growable
 * buffers and piece lists, UTF-8 decoding and the lossy repair of invalid
 * input, the JSON accessors the parsers share, the character classes the Rust library takes from the standard
 * library, a string map, and PCRE2 regexes with their match ranges.
 * Unicode properties come from utf8proc; nothing here holds a table. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <pcre2.h>
#include <utf8proc.h>

#include "tokenizer_hf.h"

mt_status_t hf_buf_add(hf_buf *b, const char *s, size_t n)
{
    MT_TRY(mt_tok_grow((void **)&b->s, &b->cap, b->n + n + 1, 1));
    if (n)
        memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return MT_OK;
}

void hf_buf_free(hf_buf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

mt_status_t hf_pieces_add(hf_pieces *ps, const char *s, size_t n, bool first)
{
    if (n == 0)
        return MT_OK;
    MT_TRY(mt_tok_grow((void **)&ps->p, &ps->cap, ps->np + 1, sizeof *ps->p));
    ps->p[ps->np++] = (hf_piece){ps->buf.n, n, first};
    return hf_buf_add(&ps->buf, s, n);
}

void hf_pieces_reset(hf_pieces *ps)
{
    ps->np = 0;
    ps->buf.n = 0;
}

void hf_pieces_free(hf_pieces *ps)
{
    hf_buf_free(&ps->buf);
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

mt_status_t hf_ranges_add(hf_ranges *rs, size_t a, size_t b, bool match)
{
    MT_TRY(mt_tok_grow((void **)&rs->r, &rs->cap, rs->n + 1, sizeof *rs->r));
    rs->r[rs->n++] = (hf_range){a, b, match};
    return MT_OK;
}

void hf_scratch_free(hf_scratch *sc)
{
    if (sc->md)
        pcre2_match_data_free((pcre2_match_data *)sc->md);
    free(sc->rg.r);
    free(sc->rg2.r);
    hf_pieces_free(&sc->a);
    hf_pieces_free(&sc->b);
    hf_buf_free(&sc->t1);
    hf_buf_free(&sc->t2);
    free(sc->cache);
    memset(sc, 0, sizeof *sc);
}

/* ---- JSON ---- */

mt_status_t hf_json_type(const void *json, const char *file, const char *what, const char **type)
{
    const json_t *j = json;
    if (!json_is_object(j))
        MT_FAIL(MT_ERR_CONFIG, "%s: %s is not an object", file, what);
    *type = hf_json_str(j, "type");
    if (!*type)
        MT_FAIL(MT_ERR_CONFIG, "%s: %s has no \"type\" string", file, what);
    return MT_OK;
}

const char *hf_json_str(const void *json, const char *key)
{
    const json_t *v = json_object_get(json, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

bool hf_json_bool(const void *json, const char *key, bool dflt)
{
    const json_t *v = json_object_get(json, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

mt_status_t hf_json_pattern(const void *json, const char *key, const char *file, const char *what,
                            hf_regex **out, char **literal)
{
    const json_t *p = json_object_get(json, key);
    const char *s = hf_json_str(p, "String"), *r = hf_json_str(p, "Regex");
    if (!json_is_object(p) || (!s && !r))
        MT_FAIL(MT_ERR_CONFIG, "%s: %s: \"%s\" is neither {\"String\": ...} nor {\"Regex\": ...}",
                file, what, key);
    if (literal) {
        if (!s)
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s: %s: only a String pattern is supported here", file,
                    what);
        if (!(*literal = strdup(s)))
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        return MT_OK;
    }
    return hf_regex_compile(s ? s : r, s != NULL, file, what, out);
}

/* ---- UTF-8 ---- */

int hf_utf8_next(const char *s, size_t n, int32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0 || n < 4) {
        *cp = ((u[0] & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((u[0] & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

int hf_utf8_put(int32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The length of the valid character at u (0 if invalid), and otherwise in
 * *bad the length of the maximal prefix of a valid sequence (at least 1):
 * the WHATWG decoder emits one U+FFFD for it. */
static size_t utf8_one(const unsigned char *u, size_t n, size_t *bad)
{
    unsigned char c = u[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    *bad = 1;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    for (size_t k = 1; k <= need; k++) {
        if (k >= n || u[k] < lo || u[k] > hi) {
            *bad = k;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

bool hf_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, bad;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_one(u + i, n - i, &bad);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

mt_status_t hf_utf8_sanitize(const char *s, size_t n, hf_buf *out)
{
    const unsigned char *u = (const unsigned char *)s;
    out->n = 0;
    MT_TRY(hf_buf_add(out, "", 0));
    size_t i = 0, run = 0, bad;
    while (i < n) {
        size_t k = u[i] < 0x80 ? 1 : utf8_one(u + i, n - i, &bad);
        if (k) {
            i += k;
            continue;
        }
        MT_TRY(hf_buf_add(out, s + run, i - run));
        MT_TRY(hf_buf_add(out, "\xEF\xBF\xBD", 3));
        i += bad;
        run = i;
    }
    return hf_buf_add(out, s + run, n - run);
}

/* ---- character classes ---- */

bool hf_is_whitespace(int32_t cp)
{
    if ((cp >= 9 && cp <= 13) || cp == ' ' || cp == 0x85)
        return true;
    if (cp < 0xA0)
        return false;
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool hf_is_numeric(int32_t cp)
{
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool hf_is_punct(int32_t cp)
{
    if (cp < 0x80)
        return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
               (cp >= 123 && cp <= 126);
    utf8proc_category_t c = utf8proc_category(cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

bool hf_is_alnum(int32_t cp)
{
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || hf_is_numeric(cp);
}

/* ---- string map ---- */

static uint64_t hash_bytes(const char *k, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static mt_status_t strmap_rehash(hf_strmap *m, size_t cap)
{
    hf_strmap nm = {0};
    nm.key = calloc(cap, sizeof *nm.key);
    nm.klen = calloc(cap, sizeof *nm.klen);
    nm.val = calloc(cap, sizeof *nm.val);
    if (!nm.key || !nm.klen || !nm.val) {
        free(nm.key);
        free(nm.klen);
        free(nm.val);
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory for a map of %zu", cap);
    }
    nm.mask = cap - 1;
    nm.n = m->n;
    for (size_t i = 0; m->key && i <= m->mask; i++) {
        if (!m->key[i])
            continue;
        size_t j = hash_bytes(m->key[i], m->klen[i]) & nm.mask;
        while (nm.key[j])
            j = (j + 1) & nm.mask;
        nm.key[j] = m->key[i];
        nm.klen[j] = m->klen[i];
        nm.val[j] = m->val[i];
    }
    free(m->key);
    free(m->klen);
    free(m->val);
    *m = nm;
    return MT_OK;
}

mt_status_t hf_strmap_put(hf_strmap *m, const char *k, size_t n, int32_t v)
{
    if (!m->key || (m->n + 1) * 2 > m->mask + 1)
        MT_TRY(strmap_rehash(m, m->key ? (m->mask + 1) * 2 : 64));
    size_t j = hash_bytes(k, n) & m->mask;
    while (m->key[j]) {
        if (m->klen[j] == n && memcmp(m->key[j], k, n) == 0) {
            m->val[j] = v;
            return MT_OK;
        }
        j = (j + 1) & m->mask;
    }
    char *c = malloc(n + 1);
    if (!c)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(c, k, n);
    c[n] = '\0';
    m->key[j] = c;
    m->klen[j] = n;
    m->val[j] = v;
    m->n++;
    return MT_OK;
}

int32_t hf_strmap_get(const hf_strmap *m, const char *k, size_t n)
{
    if (!m->key)
        return -1;
    size_t j = hash_bytes(k, n) & m->mask;
    while (m->key[j]) {
        if (m->klen[j] == n && memcmp(m->key[j], k, n) == 0)
            return m->val[j];
        j = (j + 1) & m->mask;
    }
    return -1;
}

void hf_strmap_free(hf_strmap *m)
{
    for (size_t i = 0; m->key && i <= m->mask; i++)
        free(m->key[i]);
    free(m->key);
    free(m->klen);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* ---- regexes ---- */

struct hf_regex {
    pcre2_code *code; /* NULL for a literal */
    char *lit;
    size_t litlen;
};

mt_status_t hf_regex_compile(const char *pattern, bool literal, const char *file,
                             const char *what, hf_regex **out)
{
    hf_regex *r = calloc(1, sizeof *r);
    if (!r)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    if (literal) {
        r->litlen = strlen(pattern);
        r->lit = strdup(pattern);
        if (!r->lit || r->litlen == 0) {
            free(r->lit);
            free(r);
            MT_FAIL(MT_ERR_CONFIG, "%s: %s: an empty string pattern", file, what);
        }
        *out = r;
        return MT_OK;
    }
    int err;
    PCRE2_SIZE off;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (cc)
        pcre2_set_newline(cc, PCRE2_NEWLINE_LF); /* Oniguruma's '.' and '$' see only \n */
    r->code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                            &err, &off, cc);
    pcre2_compile_context_free(cc);
    if (!r->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        free(r);
        MT_FAIL(MT_ERR_CONFIG, "%s: %s: regex /%s/ does not compile at offset %zu: %s", file,
                what, pattern, (size_t)off, (const char *)msg);
    }
    (void)pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE); /* interpreted where JIT is absent */
    *out = r;
    return MT_OK;
}

void hf_regex_free(hf_regex *r)
{
    if (!r)
        return;
    if (r->code)
        pcre2_code_free(r->code);
    free(r->lit);
    free(r);
}

mt_status_t hf_regex_ranges(const hf_regex *r, const char *s, size_t n, hf_scratch *sc,
                            hf_ranges *out)
{
    out->n = 0;
    size_t prev = 0;
    if (r->lit) {
        size_t i = 0;
        while (i + r->litlen <= n) {
            if (memcmp(s + i, r->lit, r->litlen) != 0) {
                i++;
                continue;
            }
            if (i > prev)
                MT_TRY(hf_ranges_add(out, prev, i, false));
            MT_TRY(hf_ranges_add(out, i, i + r->litlen, true));
            i += r->litlen;
            prev = i;
        }
    } else {
        if (!sc->md) {
            sc->md = pcre2_match_data_create(32, NULL);
            if (!sc->md)
                MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory for regex match data");
        }
        pcre2_match_data *md = sc->md;
        size_t start = 0;
        while (start <= n) {
            int rc = pcre2_match(r->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                MT_FAIL(MT_ERR_INTERNAL, "tokenizer: regex match failed: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t a = ov[0], b = ov[1];
            if (a > prev)
                MT_TRY(hf_ranges_add(out, prev, a, false));
            MT_TRY(hf_ranges_add(out, a, b, true));
            prev = b;
            if (b > a)
                start = b;
            else { /* an empty match: step over one character */
                if (b >= n)
                    break;
                int32_t cp;
                start = b + (size_t)hf_utf8_next(s + b, n - b, &cp);
            }
        }
    }
    if (prev < n)
        MT_TRY(hf_ranges_add(out, prev, n, false));
    return MT_OK;
}
