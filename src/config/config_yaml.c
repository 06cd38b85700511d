/* config_yaml.c: YAML text and `section.key=value` overrides into an
 * mt_config_t, through the schema table.
 *
 * libyaml's document API gives every node its line and column.  It accepts
 * duplicate keys silently, so each mapping is checked here.  Values are
 * typed strictly: a quoted "4" is not an integer.  All problems in a file
 * are collected and reported together, each with FILE:LINE:COL and the
 * full key path.  Cross-key rules are config_validate.c's.  The one block
 * that is not schema keys, model.config (a Hugging Face config inline),
 * becomes JSON text for the hf layer to read. */
#include "config_yaml_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

/* ------------------------------------------------------------------ */
/* parse context                                                        */

typedef mt_parse_ctx_t parse_ctx_t;

static void loc_of(const parse_ctx_t *c, const yaml_node_t *n, char *buf, size_t cap)
{
    mt_origin_t o = c->origin;
    if (o.kind == MT_ORIGIN_FILE && n) {
        o.line = (int)n->start_mark.line + 1;
        o.column = (int)n->start_mark.column + 1;
    }
    mt_diag_location(c->cfg, &o, buf, cap);
}

#define PERR(c, node, ...)                                                \
    do {                                                                  \
        char loc_[MT_PATH_MAX + 64];                                      \
        char msg_[1024];                                                  \
        loc_of((c), (node), loc_, sizeof loc_);                           \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                         \
        mt_diag_add((c)->diag, "%s%s", loc_, msg_);                       \
    } while (0)

static void mark_origin(parse_ctx_t *c, mt_origin_t *dst, const yaml_node_t *n)
{
    *dst = c->origin;
    if (c->origin.kind == MT_ORIGIN_FILE && n) {
        dst->line = (int)n->start_mark.line + 1;
        dst->column = (int)n->start_mark.column + 1;
    }
}

/* ------------------------------------------------------------------ */
/* scalars                                                              */

static const char *node_kind(const yaml_node_t *n)
{
    if (!n)
        return "nothing";
    switch (n->type) {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a list";
    default: return "a scalar";
    }
}

/* Describe what was found, for "expected X, got Y". */
static void describe(const yaml_node_t *n, char *buf, size_t cap)
{
    if (mt_cfg_null_scalar(n))
        snprintf(buf, cap, "null");
    else if (n->type != YAML_SCALAR_NODE)
        snprintf(buf, cap, "%s", node_kind(n));
    else if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE)
        snprintf(buf, cap, "'%s'", (const char *)n->data.scalar.value);
    else
        snprintf(buf, cap, "the quoted string \"%s\"", (const char *)n->data.scalar.value);
}

static bool plain_scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

static bool parse_int(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0')
        return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v))
        return false;
    /* strtod accepts hex and "inf"; a config number is decimal. */
    for (const char *p = s; *p; p++)
        if (!strchr("0123456789+-.eE", *p))
            return false;
    *out = v;
    return true;
}

static bool parse_bool(const char *s, bool *out)
{
    static const char *yes[] = {"true", "yes", "on"}, *no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return *out = true, true;
        if (strcasecmp(s, no[i]) == 0)
            return *out = false, true;
    }
    return false;
}

static void enum_choices(const mt_cfg_enum_t *e, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (; e->name; e++) {
        size_t n = strlen(buf);
        snprintf(buf + n, cap - n, "%s%s", n ? " | " : "", e->name);
    }
}

/* A list of strings into dst, joined with commas (peft's module lists);
 * an item with a comma would be ambiguous, so it is refused. */
static void set_joined(parse_ctx_t *c, const mt_cfg_key_t *k, const yaml_node_t *n, char *dst)
{
    size_t len = 0;
    dst[0] = '\0';
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *e = yaml_document_get_node(c->doc, *it);
        const char *v = e && e->type == YAML_SCALAR_NODE && !mt_cfg_null_scalar(e)
                            ? (const char *)e->data.scalar.value : "";
        char eg[300];
        describe(e, eg, sizeof eg);
        if (!v[0] || strchr(v, ',') || len + strlen(v) + 2 >= MT_PATH_MAX) {
            PERR(c, e, "%s[%d]: expected a module name or pattern (no commas, %d characters in "
                 "all), got %s", k->path, (int)(it - n->data.sequence.items.start),
                 MT_PATH_MAX - 1, eg);
            return;
        }
        len += (size_t)snprintf(dst + len, MT_PATH_MAX - len, "%s%s", len ? "," : "", v);
    }
}

