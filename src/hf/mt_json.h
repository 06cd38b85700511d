/* mt_json.h: a small, strict JSON reader (RFC 8259) for the files
 * meshtrain reads from other tools: Hugging Face config.json, safetensors
 * headers and model.safetensors.index.json.
 *
 * It parses a whole document into a tree.  It is strict: no comments, no
 * trailing commas, no NaN or Infinity, no leading zeros, no control
 * characters or invalid UTF-8 in strings, no duplicate keys in an object,
 * nothing after the value but whitespace, nesting at most MT_JSON_MAX_DEPTH.
 * A failure is an MT_ERR_IO error "NAME:LINE:COL: what was expected".
 * It does not write JSON: the writers print it directly. */
#ifndef MT_JSON_H
#define MT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_JSON_MAX_DEPTH 256

typedef enum {
    MT_JSON_NULL,
    MT_JSON_BOOL,
    MT_JSON_NUMBER,
    MT_JSON_STRING,
    MT_JSON_ARRAY,
    MT_JSON_OBJECT
} mt_json_type_t;

typedef struct mt_json mt_json_t;
struct mt_json {
    mt_json_type_t type;
    int line, column;  /* 1-based position of the value in the text */
    int boolean;       /* MT_JSON_BOOL */
    double number;     /* MT_JSON_NUMBER, as strtod reads it */
    int is_int;        /* the number is written as an integer that fits int64_t */
    int64_t integer;   /* ... and this is its exact value */
    char *string;      /* MT_JSON_STRING: UTF-8, NUL-terminated */
    size_t length;     /* its length in bytes (it may hold \u0000) */
    size_t count;      /* MT_JSON_ARRAY, MT_JSON_OBJECT: elements or members */
    mt_json_t *items;  /* the elements, or the members' values */
    char **keys;       /* MT_JSON_OBJECT: the members' keys, in text order */
};

/* Parse text[0, len) as one JSON document.  `name` (a file name) starts
 * error messages.  *out is malloc'd; free it with mt_json_free. */
mt_status_t mt_json_parse(const char *text, size_t len, const char *name, mt_json_t **out);

/* Read a whole file and parse it (files over max_bytes are refused). */
mt_status_t mt_json_parse_file(const char *path, size_t max_bytes, mt_json_t **out);

void mt_json_free(mt_json_t *v);

/* The member `key` of an object, or NULL (absent, or v is not an object). */
const mt_json_t *mt_json_get(const mt_json_t *v, const char *key);

/* "null", "boolean", "number", "string", "array", "object". */
const char *mt_json_type_name(mt_json_type_t t);

#ifdef __cplusplus
}
#endif
#endif
