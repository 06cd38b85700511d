/* hf_json.c: the JSON files Hugging Face tools write, parsed by jansson
 * with the strictness meshtrain relies on, and jansson's errors turned
 * into meshtrain's "NAME:LINE:COL: what was expected (found TOKEN)".
 *
 * jansson already refuses comments, trailing commas, NaN and Infinity,
 * leading zeros, raw control characters and invalid UTF-8; the flags add
 * duplicate keys (refused through its hash table, so in linear time) and
 * scalar documents (accepted, so that callers name the type they wanted).
 * Text after the value is refused: the EOF check stays on. */
#include "hf_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LOAD_FLAGS (JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL)
#define STR(x) #x
#define XSTR(x) STR(x)

/* jansson's wording of the structural errors a hand edit makes, in the
 * words meshtrain's messages use.  `near`, when set, is the token jansson
 * must have stopped at for the entry to apply. */
static const struct {
    const char *jansson, *near, *ours;
} phrases[] = {
    /* '}' right after '{' is an empty object, so here it follows a ',' */
    {"string or '}' expected", "'}'",
     "expected a member name (a string): trailing commas are not allowed"},
    {"string or '}' expected", NULL, "expected a member name (a string) or '}'"},
    {"':' expected", NULL, "expected ':' after a member name"},
    {"'}' expected", NULL, "expected ',' or '}' after an object member"},
    {"']' expected", NULL, "expected ',' or ']' after an array element"},
    {"unexpected token", NULL,
     "expected a value (object, array, string, number, true, false or null)"},
    {"end of file expected", NULL, "expected the end of the text after the value"},
    {"maximum parsing depth reached", NULL,
     "nesting deeper than " XSTR(MT_HF_JSON_MAX_DEPTH) " levels"},
};

/* jansson stops right after the repeated key's closing quote: the key as
 * written is the string that ends there, back to the first quote not
 * escaped by an odd run of backslashes. */
static int repeated_key(const char *text, size_t len, size_t pos, const char **key, size_t *n)
{
    if (pos < 2 || pos > len || text[pos - 1] != '"')
        return 0;
    for (size_t i = pos - 1; i-- > 0;) {
        if (text[i] != '"')
            continue;
        size_t slashes = 0;
        while (slashes < i && text[i - 1 - slashes] == '\\')
            slashes++;
        if (slashes % 2 == 0) {
            *key = text + i + 1;
            *n = pos - 2 - i;
            return 1;
        }
    }
    return 0;
}

/* "WHAT near 'TOKEN'", "WHAT near end of file" or "WHAT", reworded. */
static void describe(const json_error_t *e, const char *text, size_t len, char *out, size_t cap)
{
    char what[JSON_ERROR_TEXT_LENGTH], found[JSON_ERROR_TEXT_LENGTH + 16] = "";
    snprintf(what, sizeof what, "%s", e->text);
    char *near = strstr(what, " near ");
    if (near) {
        *near = '\0';
        near += strlen(" near ");
        snprintf(found, sizeof found, " (found %s)",
                 strcmp(near, "end of file") == 0 ? "the end of the text" : near);
    }
    const char *key;
    size_t n;
    if (strcmp(what, "duplicate object key") == 0 &&
        repeated_key(text, len, e->position < 0 ? 0 : (size_t)e->position, &key, &n)) {
        snprintf(out, cap, "duplicate key \"%.*s\"", (int)(n < 200 ? n : 200), key);
        return;
    }
    if (strncmp(what, "unable to decode byte", strlen("unable to decode byte")) == 0) {
        snprintf(out, cap, "invalid UTF-8: %s", what); /* jansson's token is no help here */
        return;
    }
    for (size_t i = 0; i < sizeof phrases / sizeof phrases[0]; i++)
        if (strcmp(what, phrases[i].jansson) == 0 &&
            (!phrases[i].near || (near && strcmp(near, phrases[i].near) == 0))) {
            snprintf(out, cap, "%s%s", phrases[i].ours, found);
            return;
        }
    snprintf(out, cap, "%s%s", what, found);
}

/* jansson's own limit is a build setting (2048 by default); the files
 * meshtrain reads nest a few levels, and this bound is the same on every
 * build. */
static int too_deep(json_t *v, int depth)
{
    if (!json_is_object(v) && !json_is_array(v))
        return 0;
    if (depth > MT_HF_JSON_MAX_DEPTH)
        return 1;
    size_t i;
    const char *key;
    json_t *x;
    if (json_is_array(v)) {
        json_array_foreach(v, i, x)
            if (too_deep(x, depth + 1))
                return 1;
    } else {
        json_object_foreach(v, key, x)
            if (too_deep(x, depth + 1))
                return 1;
    }
    return 0;
}

mt_status_t mt_hf_json_parse(const char *text, size_t len, const char *name, json_t **out)
{
    json_error_t e;
    name = name ? name : "JSON";
    *out = NULL;
    json_t *v = json_loadb(text, len, LOAD_FLAGS, &e);
    if (!v) {
        char what[JSON_ERROR_TEXT_LENGTH + 300];
        describe(&e, text, len, what, sizeof what);
        /* column 0: nothing read on the line yet */
        MT_FAIL(MT_ERR_IO, "%s:%d:%d: %s", name, e.line, e.column > 0 ? e.column : 1, what);
    }
    if (too_deep(v, 1)) {
        json_decref(v);
        MT_FAIL(MT_ERR_IO, "%s: nesting deeper than %d levels", name, MT_HF_JSON_MAX_DEPTH);
    }
    *out = v;
    return MT_OK;
}

mt_status_t mt_hf_json_load(const char *path, size_t max_bytes, json_t **out)
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
    char *buf = malloc(n ? n : 1);
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
    mt_status_t s = mt_hf_json_parse(buf, n, path, out);
    free(buf);
    return s;
}

const char *mt_hf_json_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}
