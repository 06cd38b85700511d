/* config_yaml_internal.h: the YAML parse context, shared by config_yaml.c
 * (meshtrain's own keys) and config_automodel.c (AutoModel's recipe keys
 * that are not meshtrain's).  Not installed. */
#ifndef MT_CONFIG_YAML_INTERNAL_H
#define MT_CONFIG_YAML_INTERNAL_H

#include "config_internal.h"

#include <yaml.h>

struct mt_parse_ctx;

/* What the parser (config_yaml.c) lends the AutoModel code through the
 * context, so that neither calls the other's functions both ways. */
typedef struct {
    /* one diagnostic at node n ("FILE:LINE:COL: ...") */
    void (*perr)(struct mt_parse_ctx *c, const yaml_node_t *n, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* store node n into schema key ki, typed strictly, recording its origin */
    void (*set_node)(struct mt_parse_ctx *c, int ki, const yaml_node_t *n);
    /* store YAML text (as in an override) into key ki, the origin that of node n */
    void (*set_text)(struct mt_parse_ctx *c, int ki, const char *text, const yaml_node_t *n);
} mt_parse_ops_t;

typedef struct mt_parse_ctx {
    mt_config_t *cfg;
    yaml_document_t *doc;
    mt_diag_t *diag;
    mt_origin_t origin; /* template: kind and override index */
    const mt_parse_ops_t *ops;
} mt_parse_ctx_t;

#define mt_cfg_perr(c, ...) ((c)->ops->perr((c), __VA_ARGS__))
#define mt_cfg_set_node(c, ki, n) ((c)->ops->set_node((c), (ki), (n)))
#define mt_cfg_set_text(c, ki, t, n) ((c)->ops->set_text((c), (ki), (t), (n)))
/* null, ~, none or empty, plain (config_automodel_util.c) */
bool mt_cfg_null_scalar(const yaml_node_t *n);
/* The value of key `key` in mapping `map`, or NULL. */
const yaml_node_t *mt_cfg_map_get(mt_parse_ctx_t *c, const yaml_node_t *map, const char *key);
/* A scalar's text, or "" for anything else. */
const char *mt_cfg_scalar(const yaml_node_t *n);

/* ---- AutoModel recipes (config_automodel.c) ---- */

/* A file with a top-level `recipe:` key is an AutoModel recipe; its
 * defaults are AutoModel's (mt_am_recipe_defaults, before the walk). */
bool mt_am_is_recipe(mt_parse_ctx_t *c, const yaml_node_t *root);
void mt_am_recipe_defaults(mt_config_t *cfg);
/* The one reason a recipe cannot run (recipe class, model class, FP8,
 * an optimizer meshtrain lacks, ...), reported alone; true when there is
 * one.  Python-built datasets are the trainer's refusal, not this. */
bool mt_am_first_reason(mt_parse_ctx_t *c, const yaml_node_t *root);
/* An AutoModel key at `path`: mapped, ignored (noted) or refused.  True
 * when handled; false leaves it to meshtrain's schema. */
bool mt_am_handle(mt_parse_ctx_t *c, const yaml_node_t *kn, const yaml_node_t *vn,
                  const char *path);
/* After the walk: defaults that depend on which sections were present. */
void mt_am_finish(mt_parse_ctx_t *c, const yaml_node_t *root);
/* AutoModel names directly under `prefix`, for "did you mean". */
int mt_am_child_names(const char *prefix, const char **names, int cap);

/* config_automodel_util.c, shared by config_automodel*.c */
const char *mt_am_class_leaf(const char *s);
void mt_am_note_ignored(mt_config_t *cfg, const char *path);
void mt_am_set_key(mt_parse_ctx_t *c, const char *mpath, const char *text, const yaml_node_t *n);
bool mt_am_key_given(const mt_config_t *cfg, const char *mpath);
bool mt_am_truthy(const yaml_node_t *n);
void mt_am_fn_dataset(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg);

#endif
