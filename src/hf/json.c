/* json.c: the strict JSON reader of mt_json.h: recursive descent over the
 * whole text into a tree of mt_json_t.  Positions are counted as we go
 * (newlines can only occur in whitespace, since raw control characters
 * are refused inside strings), so every value and every error carries
 * LINE:COL.  Columns count bytes.  Not a streaming parser, and no writer. */
#include "mt_json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const char *s, *name;
    size_t len, pos;
    size_t line, line_start; /* line number (1-based) and where it starts */
    int depth;
} parser_t;

static mt_status_t fail_at(const parser_t *p, size_t pos, const char *what)
{
    size_t col = pos - p->line_start + 1;
    const char *near = pos >= p->len ? "the end of the text" : NULL;
    char c[16];
    if (!near) {
        unsigned char ch = (unsigned char)p->s[pos];
        if (ch >= 0x20 && ch < 0x7f)
            snprintf(c, sizeof c, "'%c'", ch);
        else
            snprintf(c, sizeof c, "byte 0x%02x", ch);
        near = c;
    }
    return mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s:%zu:%zu: %s (found %s)", p->name,
                        p->line, col, what, near);
}

static void skip_ws(parser_t *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == '\n') {
            p->line++;
            p->line_start = p->pos + 1;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            return;
        }
        p->pos++;
    }
}

static int peek(const parser_t *p) { return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1; }

static mt_status_t parse_value(parser_t *p, mt_json_t *v);

/* ------------------------------------------------------------ strings */

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0], cp;
    size_t k;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        k = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        k = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        k = 4, cp = c & 0x07;
    else
        return 0;
    if (n < k)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    /* overlong forms, surrogates, beyond U+10FFFF */
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return k;
}

/* At the opening quote.  The decoded string is never longer than the
 * text, so one allocation of the raw length suffices. */
static mt_status_t parse_string(parser_t *p, char **out, size_t *outlen)
{
    size_t start = ++p->pos, end = start;
    while (end < p->len && p->s[end] != '"')
        end += p->s[end] == '\\' && end + 1 < p->len ? 2 : 1;
    if (end >= p->len)
        return fail_at(p, start - 1, "unterminated string");
    char *o = malloc(end - start + 1);
    if (!o)
        MT_FAIL(MT_ERR_NOMEM, "%s: a string of %zu bytes", p->name, end - start);
    size_t n = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            free(o);
            return fail_at(p, p->pos, "control character in a string: escape it");
        }
        if (c != '\\') {
            size_t k = utf8_len((const unsigned char *)p->s + p->pos, end - p->pos);
            if (!k) {
                free(o);
                return fail_at(p, p->pos, "invalid UTF-8 in a string");
            }
            memcpy(o + n, p->s + p->pos, k);
            n += k, p->pos += k;
            continue;
        }
        char e = p->s[p->pos + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            o[n++] = map[simple - "\"\\/bfnrt"];
            p->pos += 2;
            continue;
        }
        unsigned cp, lo;
        if (e != 'u' || end - p->pos < 6 || !hex4(p->s + p->pos + 2, &cp)) {
            free(o);
            return fail_at(p, p->pos, "invalid escape: expected one of \\\" \\\\ \\/ \\b \\f "
                           "\\n \\r \\t \\uXXXX");
        }
        size_t at = p->pos;
        p->pos += 6;
        if (cp >= 0xd800 && cp <= 0xdbff) { /* a high surrogate needs its low half */
            if (end - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                !hex4(p->s + p->pos + 2, &lo) || lo < 0xdc00 || lo > 0xdfff) {
                free(o);
                return fail_at(p, at, "unpaired UTF-16 surrogate in a \\u escape");
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            p->pos += 6;
        } else if (cp >= 0xdc00 && cp <= 0xdfff) {
            free(o);
            return fail_at(p, at, "unpaired UTF-16 surrogate in a \\u escape");
        }
        n += put_utf8(o + n, cp);
    }
    o[n] = '\0';
    p->pos = end + 1;
    *out = o;
    *outlen = n;
    return MT_OK;
}

