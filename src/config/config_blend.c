/* config_blend.c: the structure of a dataset.paths list (mt_config.h):
 * plain paths concatenated, or AutoModel's zipped weight/path blend.
 * Only the list's shape and its weights are checked here; the files are
 * the data layer's. */
#include "config_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* An item is a weight when all of it reads as a number. */
static bool as_number(const char *s, double *v)
{
    char *end;
    if (!s[0])
        return false;
    *v = strtod(s, &end);
    while (*end == ' ')
        end++;
    return *end == '\0';
}

int mt_blend_spec_parse(const char (*items)[MT_PATH_MAX], int n, mt_blend_spec_t *out, char *why,
                        size_t cap)
{
    memset(out, 0, sizeof *out);
    why[0] = '\0';
    if (n < 1) {
        snprintf(why, cap, "the list is empty");
        return n;
    }
    if (n > MT_DATA_MAX_PATHS) {
        snprintf(why, cap, "more than %d items", MT_DATA_MAX_PATHS);
        return n;
    }
    double w;
    for (int i = 0; i < n; i++)
        out->weighted |= as_number(items[i], &w);
    if (out->weighted && !as_number(items[0], &w)) {
        snprintf(why, cap, "\"%s\": a blend starts with a weight (the list mixes numbers and "
                 "paths: [W1, P1, W2, P2, ...])", items[0]);
        return 0;
    }
    int ns = 0;
    for (int i = 0; i < n; i++) {
        if (as_number(items[i], &w)) {
            if (!isfinite(w) || w <= 0) {
                snprintf(why, cap, "weight %s: a blend weight must be a positive number (an "
                         "entry that should not be drawn is left out of the list)", items[i]);
                return i;
            }
            double next;
            if (i + 1 == n || as_number(items[i + 1], &next)) {
                snprintf(why, cap, "weight %s is not followed by a path", items[i]);
                return i;
            }
            out->weight[out->n] = w;
            out->first[out->n++] = ns;
            continue;
        }
        if (!items[i][0]) {
            snprintf(why, cap, "an empty path");
            return i;
        }
        if (!out->weighted && out->n == 0) { /* a plain list: one entry */
            out->weight[0] = 1;
            out->first[0] = 0;
            out->n = 1;
        }
        out->shard[ns++] = i;
    }
    out->first[out->n] = ns;
    return -1;
}

void mt_config_key_where(const mt_config_t *cfg, const char *path, char *buf, size_t cap)
{
    mt_origin_t o = {MT_ORIGIN_DEFAULT, 0, 0, 0};
    int ki = mt_cfg_key_index(path);
    if (ki >= 0)
        o = cfg->key_origin[ki];
    mt_diag_location(cfg, &o, buf, cap);
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == ' ' || buf[n - 1] == ':'))
        buf[--n] = '\0';
}
