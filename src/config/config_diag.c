/* config_diag.c: collected config diagnostics, their locations, and the
 * edit distance behind "did you mean".  Reports nothing itself: the
 * parsers and validation add to an mt_diag_t and finish it. */
#include "config_internal.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>


void mt_diag_add(mt_diag_t *d, const char *fmt, ...)
{
    size_t n = strlen(d->text);
    va_list ap;
    d->count++;
    if (n + 2 >= sizeof d->text)
        return;
    if (n > 0)
        d->text[n++] = '\n', d->text[n] = '\0';
    va_start(ap, fmt);
    vsnprintf(d->text + n, sizeof d->text - n, fmt, ap);
    va_end(ap);
}

void mt_diag_location(const mt_config_t *cfg, const mt_origin_t *o, char *buf, size_t cap)
{
    const char *file = cfg->source_file[0] ? cfg->source_file : "(no config file)";
    switch (o->kind) {
    case MT_ORIGIN_FILE:
        snprintf(buf, cap, "%s:%d:%d: ", file, o->line, o->column);
        break;
    case MT_ORIGIN_OVERRIDE:
        if (o->index >= 0 && o->index < cfg->noverrides)
            snprintf(buf, cap, "override '%s': ", cfg->overrides[o->index]);
        else
            snprintf(buf, cap, "override #%d: ", o->index + 1);
        break;
    default:
        snprintf(buf, cap, "%s: (default) ", file);
    }
}

mt_status_t mt_diag_finish(const mt_diag_t *d, const char *file, int line)
{
    if (d->count == 0)
        return MT_OK;
    return mt_error_set(MT_ERR_CONFIG, file, line, "%s", d->text);
}

int mt_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int row[128];
    if (lb >= sizeof row / sizeof row[0])
        return 1 << 20;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int cost = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]) ? 0 : 1;
            int best = diag + cost;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            if (up + 1 < best)
                best = up + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *mt_closest_name(const char *word, const char *const *names, int n)
{
    const char *best = NULL;
    int best_d = 1 << 20;
    for (int i = 0; i < n; i++) {
        int d = mt_edit_distance(word, names[i]);
        if (d < best_d)
            best_d = d, best = names[i];
    }
    /* A suggestion must be plausibly a typo, not any name at all. */
    int len = (int)strlen(word);
    int limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    return best_d <= limit ? best : NULL;
}

