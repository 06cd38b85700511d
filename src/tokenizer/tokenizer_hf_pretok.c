/* tokenizer_hf_pretok.c: the pre-tokenizers of a tokenizer.json
 * (ByteLevel, Split, Metaspace, Digits, Punctuation, Whitespace,
 * WhitespaceSplit, Sequence) and the five split behaviours they share,
 * written after the Rust library's NormalizedString::split.  Offsets are
 * not tracked: meshtrain needs the ids only.  Others are refused by name. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer_hf.h"

/* GPT-2's pattern, which ByteLevel applies when use_regex is set. */
static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Whitespace: runs of word characters, or of other non-space characters. */
static const char WORD_RE[] = "\\w+|[^\\w\\s]+";

/* GPT-2's bytes_to_unicode: printable Latin-1 stays, the 68 other bytes go
 * to U+0100.. in byte order.  Generated once; both directions. */
static const int16_t BYTE_CHAR[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271, 272, 273,
    274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287, 288, 33, 34, 35, 36,
    37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
    60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82,
    83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104,
    105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122,
    123, 124, 125, 126, 289, 290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302,
    303, 304, 305, 306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320,
    321, 322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175, 176,
    177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191, 192, 193, 194,
    195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212,
    213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223, 224, 225, 226, 227, 228, 229, 230,
    231, 232, 233, 234, 235, 236, 237, 238, 239, 240, 241, 242, 243, 244, 245, 246, 247, 248,
    249, 250, 251, 252, 253, 254, 255,
};
static const int16_t CHAR_BYTE[324] = {
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45,
    46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68,
    69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91,
    92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, -1,
    174, 175, 176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207, 208, 209,
    210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223, 224, 225, 226, 227,
    228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239, 240, 241, 242, 243, 244, 245,
    246, 247, 248, 249, 250, 251, 252, 253, 254, 255, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
    13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 127, 128,
    129, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142, 143, 144, 145, 146,
    147, 148, 149, 150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 160, 173,
};

int32_t hf_bytelevel_char(unsigned char b)
{
    return BYTE_CHAR[b];
}

int hf_bytelevel_byte(int32_t cp)
{
    return cp >= 0 && cp < 324 ? CHAR_BYTE[cp] : -1;
}

void hf_pretok_free(hf_pretok *p)
{
    if (!p)
        return;
    hf_regex_free(p->re);
    for (size_t i = 0; i < p->nsub; i++)
        hf_pretok_free(p->sub[i]);
    free(p->sub);
    free(p);
}

static mt_status_t parse_behavior(const json_t *j, const char *file, const char *what,
                                  hf_split_behavior dflt, hf_split_behavior *out)
{
    const char *b = hf_json_str(j, "behavior");
    *out = dflt;
    if (!b && !json_object_get(j, "behavior"))
        return MT_OK;
    if (!b)
        MT_FAIL(MT_ERR_CONFIG, "%s: %s: \"behavior\" is not a string", file, what);
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (strcmp(b, names[i]) == 0) {
            *out = (hf_split_behavior)i;
            return MT_OK;
        }
    MT_FAIL(MT_ERR_CONFIG, "%s: %s: unknown behavior \"%s\"", file, what, b);
}

