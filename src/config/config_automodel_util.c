/* config_automodel_util.c: small helpers of the AutoModel recipe code
 * (config_automodel*.c): mapping lookups, class names, the ignored note.
 * It calls the parser only through the context's operations, so the
 * parser, the key table and these helpers form no cycle. */
#include "config_yaml_internal.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

const yaml_node_t *mt_cfg_map_get(mt_parse_ctx_t *c, const yaml_node_t *map, const char *key)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        if (k && k->type == YAML_SCALAR_NODE && strcmp((const char *)k->data.scalar.value, key) == 0)
            return yaml_document_get_node(c->doc, p->value);
    }
    return NULL;
}

const char *mt_cfg_scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : "";
}

/* The last dotted (or ':'-separated) component of a class path. */
const char *mt_am_class_leaf(const char *s)
{
    const char *d = strrchr(s, '.'), *colon = strrchr(s, ':');
    if (colon && (!d || colon > d))
        d = colon;
    return d ? d + 1 : s;
}

void mt_am_note_ignored(mt_config_t *cfg, const char *path)
{
    char *buf = cfg->automodel.ignored;
    size_t n = strlen(buf), cap = sizeof cfg->automodel.ignored;
    /* each path once */
    for (const char *p = strstr(buf, path); p; p = strstr(p + 1, path)) {
        size_t l = strlen(path);
        if ((p == buf || p[-1] == ' ') && (p[l] == ',' || p[l] == '\0'))
            return;
    }
    if (n + strlen(path) + 8 >= cap) {
        if (n + 5 < cap && !strstr(buf, "..."))
            strcat(buf, ", ...");
        return;
    }
    snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", path);
}

void mt_am_set_key(mt_parse_ctx_t *c, const char *mpath, const char *text, const yaml_node_t *n)
{
    int ki = mt_cfg_key_index(mpath);
    if (ki < 0) {
        mt_cfg_perr(c, n, "internal: no meshtrain key %s", mpath);
        return;
    }
    mt_cfg_set_text(c, ki, text, n);
}

bool mt_am_key_given(const mt_config_t *cfg, const char *mpath)
{
    int ki = mt_cfg_key_index(mpath);
    return ki >= 0 && cfg->key_origin[ki].kind != MT_ORIGIN_DEFAULT;
}

bool mt_am_truthy(const yaml_node_t *n)
{
    const char *s = mt_cfg_scalar(n);
    return strcasecmp(s, "true") == 0 || strcasecmp(s, "yes") == 0 || strcasecmp(s, "on") == 0;
}


bool mt_cfg_null_scalar(const yaml_node_t *n)
{
    if (!n)
        return true;
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = (const char *)n->data.scalar.value;
    return s[0] == '\0' || strcmp(s, "~") == 0 || strcasecmp(s, "null") == 0 ||
           strcasecmp(s, "none") == 0;
}