/* Store node into key k; report type errors. */
static void set_value(parse_ctx_t *c, int ki, const yaml_node_t *n)
{
    const mt_cfg_key_t *k = &mt_cfg_keys[ki];
    char *base = (char *)c->cfg;
    char got[300];
    const char *s = (n && n->type == YAML_SCALAR_NODE) ? (const char *)n->data.scalar.value : "";
    describe(n, got, sizeof got);

    switch (k->type) {
    case MT_T_INT:
    case MT_T_OPT_INT: {
        int64_t v;
        if (k->type == MT_T_OPT_INT && mt_cfg_null_scalar(n)) {
            mt_opt_int_t *o = (mt_opt_int_t *)(base + k->offset);
            o->set = false, o->value = 0;
            break;
        }
        if (!plain_scalar(n) || mt_cfg_null_scalar(n) || !parse_int(s, &v)) {
            PERR(c, n, "%s: expected an integer%s, got %s", k->path,
                 k->type == MT_T_OPT_INT ? " or none" : "", got);
            return;
        }
        if (k->type == MT_T_OPT_INT) {
            mt_opt_int_t *o = (mt_opt_int_t *)(base + k->offset);
            o->set = true, o->value = v;
        } else {
            *(int64_t *)(base + k->offset) = v;
        }
        break;
    }
    case MT_T_FLOAT: {
        double v;
        if (!plain_scalar(n) || mt_cfg_null_scalar(n) || !parse_float(s, &v)) {
            PERR(c, n, "%s: expected a number, got %s", k->path, got);
            return;
        }
        *(double *)(base + k->offset) = v;
        break;
    }
    case MT_T_BOOL: {
        bool v;
        if (!plain_scalar(n) || !parse_bool(s, &v)) {
            PERR(c, n, "%s: expected true or false, got %s", k->path, got);
            return;
        }
        *(bool *)(base + k->offset) = v;
        break;
    }
    case MT_T_STRING: {
        char *dst = base + k->offset;
        if (!n || (mt_cfg_null_scalar(n) && plain_scalar(n))) {
            dst[0] = '\0';
            break;
        }
        if (n->type == YAML_SEQUENCE_NODE && k->list_len == 1) {
            set_joined(c, k, n, dst);
            break;
        }
        if (!n || n->type != YAML_SCALAR_NODE) {
            PERR(c, n, "%s: expected a string, got %s", k->path, got);
            return;
        }
        if (strlen(s) >= MT_PATH_MAX) {
            PERR(c, n, "%s: string longer than %d characters", k->path, MT_PATH_MAX - 1);
            return;
        }
        strcpy(dst, s);
        break;
    }
    case MT_T_ENUM: {
        char choices[512];
        enum_choices(k->enums, choices, sizeof choices);
        if (!n || n->type != YAML_SCALAR_NODE || mt_cfg_null_scalar(n)) {
            PERR(c, n, "%s: expected one of %s, got %s", k->path, choices, got);
            return;
        }
        const mt_cfg_enum_t *e = k->enums;
        for (; e->name; e++)
            if (strcasecmp(e->name, s) == 0)
                break;
        if (!e->name) {
            const char *names[32];
            int nn = 0;
            for (const mt_cfg_enum_t *x = k->enums; x->name && nn < 32; x++)
                names[nn++] = x->name;
            const char *best = mt_closest_name(s, names, nn);
            if (best)
                PERR(c, n, "%s: expected one of %s, got %s; did you mean %s?", k->path, choices,
                     got, best);
            else
                PERR(c, n, "%s: expected one of %s, got %s", k->path, choices, got);
            return;
        }
        *(int *)(base + k->offset) = e->value;
        break;
    }
    case MT_T_FLOAT_LIST: {
        double vals[MT_MAX_LIST];
        int cnt = 0;
        if (!n || n->type != YAML_SEQUENCE_NODE) {
            PERR(c, n, "%s: expected a list of %d numbers, got %s", k->path, k->list_len, got);
            return;
        }
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             it < n->data.sequence.items.top; it++) {
            yaml_node_t *e = yaml_document_get_node(c->doc, *it);
            double v;
            char eg[300];
            describe(e, eg, sizeof eg);
            if (!plain_scalar(e) || !parse_float((const char *)e->data.scalar.value, &v)) {
                PERR(c, e, "%s[%d]: expected a number, got %s", k->path, cnt, eg);
                return;
            }
            if (cnt < MT_MAX_LIST)
                vals[cnt] = v;
            cnt++;
        }
        if (cnt != k->list_len) {
            PERR(c, n, "%s: expected a list of %d numbers, got %d", k->path, k->list_len, cnt);
            return;
        }
        memcpy(base + k->offset, vals, sizeof(double) * (size_t)cnt);
        *(int *)(base + k->count_offset) = cnt;
        break;
    }
    case MT_T_STRING_LIST: { /* kept as text: a blend's parser reads its weights */
        char (*dst)[MT_PATH_MAX] = (char (*)[MT_PATH_MAX])(base + k->offset);
        int cnt = 0;
        if (!n || (n->type != YAML_SEQUENCE_NODE && !(mt_cfg_null_scalar(n) && plain_scalar(n)))) {
            PERR(c, n, "%s: expected a list of strings, got %s", k->path, got);
            return;
        }
        yaml_node_item_t *it = n->type == YAML_SEQUENCE_NODE ? n->data.sequence.items.start : NULL;
        for (; it && it < n->data.sequence.items.top; it++, cnt++) {
            yaml_node_t *e = yaml_document_get_node(c->doc, *it);
            char eg[300];
            describe(e, eg, sizeof eg);
            if (!e || e->type != YAML_SCALAR_NODE || (plain_scalar(e) && mt_cfg_null_scalar(e)) ||
                cnt >= k->list_len || strlen((const char *)e->data.scalar.value) >= MT_PATH_MAX) {
                PERR(c, e, "%s[%d]: expected a string or a number of at most %d characters, "
                     "as one of at most %d items, got %s", k->path, cnt, MT_PATH_MAX - 1,
                     k->list_len, eg);
                return;
            }
            strcpy(dst[cnt], (const char *)e->data.scalar.value);
        }
        *(int *)(base + k->count_offset) = cnt;
        break;
    }
    }
    mark_origin(c, &c->cfg->key_origin[ki], n);
}