mt_status_t hf_pretok_parse(const void *json, const char *file, hf_pretok **out)
{
    const json_t *j = json;
    const char *type;
    *out = NULL;
    MT_TRY(hf_json_type(j, file, "pre_tokenizer", &type));
    hf_pretok *p = calloc(1, sizeof *p);
    if (!p)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    mt_status_t st = MT_OK;
    if (strcmp(type, "ByteLevel") == 0) {
        p->kind = HF_P_BYTELEVEL;
        p->add_prefix_space = hf_json_bool(j, "add_prefix_space", true);
        p->use_regex = hf_json_bool(j, "use_regex", true);
        if (p->use_regex)
            st = hf_regex_compile(GPT2_RE, false, file, "pre_tokenizer ByteLevel", &p->re);
    } else if (strcmp(type, "Split") == 0) {
        p->kind = HF_P_SPLIT;
        p->invert = hf_json_bool(j, "invert", false);
        st = parse_behavior(j, file, "pre_tokenizer Split", HF_SPLIT_ISOLATED, &p->behavior);
        if (st == MT_OK && !json_object_get(j, "behavior"))
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: pre_tokenizer Split: no \"behavior\"", file);
        if (st == MT_OK)
            st = hf_json_pattern(j, "pattern", file, "pre_tokenizer Split", &p->re, NULL);
    } else if (strcmp(type, "Metaspace") == 0) {
        p->kind = HF_P_METASPACE;
        const char *r = hf_json_str(j, "replacement");
        int32_t cp = 0;
        if (!r || !*r || (size_t)hf_utf8_next(r, strlen(r), &cp) != strlen(r) ||
            strlen(r) >= sizeof p->repl)
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: pre_tokenizer Metaspace: \"replacement\" is not one character",
                              file);
        else {
            strcpy(p->repl, r);
            p->repl_cp = cp;
        }
        p->split = hf_json_bool(j, "split", true);
        const char *ps = hf_json_str(j, "prepend_scheme");
        if (ps && strcmp(ps, "always") == 0)
            p->prepend = HF_PREPEND_ALWAYS;
        else if (ps && strcmp(ps, "first") == 0)
            p->prepend = HF_PREPEND_FIRST;
        else if (ps && strcmp(ps, "never") == 0)
            p->prepend = HF_PREPEND_NEVER;
        else if (!ps) /* files before prepend_scheme said add_prefix_space */
            p->prepend = hf_json_bool(j, "add_prefix_space", true) ? HF_PREPEND_ALWAYS
                                                                  : HF_PREPEND_NEVER;
        else if (st == MT_OK)
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: pre_tokenizer Metaspace: unknown prepend_scheme \"%s\"", file,
                              ps);
    } else if (strcmp(type, "Digits") == 0) {
        p->kind = HF_P_DIGITS;
        p->individual = hf_json_bool(j, "individual_digits", false);
    } else if (strcmp(type, "Punctuation") == 0) {
        p->kind = HF_P_PUNCT;
        st = parse_behavior(j, file, "pre_tokenizer Punctuation", HF_SPLIT_ISOLATED,
                            &p->behavior);
    } else if (strcmp(type, "Whitespace") == 0) {
        p->kind = HF_P_WHITESPACE;
        st = hf_regex_compile(WORD_RE, false, file, "pre_tokenizer Whitespace", &p->re);
    } else if (strcmp(type, "WhitespaceSplit") == 0)
        p->kind = HF_P_WSSPLIT;
    else if (strcmp(type, "Sequence") == 0) {
        p->kind = HF_P_SEQ;
        const json_t *a = json_object_get(j, "pretokenizers");
        if (!json_is_array(a))
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: pre_tokenizer Sequence: \"pretokenizers\" is not an array",
                              file);
        else if (!(p->sub = calloc(json_array_size(a) + 1, sizeof *p->sub)))
            st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "tokenizer: out of memory");
        for (size_t i = 0; st == MT_OK && i < json_array_size(a); i++) {
            st = hf_pretok_parse(json_array_get(a, i), file, &p->sub[i]);
            if (st == MT_OK)
                p->nsub++;
        }
    } else
        st = mt_error_set(MT_ERR_UNSUPPORTED, __FILE__, __LINE__,
                          "%s: pre_tokenizer \"%s\" is not supported (ByteLevel, Split, "
                          "Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit, Sequence "
                          "are)", file, type);
    if (st != MT_OK) {
        hf_pretok_free(p);
        return st;
    }
    *out = p;
    return MT_OK;
}

