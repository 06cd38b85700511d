/* config_internal.h: the config schema table and diagnostics shared by the
 * config_*.c files.  Not installed: callers use mt_config.h. */
#ifndef MT_CONFIG_INTERNAL_H
#define MT_CONFIG_INTERNAL_H

#include "mt_config.h"

typedef enum {
    MT_T_INT,       /* int64_t */
    MT_T_OPT_INT,   /* mt_opt_int_t: an integer or none/null */
    MT_T_FLOAT,     /* double */
    MT_T_BOOL,      /* bool */
    MT_T_STRING,    /* char[MT_PATH_MAX] */
    MT_T_ENUM,      /* int-sized enum */
    MT_T_FLOAT_LIST, /* double[MT_MAX_LIST] with an int count after it */
    MT_T_STRING_LIST /* char[list_len][MT_PATH_MAX] with an int count after it */
} mt_cfg_type_t;

typedef struct {
    const char *name; /* accepted spelling */
    int value;
    bool alias;       /* not printed as the canonical name */
} mt_cfg_enum_t;

typedef struct {
    const char *path;   /* full dotted path: "distributed.pipeline.pp_schedule" */
    mt_cfg_type_t type;
    size_t offset;      /* into mt_config_t */
    size_t count_offset;/* MT_T_*_LIST: offset of the int count */
    int list_len;       /* MT_T_FLOAT_LIST: required length; MT_T_STRING_LIST: the most;
                         * MT_T_STRING: 1 when a list of strings is accepted too
                         * (joined with commas) */
    const mt_cfg_enum_t *enums;
    const char *def;    /* default, as YAML text */
    int64_t min;        /* smallest allowed value for integers */
    int64_t max;        /* largest allowed value for integers */
    const char *doc;    /* one paragraph: meaning and rule */
} mt_cfg_key_t;

typedef struct {
    const char *path;   /* "distributed.pipeline" */
    const char *doc;
} mt_cfg_section_t;

extern const mt_cfg_key_t mt_cfg_keys[];
extern const int mt_cfg_nkeys;
extern const mt_cfg_section_t mt_cfg_sections[];
extern const int mt_cfg_nsections;

int mt_cfg_key_index(const char *path);     /* -1 if unknown */
int mt_cfg_section_index(const char *path); /* -1 if unknown */
const char *mt_cfg_enum_canonical(const mt_cfg_enum_t *e, int value);
const char *mt_cfg_type_name(const mt_cfg_key_t *k);

/* Diagnostics: several problems are collected and reported together. */
typedef struct {
    char text[7168];
    int count;
} mt_diag_t;

void mt_diag_add(mt_diag_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "FILE:LINE:COL: " or "override 'a.b=c': " or "FILE: (default) " */
void mt_diag_location(const mt_config_t *cfg, const mt_origin_t *o, char *buf, size_t cap);
/* Turn collected diagnostics into an MT_ERR_CONFIG error, or MT_OK. */
mt_status_t mt_diag_finish(const mt_diag_t *d, const char *file, int line);

/* Set a key from a YAML scalar text (as in defaults and overrides); used
 * by mt_config_init to apply defaults through the same code as the file. */
mt_status_t mt_cfg_set_default(mt_config_t *cfg, const mt_cfg_key_t *k);

/* JSON text into buf[0, cap), always NUL-terminated; once something does
 * not fit, full is set and nothing more is written (config_json_text.c). */
typedef struct {
    char *buf;
    size_t cap, len;
    bool full;
} mt_jout_t;
void mt_jout_put(mt_jout_t *o, const char *s, size_t n);
void mt_jout_puts(mt_jout_t *o, const char *s);
void mt_jout_string(mt_jout_t *o, const char *s); /* quoted and escaped */

/* The peft: section's rules (config_peft.c); sets cfg->peft.enabled. */
void mt_peft_validate(mt_config_t *cfg, mt_diag_t *d);

/* Closest known name among `names` (n of them) to `word`, or NULL. */
const char *mt_closest_name(const char *word, const char *const *names, int n);

#endif