/* ------------------------------------------------------------------ */
/* mappings                                                             */

/* Names directly under `prefix` (keys and sections), for suggestions. */
static int child_names(const char *prefix, const char **names, int cap)
{
    size_t pl = strlen(prefix);
    int n = 0;
    for (int i = 0; i < mt_cfg_nkeys + mt_cfg_nsections && n < cap; i++) {
        const char *p = i < mt_cfg_nkeys ? mt_cfg_keys[i].path : mt_cfg_sections[i - mt_cfg_nkeys].path;
        const char *rest;
        if (pl == 0)
            rest = p;
        else if (strncmp(p, prefix, pl) == 0 && p[pl] == '.')
            rest = p + pl + 1;
        else
            continue;
        if (strchr(rest, '.'))
            continue; /* deeper */
        names[n++] = rest;
    }
    return n;
}

/* Full path elsewhere in the schema whose last component is `leaf`. */
static const char *path_with_leaf(const char *leaf)
{
    for (int i = 0; i < mt_cfg_nkeys + mt_cfg_nsections; i++) {
        const char *p = i < mt_cfg_nkeys ? mt_cfg_keys[i].path : mt_cfg_sections[i - mt_cfg_nkeys].path;
        const char *dot = strrchr(p, '.');
        if (strcmp(dot ? dot + 1 : p, leaf) == 0)
            return p;
    }
    return NULL;
}

static void unknown_key(parse_ctx_t *c, const yaml_node_t *kn, const char *prefix,
                        const char *key)
{
    const char *names[256];
    int n = child_names(prefix, names, 128);
    n += mt_am_child_names(prefix, names + n, 256 - n);
    const char *best = mt_closest_name(key, names, n);
    const char *elsewhere = path_with_leaf(key);
    char full[MT_PATH_MAX];
    snprintf(full, sizeof full, "%s%s%s", prefix, prefix[0] ? "." : "", key);
    if (best)
        PERR(c, kn, "%s: unknown key; did you mean %s?", full, best);
    else if (elsewhere)
        PERR(c, kn, "%s: unknown key; did you mean %s?", full, elsewhere);
    else if (prefix[0])
        PERR(c, kn, "%s: unknown key in section '%s'", full, prefix);
    else
        PERR(c, kn, "%s: unknown top-level section", full);
}