mt_status_t hf_split_apply(const char *s, const hf_ranges *rg, hf_split_behavior b, bool invert,
                           bool first, hf_ranges *tmp, hf_pieces *out)
{
    tmp->n = 0;
    bool prevm = false;
    if (b == HF_SPLIT_NEXT) {
        for (size_t k = rg->n; k-- > 0;) {
            bool m = rg->r[k].match != invert;
            if (m && !prevm && tmp->n)
                tmp->r[tmp->n - 1].a = rg->r[k].a;
            else
                MT_TRY(hf_ranges_add(tmp, rg->r[k].a, rg->r[k].b, false));
            prevm = m;
        }
        for (size_t i = 0, k = tmp->n; i < k / 2; i++) {
            hf_range t = tmp->r[i];
            tmp->r[i] = tmp->r[k - 1 - i];
            tmp->r[k - 1 - i] = t;
        }
    } else
        for (size_t k = 0; k < rg->n; k++) {
            bool m = rg->r[k].match != invert;
            bool extend = (b == HF_SPLIT_PREV && m && !prevm) ||
                          (b == HF_SPLIT_CONTIG && m == prevm);
            if (extend && tmp->n)
                tmp->r[tmp->n - 1].b = rg->r[k].b;
            else
                MT_TRY(hf_ranges_add(tmp, rg->r[k].a, rg->r[k].b,
                                     b == HF_SPLIT_REMOVED && m));
            prevm = m;
        }
    for (size_t k = 0; k < tmp->n; k++)
        if (!tmp->r[k].match)
            MT_TRY(hf_pieces_add(out, s + tmp->r[k].a, tmp->r[k].b - tmp->r[k].a,
                                 first && tmp->r[k].a == 0));
    return MT_OK;
}

