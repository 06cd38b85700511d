/* tokenizer_hf_decode.c: ids to text with a tokenizer.json: the token
 * strings (special ones dropped on request), then the decoder chain
 * (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence)
 * over the list of strings, as the Rust library's decode_chain, then the
 * strings joined.  Without a decoder the tokens are joined with spaces, as
 * in Rust.  The result is always valid UTF-8: byte sequences that do not
 * form characters become U+FFFD, as Rust's from_utf8_lossy makes them. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer_hf.h"

void hf_dec_free(hf_dec *d)
{
    if (!d)
        return;
    free(d->pattern);
    free(d->content);
    free(d->strip);
    for (size_t i = 0; i < d->nsub; i++)
        hf_dec_free(d->sub[i]);
    free(d->sub);
    free(d);
}

static mt_status_t dup_field(const json_t *j, const char *key, const char *file, const char *what,
                             char **out)
{
    const char *s = hf_json_str(j, key);
    if (!s)
        MT_FAIL(MT_ERR_CONFIG, "%s: decoder %s: \"%s\" is not a string", file, what, key);
    if (!(*out = strdup(s)))
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    return MT_OK;
}

static mt_status_t parse_into(hf_dec *d, const json_t *j, const char *file, const char *type)
{
    if (strcmp(type, "ByteLevel") == 0)
        d->kind = HF_D_BYTELEVEL;
    else if (strcmp(type, "ByteFallback") == 0)
        d->kind = HF_D_BYTEFALLBACK;
    else if (strcmp(type, "Fuse") == 0)
        d->kind = HF_D_FUSE;
    else if (strcmp(type, "Metaspace") == 0) {
        d->kind = HF_D_METASPACE;
        const char *r = hf_json_str(j, "replacement");
        if (!r || !*r || strlen(r) >= sizeof d->repl)
            MT_FAIL(MT_ERR_CONFIG, "%s: decoder Metaspace: \"replacement\" is not one character",
                    file);
        strcpy(d->repl, r);
        const char *ps = hf_json_str(j, "prepend_scheme");
        d->prepend = ps ? (strcmp(ps, "never") == 0 ? HF_PREPEND_NEVER : HF_PREPEND_ALWAYS)
                        : (hf_json_bool(j, "add_prefix_space", true) ? HF_PREPEND_ALWAYS
                                                                      : HF_PREPEND_NEVER);
    } else if (strcmp(type, "Strip") == 0) {
        d->kind = HF_D_STRIP;
        MT_TRY(dup_field(j, "content", file, "Strip", &d->strip));
        const json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
            json_integer_value(b) < 0 || json_integer_value(a) > 1000000 ||
            json_integer_value(b) > 1000000)
            MT_FAIL(MT_ERR_CONFIG, "%s: decoder Strip: \"start\" and \"stop\" must be counts",
                    file);
        d->start = (int)json_integer_value(a);
        d->stop = (int)json_integer_value(b);
    } else if (strcmp(type, "Replace") == 0) {
        d->kind = HF_D_REPLACE;
        MT_TRY(dup_field(j, "content", file, "Replace", &d->content));
        MT_TRY(hf_json_pattern(j, "pattern", file, "decoder Replace", NULL, &d->pattern));
        if (!*d->pattern)
            MT_FAIL(MT_ERR_CONFIG, "%s: decoder Replace: an empty pattern", file);
    } else if (strcmp(type, "Sequence") == 0) {
        d->kind = HF_D_SEQ;
        const json_t *a = json_object_get(j, "decoders");
        if (!json_is_array(a))
            MT_FAIL(MT_ERR_CONFIG, "%s: decoder Sequence: \"decoders\" is not an array", file);
        if (!(d->sub = calloc(json_array_size(a) + 1, sizeof *d->sub)))
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        for (size_t i = 0; i < json_array_size(a); i++) {
            MT_TRY(hf_dec_parse(json_array_get(a, i), file, &d->sub[i]));
            d->nsub++;
        }
    } else
        MT_FAIL(MT_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported (ByteLevel, Metaspace, "
                "ByteFallback, Fuse, Strip, Replace, Sequence are)", file, type);
    return MT_OK;
}

mt_status_t hf_dec_parse(const void *json, const char *file, hf_dec **out)
{
    const char *type;
    *out = NULL;
    MT_TRY(hf_json_type(json, file, "decoder", &type));
    hf_dec *d = calloc(1, sizeof *d);
    if (!d)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    mt_status_t st = parse_into(d, json, file, type);
    if (st != MT_OK) {
        hf_dec_free(d);
        return st;
    }
    *out = d;
    return MT_OK;
}

/* ---- applying the chain to a list of strings ---- */

