/* tokenizer_hf_norm.c: the normalizers of a tokenizer.json (NFC, NFD, NFKC,
 * NFKD, Lowercase, Replace, Prepend, Strip, Sequence), applied to one
 * section of text between added tokens.  Unicode normalization and case
 * mapping are utf8proc's.  Other normalizers are refused by name. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <utf8proc.h>

#include "tokenizer_hf.h"

void hf_norm_free(hf_norm *n)
{
    if (!n)
        return;
    hf_regex_free(n->re);
    free(n->content);
    for (size_t i = 0; i < n->nsub; i++)
        hf_norm_free(n->sub[i]);
    free(n->sub);
    free(n);
}

mt_status_t hf_norm_parse(const void *json, const char *file, hf_norm **out)
{
    const json_t *j = json;
    const char *type;
    *out = NULL;
    MT_TRY(hf_json_type(j, file, "normalizer", &type));
    hf_norm *n = calloc(1, sizeof *n);
    if (!n)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    mt_status_t st = MT_OK;
    if (strcmp(type, "NFC") == 0)
        n->kind = HF_N_NFC;
    else if (strcmp(type, "NFD") == 0)
        n->kind = HF_N_NFD;
    else if (strcmp(type, "NFKC") == 0)
        n->kind = HF_N_NFKC;
    else if (strcmp(type, "NFKD") == 0)
        n->kind = HF_N_NFKD;
    else if (strcmp(type, "Lowercase") == 0)
        n->kind = HF_N_LOWER;
    else if (strcmp(type, "Replace") == 0) {
        n->kind = HF_N_REPLACE;
        const char *c = hf_json_str(j, "content");
        if (!c)
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: normalizer Replace: \"content\" is not a string", file);
        else if (!(n->content = strdup(c)))
            st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "tokenizer: out of memory");
        else
            st = hf_json_pattern(j, "pattern", file, "normalizer Replace", &n->re, NULL);
    } else if (strcmp(type, "Prepend") == 0) {
        n->kind = HF_N_PREPEND;
        const char *c = hf_json_str(j, "prepend");
        if (!c)
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: normalizer Prepend: \"prepend\" is not a string", file);
        else if (!(n->content = strdup(c)))
            st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "tokenizer: out of memory");
    } else if (strcmp(type, "Strip") == 0) {
        n->kind = HF_N_STRIP;
        n->left = hf_json_bool(j, "strip_left", true);
        n->right = hf_json_bool(j, "strip_right", true);
    } else if (strcmp(type, "Sequence") == 0) {
        n->kind = HF_N_SEQ;
        const json_t *a = json_object_get(j, "normalizers");
        if (!json_is_array(a))
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: normalizer Sequence: \"normalizers\" is not an array", file);
        else {
            n->sub = calloc(json_array_size(a) + 1, sizeof *n->sub);
            for (size_t i = 0; st == MT_OK && n->sub && i < json_array_size(a); i++) {
                st = hf_norm_parse(json_array_get(a, i), file, &n->sub[i]);
                if (st == MT_OK)
                    n->nsub++;
            }
            if (!n->sub)
                st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "tokenizer: out of memory");
        }
    } else
        st = mt_error_set(MT_ERR_UNSUPPORTED, __FILE__, __LINE__,
                          "%s: normalizer \"%s\" is not supported (NFC, NFD, NFKC, NFKD, "
                          "Lowercase, Replace, Prepend, Strip, Sequence are)", file, type);
    if (st != MT_OK) {
        hf_norm_free(n);
        return st;
    }
    *out = n;
    return MT_OK;
}

static mt_status_t unicode_norm(utf8proc_option_t opt, const char *s, size_t len, hf_buf *out)
{
    utf8proc_uint8_t *r = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &r,
                                      opt | UTF8PROC_STABLE);
    if (m < 0)
        MT_FAIL(MT_ERR_INTERNAL, "tokenizer: Unicode normalization failed: %s",
                utf8proc_errmsg(m));
    out->n = 0;
    mt_status_t st = hf_buf_add(out, (const char *)r, (size_t)m);
    free(r);
    return st;
}

/* Rust's str::to_lowercase: utf8proc's per-character mapping, with the one
 * character whose lowercase is two (U+0130). */