/* ------------------------------------------------------------ numbers */

static int is_digit(int c) { return c >= '0' && c <= '9'; }

static mt_status_t parse_number(parser_t *p, mt_json_t *v)
{
    size_t start = p->pos, i = p->pos;
    int integral = 1;
    if (i < p->len && p->s[i] == '-')
        i++;
    if (i >= p->len || !is_digit((unsigned char)p->s[i]))
        return fail_at(p, i, "expected a digit");
    if (p->s[i] == '0' && i + 1 < p->len && is_digit((unsigned char)p->s[i + 1]))
        return fail_at(p, i, "leading zeros are not allowed in a number");
    while (i < p->len && is_digit((unsigned char)p->s[i]))
        i++;
    if (i < p->len && p->s[i] == '.') {
        integral = 0;
        if (++i >= p->len || !is_digit((unsigned char)p->s[i]))
            return fail_at(p, i, "expected a digit after the decimal point");
        while (i < p->len && is_digit((unsigned char)p->s[i]))
            i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        integral = 0;
        if (++i < p->len && (p->s[i] == '+' || p->s[i] == '-'))
            i++;
        if (i >= p->len || !is_digit((unsigned char)p->s[i]))
            return fail_at(p, i, "expected a digit in the exponent");
        while (i < p->len && is_digit((unsigned char)p->s[i]))
            i++;
    }
    char buf[128], *big = NULL, *text = buf;
    size_t n = i - start;
    if (n >= sizeof buf && !(text = big = malloc(n + 1)))
        MT_FAIL(MT_ERR_NOMEM, "%s: a number of %zu characters", p->name, n);
    memcpy(text, p->s + start, n);
    text[n] = '\0';
    v->type = MT_JSON_NUMBER;
    v->number = strtod(text, NULL);
    if (integral) {
        errno = 0;
        long long ll = strtoll(text, NULL, 10);
        if (errno == 0) {
            v->is_int = 1;
            v->integer = (int64_t)ll;
        }
    }
    free(big);
    p->pos = i;
    return MT_OK;
}

/* ------------------------------------------------------------ containers */

static mt_status_t grow(parser_t *p, mt_json_t *v, size_t *cap, int keys)
{
    if (v->count < *cap)
        return MT_OK;
    size_t nc = *cap ? 2 * *cap : 8;
    mt_json_t *items = realloc(v->items, nc * sizeof *items);
    if (items)
        v->items = items;
    char **k = NULL;
    if (items && keys && (k = realloc(v->keys, nc * sizeof *k)))
        v->keys = k;
    if (!items || (keys && !k))
        MT_FAIL(MT_ERR_NOMEM, "%s: a container of %zu elements", p->name, nc);
    *cap = nc;
    return MT_OK;
}

static mt_status_t parse_container(parser_t *p, mt_json_t *v, int object)
{
    char close = object ? '}' : ']';
    size_t cap = 0;
    v->type = object ? MT_JSON_OBJECT : MT_JSON_ARRAY;
    if (++p->depth > MT_JSON_MAX_DEPTH)
        return fail_at(p, p->pos, "nesting deeper than MT_JSON_MAX_DEPTH (256) levels");
    p->pos++;
    skip_ws(p);
    if (peek(p) == close) {
        p->pos++;
        p->depth--;
        return MT_OK;
    }
    for (;;) {
        MT_TRY(grow(p, v, &cap, object));
        mt_json_t *item = &v->items[v->count];
        memset(item, 0, sizeof *item);
        if (object) {
            skip_ws(p);
            if (peek(p) != '"')
                return fail_at(p, p->pos, v->count ? "expected a member name (a string): "
                               "trailing commas are not allowed" : "expected a member name "
                               "(a string) or '}'");
            size_t at = p->pos, klen;
            char *key;
            MT_TRY(parse_string(p, &key, &klen));
            for (size_t i = 0; i < v->count; i++)
                if (strcmp(v->keys[i], key) == 0) {
                    free(key);
                    char what[300];
                    snprintf(what, sizeof what, "duplicate key \"%.200s\"", v->keys[i]);
                    return fail_at(p, at, what);
                }
            v->keys[v->count] = key;
            v->count++; /* counted now so mt_json_free releases the key */
            skip_ws(p);
            if (peek(p) != ':')
                return fail_at(p, p->pos, "expected ':' after a member name");
            p->pos++;
            MT_TRY(parse_value(p, item));
        } else {
            v->count++;
            MT_TRY(parse_value(p, item));
        }
        skip_ws(p);
        int c = peek(p);
        if (c == close) {
            p->pos++;
            p->depth--;
            return MT_OK;
        }
        if (c != ',')
            return fail_at(p, p->pos, object ? "expected ',' or '}' after an object member"
                                              : "expected ',' or ']' after an array element");
        p->pos++;
        if (!object) {
            skip_ws(p);
            if (peek(p) == ']')
                return fail_at(p, p->pos, "expected a value: trailing commas are not allowed");
        }
    }
}