/* Like hf_pieces_add, but an empty string stays a token. */
static mt_status_t tok_add(hf_pieces *ps, const char *s, size_t n)
{
    if (ps->np == ps->cap) {
        size_t c = ps->cap ? ps->cap * 2 : 64;
        hf_piece *q = realloc(ps->p, c * sizeof *q);
        if (!q)
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        ps->p = q;
        ps->cap = c;
    }
    ps->p[ps->np++] = (hf_piece){ps->buf.n, n, false};
    return hf_buf_add(&ps->buf, s, n);
}

static mt_status_t bytelevel(const hf_pieces *in, hf_pieces *out, hf_buf *tmp)
{
    tmp->n = 0;
    for (size_t k = 0; k < in->np; k++) {
        const char *t = in->buf.s + in->p[k].off;
        size_t n = in->p[k].len, mark = tmp->n;
        for (size_t i = 0; i < n;) {
            int32_t cp;
            int l = hf_utf8_next(t + i, n - i, &cp);
            int b = hf_bytelevel_byte(cp);
            if (b < 0) { /* a character outside the table: the token's own bytes */
                tmp->n = mark;
                MT_TRY(hf_buf_add(tmp, t, n));
                break;
            }
            char c = (char)b;
            MT_TRY(hf_buf_add(tmp, &c, 1));
            i += (size_t)l;
        }
    }
    hf_buf clean = {0};
    MT_TRY(hf_utf8_sanitize(tmp->s ? tmp->s : "", tmp->n, &clean));
    mt_status_t st = tok_add(out, clean.s, clean.n);
    hf_buf_free(&clean);
    return st;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                          : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static mt_status_t flush_bytes(hf_buf *bytes, hf_pieces *out)
{
    if (!bytes->n)
        return MT_OK;
    if (hf_utf8_valid(bytes->s, bytes->n))
        MT_TRY(tok_add(out, bytes->s, bytes->n));
    else /* one U+FFFD per byte token, as Rust's ByteFallback does */
        for (size_t i = 0; i < bytes->n; i++)
            MT_TRY(tok_add(out, "\xEF\xBF\xBD", 3));
    bytes->n = 0;
    return MT_OK;
}

static mt_status_t bytefallback(const hf_pieces *in, hf_pieces *out, hf_buf *bytes)
{
    bytes->n = 0;
    for (size_t k = 0; k < in->np; k++) {
        const char *t = in->buf.s + in->p[k].off;
        size_t n = in->p[k].len;
        if (n == 6 && memcmp(t, "<0x", 3) == 0 && t[5] == '>' && hexval(t[3]) >= 0 &&
            hexval(t[4]) >= 0) {
            char c = (char)(hexval(t[3]) * 16 + hexval(t[4]));
            MT_TRY(hf_buf_add(bytes, &c, 1));
            continue;
        }
        MT_TRY(flush_bytes(bytes, out));
        MT_TRY(tok_add(out, t, n));
    }
    return flush_bytes(bytes, out);
}

/* Replace every occurrence of pat in s by rep (rep NULL: delete). */
static mt_status_t replace_all(const char *s, size_t n, const char *pat, const char *rep,
                               hf_buf *out)
{
    size_t pl = strlen(pat), prev = 0;
    out->n = 0;
    MT_TRY(hf_buf_add(out, "", 0));
    for (size_t i = 0; i + pl <= n;) {
        if (memcmp(s + i, pat, pl) == 0) {
            MT_TRY(hf_buf_add(out, s + prev, i - prev));
            if (rep)
                MT_TRY(hf_buf_add(out, rep, strlen(rep)));
            i += pl;
            prev = i;
        } else
            i++;
    }
    return hf_buf_add(out, s + prev, n - prev);
}

static mt_status_t strip(const hf_dec *d, const char *t, size_t n, hf_pieces *out)
{
    size_t cl = strlen(d->strip), a = 0, b = n;
    for (int i = 0; i < d->start && a + cl <= b && memcmp(t + a, d->strip, cl) == 0; i++)
        a += cl;
    for (int i = 0; i < d->stop && b >= a + cl && memcmp(t + b - cl, d->strip, cl) == 0; i++)
        b -= cl;
    return tok_add(out, t + a, b - a);
}

static mt_status_t apply(const hf_dec *d, hf_pieces **io, hf_pieces *spare, hf_buf *tmp)
{
    if (d->kind == HF_D_SEQ) {
        for (size_t i = 0; i < d->nsub; i++) {
            hf_pieces *before = *io;
            MT_TRY(apply(d->sub[i], io, spare, tmp));
            if (*io != before)
                spare = before;
        }
        return MT_OK;
    }
    hf_pieces *in = *io, *out = spare;
    hf_pieces_reset(out);
    switch (d->kind) {
    case HF_D_BYTELEVEL:
        MT_TRY(bytelevel(in, out, tmp));
        break;
    case HF_D_BYTEFALLBACK:
        MT_TRY(bytefallback(in, out, tmp));
        break;
    case HF_D_FUSE:
        tmp->n = 0;
        for (size_t k = 0; k < in->np; k++)
            MT_TRY(hf_buf_add(tmp, in->buf.s + in->p[k].off, in->p[k].len));
        MT_TRY(tok_add(out, tmp->s ? tmp->s : "", tmp->n));
        break;
    case HF_D_STRIP:
        for (size_t k = 0; k < in->np; k++)
            MT_TRY(strip(d, in->buf.s + in->p[k].off, in->p[k].len, out));
        break;
    case HF_D_REPLACE:
    case HF_D_METASPACE:
        for (size_t k = 0; k < in->np; k++) {
            const char *t = in->buf.s + in->p[k].off;
            if (d->kind == HF_D_REPLACE)
                MT_TRY(replace_all(t, in->p[k].len, d->pattern, d->content, tmp));
            else
                MT_TRY(replace_all(t, in->p[k].len, d->repl,
                                   k == 0 && d->prepend != HF_PREPEND_NEVER ? NULL : " ", tmp));
            MT_TRY(tok_add(out, tmp->s, tmp->n));
        }
        break;
    case HF_D_SEQ:
        break;
    }
    *io = out;
    return MT_OK;
}

mt_status_t hf_decode(const struct mt_hftok *h, const int32_t *ids, size_t n, bool skip_special,
                      mt_text_t *out)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= h->ntok)
            MT_FAIL(MT_ERR_RANGE, "tokenizer: id %d at position %zu is outside the vocabulary "
                    "(0..%lld) of %s", ids[i], i, (long long)h->ntok - 1, h->file);
        else if (!h->tok[ids[i]]) /* the vocabulary may leave ids unused */
            MT_FAIL(MT_ERR_RANGE, "tokenizer: id %d at position %zu has no token in %s", ids[i],
                    i, h->file);
    hf_pieces a = {0}, b = {0};
    hf_buf tmp = {0};
    mt_status_t st = MT_OK;
    for (size_t i = 0; st == MT_OK && i < n; i++)
        if (!(skip_special && h->is_special[ids[i]]))
            st = tok_add(&a, h->tok[ids[i]], h->toklen[ids[i]]);
    hf_pieces *res = &a;
    if (st == MT_OK && h->dec)
        st = apply(h->dec, &res, &b, &tmp);
    for (size_t k = 0; st == MT_OK && k < res->np; k++) {
        if (!h->dec && k > 0)
            st = mt_text_append(out, " ", 1);
        if (st == MT_OK)
            st = mt_text_append(out, res->buf.s + res->p[k].off, res->p[k].len);
    }
    if (st == MT_OK)
        st = mt_text_append(out, "", 0);
    hf_pieces_free(&a);
    hf_pieces_free(&b);
    hf_buf_free(&tmp);
    return st;
}