static mt_status_t lowercase(const char *s, size_t len, hf_buf *out)
{
    out->n = 0;
    size_t i = 0;
    while (i < len) {
        int32_t cp;
        int k = hf_utf8_next(s + i, len - i, &cp);
        char tmp[8];
        if (cp == 0x130)
            MT_TRY(hf_buf_add(out, "i\xCC\x87", 3));
        else {
            int m = hf_utf8_put(utf8proc_tolower(cp), tmp);
            MT_TRY(hf_buf_add(out, tmp, (size_t)m));
        }
        i += (size_t)k;
    }
    return hf_buf_add(out, "", 0);
}

static mt_status_t apply1(const hf_norm *n, const char *s, size_t len, hf_scratch *sc,
                          hf_buf *out)
{
    switch (n->kind) {
    case HF_N_NFC:
        return unicode_norm(UTF8PROC_COMPOSE, s, len, out);
    case HF_N_NFD:
        return unicode_norm(UTF8PROC_DECOMPOSE, s, len, out);
    case HF_N_NFKC:
        return unicode_norm(UTF8PROC_COMPOSE | UTF8PROC_COMPAT, s, len, out);
    case HF_N_NFKD:
        return unicode_norm(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, s, len, out);
    case HF_N_LOWER:
        return lowercase(s, len, out);
    case HF_N_REPLACE: {
        hf_ranges rg = {0};
        mt_status_t st = hf_regex_ranges(n->re, s, len, sc, &rg);
        out->n = 0;
        for (size_t i = 0; st == MT_OK && i < rg.n; i++)
            st = rg.r[i].match ? hf_buf_add(out, n->content, strlen(n->content))
                               : hf_buf_add(out, s + rg.r[i].a, rg.r[i].b - rg.r[i].a);
        free(rg.r);
        if (st == MT_OK)
            st = hf_buf_add(out, "", 0);
        return st;
    }
    case HF_N_PREPEND:
        out->n = 0;
        if (len)
            MT_TRY(hf_buf_add(out, n->content, strlen(n->content)));
        return hf_buf_add(out, s, len);
    case HF_N_STRIP: {
        size_t a = 0, b = len;
        while (n->left && a < b) {
            int32_t cp;
            int k = hf_utf8_next(s + a, b - a, &cp);
            if (!hf_is_whitespace(cp))
                break;
            a += (size_t)k;
        }
        while (n->right && b > a) {
            size_t c = b - 1;
            while (c > a && ((unsigned char)s[c] & 0xC0) == 0x80)
                c--;
            int32_t cp;
            hf_utf8_next(s + c, b - c, &cp);
            if (!hf_is_whitespace(cp))
                break;
            b = c;
        }
        out->n = 0;
        return hf_buf_add(out, s + a, b - a);
    }
    case HF_N_SEQ: {
        hf_buf tmp = {0};
        out->n = 0;
        mt_status_t st = hf_buf_add(out, s, len);
        for (size_t i = 0; st == MT_OK && i < n->nsub; i++) {
            st = hf_norm_apply(n->sub[i], out->s, out->n, sc, &tmp);
            hf_buf t = *out;
            *out = tmp;
            tmp = t;
        }
        hf_buf_free(&tmp);
        return st;
    }
    }
    MT_FAIL(MT_ERR_INTERNAL, "tokenizer: unknown normalizer %d", (int)n->kind);
}

mt_status_t hf_norm_apply(const hf_norm *n, const char *s, size_t len, hf_scratch *sc,
                          hf_buf *out)
{
    return apply1(n, s, len, sc, out);
}