static void walk_mapping(parse_ctx_t *c, const yaml_node_t *map, const char *prefix);

/* The key node in [start, p) named key, or NULL. */
static const yaml_node_t *earlier_key(parse_ctx_t *c, yaml_node_pair_t *start,
                                      yaml_node_pair_t *p, const char *key)
{
    for (yaml_node_pair_t *q = start; q < p; q++) {
        yaml_node_t *qk = yaml_document_get_node(c->doc, q->key);
        if (qk && qk->type == YAML_SCALAR_NODE &&
            strcmp((const char *)qk->data.scalar.value, key) == 0)
            return qk;
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* model.config: AutoModel's inline Hugging Face config, as JSON text   */

/* A YAML node as JSON: plain scalars resolve as YAML does (null, booleans,
 * numbers), anything else is a string; nested `_target_` keys (Hydra
 * selectors) are left out, the block's own is kept for the hf layer. */
static bool node_json(parse_ctx_t *c, const yaml_node_t *n, const char *path, mt_jout_t *o,
                      int depth)
{
    char num[64];
    if (depth > 64) {
        PERR(c, n, "%s: nested too deeply", path);
        return false;
    }
    if (!n || mt_cfg_null_scalar(n)) {
        mt_jout_puts(o, "null");
        return true;
    }
    if (n->type == YAML_SCALAR_NODE) {
        const char *s = (const char *)n->data.scalar.value;
        int64_t iv;
        double dv;
        bool bv;
        if (!plain_scalar(n))
            mt_jout_string(o, s);
        else if (parse_bool(s, &bv))
            mt_jout_puts(o, bv ? "true" : "false");
        else if (parse_int(s, &iv))
            snprintf(num, sizeof num, "%lld", (long long)iv), mt_jout_puts(o, num);
        else if (parse_float(s, &dv)) {
            for (int prec = 6; prec <= 17; prec++) { /* shortest text that reads back */
                snprintf(num, sizeof num, "%.*g", prec, dv);
                if (strtod(num, NULL) == dv)
                    break;
            }
            mt_jout_puts(o, num);
        } else
            mt_jout_string(o, s);
        return true;
    }
    if (n->type == YAML_SEQUENCE_NODE) {
        mt_jout_puts(o, "[");
        int i = 0;
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             it < n->data.sequence.items.top; it++, i++) {
            char sub[MT_PATH_MAX];
            snprintf(sub, sizeof sub, "%s[%d]", path, i);
            if (i)
                mt_jout_puts(o, ",");
            if (!node_json(c, yaml_document_get_node(c->doc, *it), sub, o, depth + 1))
                return false;
        }
        mt_jout_puts(o, "]");
        return true;
    }
    mt_jout_puts(o, "{");
    int written = 0;
    yaml_node_pair_t *start = n->data.mapping.pairs.start, *top = n->data.mapping.pairs.top;
    for (yaml_node_pair_t *p = start; p < top; p++) {
        yaml_node_t *kn = yaml_document_get_node(c->doc, p->key);
        if (!kn || kn->type != YAML_SCALAR_NODE) {
            PERR(c, kn, "%s: keys must be plain names, got %s", path, node_kind(kn));
            return false;
        }
        const char *key = (const char *)kn->data.scalar.value;
        const yaml_node_t *qk = earlier_key(c, start, p, key);
        if (qk) {
            PERR(c, kn, "%s.%s: duplicate key (first defined at line %d)", path, key,
                 (int)qk->start_mark.line + 1);
            return false;
        }
        if (strcmp(key, "_target_") == 0 && depth > 0)
            continue;
        char sub[MT_PATH_MAX];
        snprintf(sub, sizeof sub, "%s.%s", path, key);
        if (written++)
            mt_jout_puts(o, ",");
        mt_jout_string(o, key);
        mt_jout_puts(o, ":");
        if (!node_json(c, yaml_document_get_node(c->doc, p->value), sub, o, depth + 1))
            return false;
    }
    mt_jout_puts(o, "}");
    return true;
}

static void set_model_config(parse_ctx_t *c, const yaml_node_t *vn)
{
    char *dst = c->cfg->model.hf_config;
    dst[0] = '\0';
    if (mt_cfg_null_scalar(vn))
        return;
    if (vn->type != YAML_MAPPING_NODE) {
        char got[300];
        describe(vn, got, sizeof got);
        PERR(c, vn, "model.config: expected a mapping (a Hugging Face config: its fields, or "
                    "pretrained_model_name_or_path), got %s", got);
        return;
    }
    mt_jout_t o = {dst, sizeof c->cfg->model.hf_config, 0, false};
    if (!node_json(c, vn, "model.config", &o, 0)) {
        dst[0] = '\0';
        return;
    }
    if (o.full) {
        dst[0] = '\0';
        PERR(c, vn, "model.config: longer than %d characters as JSON; put the fields in a "
                    "config.json and name its directory in pretrained_model_name_or_path",
             MT_HF_CONFIG_TEXT_MAX - 1);
    }
}

static void handle_pair(parse_ctx_t *c, const yaml_node_t *kn, const yaml_node_t *vn,
                        const char *prefix)
{
    const char *key = (const char *)kn->data.scalar.value;
    char path[MT_PATH_MAX];
    snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", key);

    if (mt_am_handle(c, kn, vn, path))
        return; /* AutoModel's: mapped, ignored or refused */
    if (strcmp(key, "_target_") == 0)
        return; /* AutoModel's Hydra-style class selector: meaningless here */
    if (strcmp(path, "model.config") == 0) { /* from_config's Hugging Face config */
        set_model_config(c, vn);
        return;
    }

    int si = mt_cfg_section_index(path);
    if (si >= 0) {
        if (mt_cfg_null_scalar(vn))
            return; /* `pipeline: null` is an absent block */
        if (vn->type != YAML_MAPPING_NODE) {
            char got[300];
            describe(vn, got, sizeof got);
            PERR(c, vn, "%s: expected a mapping (a section), got %s", path, got);
            return;
        }
        mark_origin(c, &c->cfg->section_origin[si], kn);
        if (strcmp(path, "peft") == 0) /* present means on (config_peft.c) */
            c->cfg->peft.enabled = true;
        walk_mapping(c, vn, path);
        return;
    }
    int ki = mt_cfg_key_index(path);
    if (ki >= 0) {
        set_value(c, ki, vn);
        return;
    }
    unknown_key(c, kn, prefix, key);
}

static void walk_mapping(parse_ctx_t *c, const yaml_node_t *map, const char *prefix)
{
    yaml_node_pair_t *start = map->data.mapping.pairs.start, *top = map->data.mapping.pairs.top;
    for (yaml_node_pair_t *p = start; p < top; p++) {
        yaml_node_t *kn = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(c->doc, p->value);
        if (!kn || kn->type != YAML_SCALAR_NODE) {
            PERR(c, kn, "%s: keys must be plain names, got %s", prefix[0] ? prefix : "(top level)",
                 node_kind(kn));
            continue;
        }
        const char *key = (const char *)kn->data.scalar.value;
        const yaml_node_t *qk = earlier_key(c, start, p, key);
        if (qk)
            PERR(c, kn, "%s%s%s: duplicate key (first defined at line %d)", prefix,
                 prefix[0] ? "." : "", key, (int)qk->start_mark.line + 1);
        else
            handle_pair(c, kn, vn, prefix);
    }
}

static void yaml_perr(mt_parse_ctx_t *c, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void yaml_perr(mt_parse_ctx_t *c, const yaml_node_t *n, const char *fmt, ...)
{
    char loc[MT_PATH_MAX + 64], msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    loc_of(c, n, loc, sizeof loc);
    mt_diag_add(c->diag, "%s%s", loc, msg);
}
static void yaml_set_node(mt_parse_ctx_t *c, int ki, const yaml_node_t *n) { set_value(c, ki, n); }
static void yaml_set_text(mt_parse_ctx_t *c, int ki, const char *text, const yaml_node_t *n);
static const mt_parse_ops_t yaml_ops = {yaml_perr, yaml_set_node, yaml_set_text};

/* ------------------------------------------------------------------ */
/* entry points                                                         */

static mt_status_t load_yaml(mt_config_t *cfg, const unsigned char *text, size_t len,
                             const char *name)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    mt_diag_t diag = {{0}, 0};

    snprintf(cfg->source_file, sizeof cfg->source_file, "%s", name);
    if (!yaml_parser_initialize(&parser))
        MT_FAIL(MT_ERR_NOMEM, "cannot initialise the YAML parser");
    yaml_parser_set_input_string(&parser, text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        mt_status_t s = mt_error_set(
            MT_ERR_CONFIG, __FILE__, __LINE__, "%s:%d:%d: malformed YAML: %s%s%s", name,
            (int)parser.problem_mark.line + 1, (int)parser.problem_mark.column + 1,
            parser.problem ? parser.problem : "parse error", parser.context ? " " : "",
            parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return s;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    parse_ctx_t c = {cfg, &doc, &diag, {MT_ORIGIN_FILE, 0, 0, 0}, &yaml_ops};
    if (root == NULL || mt_cfg_null_scalar(root)) {
        /* An empty file is all defaults. */
    } else if (root->type != YAML_MAPPING_NODE) {
        PERR(&c, root, "the top level must be a mapping of sections (model:, distributed:, ...), "
                       "got %s", node_kind(root));
    } else {
        bool recipe = mt_am_is_recipe(&c, root);
        if (recipe)
            mt_am_recipe_defaults(cfg);
        /* a recipe that cannot run says why in one line, not in a list of keys */
        if (!mt_am_first_reason(&c, root)) {
            walk_mapping(&c, root, "");
            mt_am_finish(&c, root);
        }
    }
    /* A second document is almost certainly a mistake ("---" in the middle). */
    yaml_document_t extra;
    if (diag.count == 0 && yaml_parser_load(&parser, &extra)) {
        yaml_node_t *r2 = yaml_document_get_root_node(&extra);
        if (r2)
            mt_diag_add(&diag, "%s:%d:%d: a second YAML document; a config is one document", name,
                        (int)r2->start_mark.line + 1, (int)r2->start_mark.column + 1);
        yaml_document_delete(&extra);
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return mt_diag_finish(&diag, __FILE__, __LINE__);
}

mt_status_t mt_config_load_string(mt_config_t *cfg, const char *text, const char *name)
{
    MT_TRY(load_yaml(cfg, (const unsigned char *)text, strlen(text), name));
    return MT_OK;
}

mt_status_t mt_config_load_file(mt_config_t *cfg, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        MT_FAIL(MT_ERR_CONFIG, "%s: cannot open the config file: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        MT_FAIL(MT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    }
    long n = ftell(f);
    rewind(f);
    if (n < 0 || n > (16L << 20)) {
        fclose(f);
        MT_FAIL(MT_ERR_CONFIG, "%s: not a config file (size %ld bytes)", path, n);
    }
    unsigned char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        MT_FAIL(MT_ERR_NOMEM, "%s: cannot allocate %ld bytes", path, n);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = '\0';
    mt_status_t s = load_yaml(cfg, buf, got, path);
    free(buf);
    MT_TRY(s);
    return MT_OK;
}

/* Parse `value` as one YAML node and store it in key ki. */
static void set_from_text(parse_ctx_t *c, int ki, const char *value, yaml_parser_t *parser,
                          bool *ok)
{
    yaml_document_t doc;
    yaml_parser_set_input_string(parser, (const unsigned char *)value, strlen(value));
    if (!yaml_parser_load(parser, &doc)) {
        PERR(c, NULL, "%s: cannot parse the value '%s': %s", mt_cfg_keys[ki].path, value,
             parser->problem ? parser->problem : "parse error");
        *ok = false;
        return;
    }
    c->doc = &doc;
    set_value(c, ki, yaml_document_get_root_node(&doc));
    yaml_document_delete(&doc);
}

static void yaml_set_text(mt_parse_ctx_t *c, int ki, const char *text, const yaml_node_t *n)
{
    yaml_parser_t parser;
    yaml_document_t *saved = c->doc;
    bool ok = true;
    if (!yaml_parser_initialize(&parser)) {
        yaml_perr(c, n, "cannot initialise the YAML parser");
        return;
    }
    set_from_text(c, ki, text, &parser, &ok);
    yaml_parser_delete(&parser);
    c->doc = saved;
    mark_origin(c, &c->cfg->key_origin[ki], n);
}

/* An override of an AutoModel key (seed=7, dist_env.timeout_minutes=5). */
static bool am_override(parse_ctx_t *c, const char *path, const char *value)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    bool handled = false;
    if (!yaml_parser_initialize(&parser))
        return false;
    yaml_parser_set_input_string(&parser, (const unsigned char *)value, strlen(value));
    if (yaml_parser_load(&parser, &doc)) {
        c->doc = &doc;
        handled = mt_am_handle(c, NULL, yaml_document_get_root_node(&doc), path);
        c->doc = NULL;
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&parser);
    return handled;
}

mt_status_t mt_config_override(mt_config_t *cfg, const char *assignment)
{
    mt_diag_t diag = {{0}, 0};
    int idx = cfg->noverrides;
    if (idx < (int)(sizeof cfg->overrides / sizeof cfg->overrides[0])) {
        snprintf(cfg->overrides[idx], sizeof cfg->overrides[idx], "%s", assignment);
        cfg->noverrides++;
    }
    parse_ctx_t c = {cfg, NULL, &diag, {MT_ORIGIN_OVERRIDE, 0, 0, idx}, &yaml_ops};

    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        MT_FAIL(MT_ERR_CONFIG,
                "override '%s': expected section.key=value (for example distributed.tp_size=2)",
                assignment);
    char path[MT_PATH_MAX];
    size_t pl = (size_t)(eq - assignment);
    if (pl >= sizeof path)
        MT_FAIL(MT_ERR_CONFIG, "override '%s': key too long", assignment);
    memcpy(path, assignment, pl);
    path[pl] = '\0';

    int ki = mt_cfg_key_index(path);
    if (ki < 0 && am_override(&c, path, eq + 1))
        return mt_diag_finish(&diag, __FILE__, __LINE__);
    if (ki < 0) {
        if (mt_cfg_section_index(path) >= 0)
            MT_FAIL(MT_ERR_CONFIG, "override '%s': %s is a section; set one of its keys (%s.KEY=VALUE)",
                    assignment, path, path);
        char prefix[MT_PATH_MAX];
        const char *dot = strrchr(path, '.');
        const char *leaf = dot ? dot + 1 : path;
        snprintf(prefix, sizeof prefix, "%.*s", dot ? (int)(dot - path) : 0, path);
        if (prefix[0] && mt_cfg_section_index(prefix) < 0) {
            const char *names[128];
            int n = child_names("", names, 128);
            const char *best = mt_closest_name(prefix, names, n);
            if (best)
                MT_FAIL(MT_ERR_CONFIG, "override '%s': unknown section '%s'; did you mean %s?",
                        assignment, prefix, best);
            MT_FAIL(MT_ERR_CONFIG, "override '%s': unknown section '%s'", assignment, prefix);
        }
        unknown_key(&c, NULL, prefix, leaf);
        return mt_diag_finish(&diag, __FILE__, __LINE__);
    }

    /* Setting a key inside a block makes the block present. */
    char sec[MT_PATH_MAX];
    snprintf(sec, sizeof sec, "%s", path);
    for (char *dot = strrchr(sec, '.'); dot; dot = strrchr(sec, '.')) {
        *dot = '\0';
        int si = mt_cfg_section_index(sec);
        if (si >= 0 && cfg->section_origin[si].kind == MT_ORIGIN_DEFAULT)
            mark_origin(&c, &cfg->section_origin[si], NULL);
    }

    if (am_override(&c, path, eq + 1)) /* AutoModel's meaning of a meshtrain key */
        return mt_diag_finish(&diag, __FILE__, __LINE__);
    yaml_parser_t parser;
    bool ok = true;
    if (!yaml_parser_initialize(&parser))
        MT_FAIL(MT_ERR_NOMEM, "cannot initialise the YAML parser");
    set_from_text(&c, ki, eq + 1, &parser, &ok);
    yaml_parser_delete(&parser);
    return mt_diag_finish(&diag, __FILE__, __LINE__);
}

mt_status_t mt_cfg_set_default(mt_config_t *cfg, const mt_cfg_key_t *k)
{
    mt_diag_t diag = {{0}, 0};
    parse_ctx_t c = {cfg, NULL, &diag, {MT_ORIGIN_DEFAULT, 0, 0, 0}, &yaml_ops};
    yaml_parser_t parser;
    bool ok = true;
    if (!yaml_parser_initialize(&parser))
        MT_FAIL(MT_ERR_NOMEM, "cannot initialise the YAML parser");
    set_from_text(&c, (int)(k - mt_cfg_keys), k->def, &parser, &ok);
    yaml_parser_delete(&parser);
    return mt_diag_finish(&diag, __FILE__, __LINE__);
}

void mt_config_init(mt_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < mt_cfg_nkeys; i++) {
        /* Defaults are tested to parse (tests/config/test_config_parse). */
        (void)mt_cfg_set_default(cfg, &mt_cfg_keys[i]);
        cfg->key_origin[i].kind = MT_ORIGIN_DEFAULT;
    }
    mt_error_clear();
}