/* ------------------------------------------------------------ values */

static int literal(parser_t *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return 0;
    p->pos += n;
    return 1;
}

static mt_status_t parse_value(parser_t *p, mt_json_t *v)
{
    skip_ws(p);
    v->line = (int)p->line;
    v->column = (int)(p->pos - p->line_start + 1);
    int c = peek(p);
    if (c == '{' || c == '[')
        return parse_container(p, v, c == '{');
    if (c == '"') {
        v->type = MT_JSON_STRING;
        return parse_string(p, &v->string, &v->length);
    }
    if (c == '-' || is_digit(c))
        return parse_number(p, v);
    if (literal(p, "true") || literal(p, "false")) {
        v->type = MT_JSON_BOOL;
        v->boolean = p->s[p->pos - 4] == 't'; /* "true" or "alse" */
        return MT_OK;
    }
    if (literal(p, "null")) {
        v->type = MT_JSON_NULL;
        return MT_OK;
    }
    return fail_at(p, p->pos, "expected a value (object, array, string, number, true, false "
                   "or null)");
}

static void free_tree(mt_json_t *v)
{
    for (size_t i = 0; i < v->count; i++) {
        free_tree(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
}

mt_status_t mt_json_parse(const char *text, size_t len, const char *name, mt_json_t **out)
{
    parser_t p = {text, name ? name : "JSON", len, 0, 1, 0, 0};
    *out = NULL;
    mt_json_t *v = calloc(1, sizeof *v);
    if (!v)
        MT_FAIL(MT_ERR_NOMEM, "%s: JSON root", p.name);
    mt_status_t s = parse_value(&p, v);
    if (s == MT_OK) {
        skip_ws(&p);
        if (p.pos < p.len)
            s = fail_at(&p, p.pos, "expected the end of the text after the value");
    }
    if (s != MT_OK) {
        mt_json_free(v);
        return s;
    }
    *out = v;
    return MT_OK;
}

mt_status_t mt_json_parse_file(const char *path, size_t max_bytes, mt_json_t **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        MT_FAIL(MT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || (size_t)st.st_size > max_bytes) {
        fclose(f);
        MT_FAIL(MT_ERR_IO, "%s: larger than %zu bytes, too large for a JSON file here", path,
                max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        MT_FAIL(MT_ERR_NOMEM, "%s: %zu bytes", path, n);
    }
    size_t got = fread(buf, 1, n, f);
    int bad = ferror(f);
    fclose(f);
    if (got != n || bad) {
        free(buf);
        MT_FAIL(MT_ERR_IO, "%s: read %zu of %zu bytes", path, got, n);
    }
    mt_status_t s = mt_json_parse(buf, n, path, out);
    free(buf);
    return s;
}

void mt_json_free(mt_json_t *v)
{
    if (!v)
        return;
    free_tree(v);
    free(v);
}

const mt_json_t *mt_json_get(const mt_json_t *v, const char *key)
{
    if (!v || v->type != MT_JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < v->count; i++)
        if (strcmp(v->keys[i], key) == 0)
            return &v->items[i];
    return NULL;
}

const char *mt_json_type_name(mt_json_type_t t)
{
    static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}