/* Ranges where each character satisfying pred is a match of its own. */
static mt_status_t char_ranges(const char *s, size_t n, bool (*pred)(int32_t), hf_ranges *out)
{
    out->n = 0;
    size_t i = 0, prev = 0;
    while (i < n) {
        int32_t cp;
        int k = hf_utf8_next(s + i, n - i, &cp);
        if (pred(cp)) {
            if (i > prev)
                MT_TRY(hf_ranges_add(out, prev, i, false));
            MT_TRY(hf_ranges_add(out, i, i + (size_t)k, true));
            prev = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (prev < n)
        MT_TRY(hf_ranges_add(out, prev, n, false));
    return MT_OK;
}

/* Map each byte to its ByteLevel character. */
static mt_status_t bytelevel_map(const char *s, size_t n, bool first, hf_pieces *out)
{
    size_t off = out->buf.n;
    for (size_t i = 0; i < n; i++) {
        char tmp[4];
        int k = hf_utf8_put(hf_bytelevel_char((unsigned char)s[i]), tmp);
        MT_TRY(hf_buf_add(&out->buf, tmp, (size_t)k));
    }
    size_t len = out->buf.n - off;
    if (len == 0)
        return MT_OK;
    /* the characters are in place: record the piece without copying */
    if (out->np == out->cap) {
        size_t c = out->cap ? out->cap * 2 : 16;
        hf_piece *q = realloc(out->p, c * sizeof *q);
        if (!q)
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        out->p = q;
        out->cap = c;
    }
    out->p[out->np++] = (hf_piece){off, len, first};
    return MT_OK;
}

static mt_status_t apply_one(const hf_pretok *p, const char *s, size_t n, bool first,
                             hf_scratch *sc, hf_pieces *out)
{
    switch (p->kind) {
    case HF_P_BYTELEVEL: {
        const char *w = s;
        size_t wn = n;
        if (p->add_prefix_space && (n == 0 || s[0] != ' ')) {
            sc->t2.n = 0;
            MT_TRY(hf_buf_add(&sc->t2, " ", 1));
            MT_TRY(hf_buf_add(&sc->t2, s, n));
            w = sc->t2.s;
            wn = sc->t2.n;
        }
        if (!p->use_regex)
            return bytelevel_map(w, wn, first, out);
        MT_TRY(hf_regex_ranges(p->re, w, wn, sc, &sc->rg));
        for (size_t k = 0; k < sc->rg.n; k++)
            MT_TRY(bytelevel_map(w + sc->rg.r[k].a, sc->rg.r[k].b - sc->rg.r[k].a,
                                 first && sc->rg.r[k].a == 0, out));
        return MT_OK;
    }
    case HF_P_SPLIT:
        MT_TRY(hf_regex_ranges(p->re, s, n, sc, &sc->rg));
        return hf_split_apply(s, &sc->rg, p->behavior, p->invert, first, &sc->rg2, out);
    case HF_P_WHITESPACE:
        MT_TRY(hf_regex_ranges(p->re, s, n, sc, &sc->rg));
        return hf_split_apply(s, &sc->rg, HF_SPLIT_REMOVED, true, first, &sc->rg2, out);
    case HF_P_WSSPLIT:
        MT_TRY(char_ranges(s, n, hf_is_whitespace, &sc->rg));
        return hf_split_apply(s, &sc->rg, HF_SPLIT_REMOVED, false, first, &sc->rg2, out);
    case HF_P_PUNCT:
        MT_TRY(char_ranges(s, n, hf_is_punct, &sc->rg));
        return hf_split_apply(s, &sc->rg, p->behavior, false, first, &sc->rg2, out);
    case HF_P_DIGITS:
        MT_TRY(char_ranges(s, n, hf_is_numeric, &sc->rg));
        return hf_split_apply(s, &sc->rg, p->individual ? HF_SPLIT_ISOLATED : HF_SPLIT_CONTIG,
                              false, first, &sc->rg2, out);
    case HF_P_METASPACE: {
        hf_buf *t = &sc->t2;
        size_t rl = strlen(p->repl);
        t->n = 0;
        bool starts = n >= rl && memcmp(s, p->repl, rl) == 0;
        if (!starts && n > 0 && s[0] == ' ')
            starts = true; /* the space becomes the replacement below */
        if (!starts && (p->prepend == HF_PREPEND_ALWAYS || (p->prepend == HF_PREPEND_FIRST && first)))
            MT_TRY(hf_buf_add(t, p->repl, rl));
        for (size_t i = 0; i < n; i++)
            MT_TRY(s[i] == ' ' ? hf_buf_add(t, p->repl, rl) : hf_buf_add(t, s + i, 1));
        if (!p->split)
            return hf_pieces_add(out, t->s, t->n, first);
        /* split on the replacement, each one starting the next piece */
        size_t prev = 0;
        sc->rg.n = 0;
        for (size_t i = 0; i + rl <= t->n;) {
            if (memcmp(t->s + i, p->repl, rl) == 0) {
                if (i > prev)
                    MT_TRY(hf_ranges_add(&sc->rg, prev, i, false));
                MT_TRY(hf_ranges_add(&sc->rg, i, i + rl, true));
                i += rl;
                prev = i;
            } else
                i++;
        }
        if (prev < t->n)
            MT_TRY(hf_ranges_add(&sc->rg, prev, t->n, false));
        return hf_split_apply(t->s, &sc->rg, HF_SPLIT_NEXT, false, first, &sc->rg2, out);
    }
    case HF_P_SEQ:
        break;
    }
    MT_FAIL(MT_ERR_INTERNAL, "tokenizer: pre_tokenizer %d applied to one piece", (int)p->kind);
}

mt_status_t hf_pretok_apply(const hf_pretok *p, hf_pieces **io, hf_scratch *sc)
{
    if (p->kind == HF_P_SEQ) {
        for (size_t i = 0; i < p->nsub; i++)
            MT_TRY(hf_pretok_apply(p->sub[i], io, sc));
        return MT_OK;
    }
    hf_pieces *in = *io;
    hf_pieces *out = in == &sc->a ? &sc->b : &sc->a;
    hf_pieces_reset(out);
    for (size_t k = 0; k < in->np; k++)
        MT_TRY(apply_one(p, in->buf.s + in->p[k].off, in->p[k].len, in->p[k].first, sc, out));
    *io = out;
    return MT_OK;
}
