/* tokenizer_buf.c: the growable id and text buffers encode and decode
 * fill, shared by every tokenizer kind. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

void mt_ids_free(mt_ids_t *ids)
{
    free(ids->v);
    memset(ids, 0, sizeof *ids);
}

void mt_text_free(mt_text_t *t)
{
    free(t->s);
    memset(t, 0, sizeof *t);
}

mt_status_t mt_tok_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return MT_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem)
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: buffer of %zu elements is too large", need);
        c *= 2;
    }
    void *q = realloc(*p, c * elem);
    if (!q)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory for %zu elements", c);
    *p = q;
    *cap = c;
    return MT_OK;
}

mt_status_t mt_ids_push(mt_ids_t *ids, int32_t id)
{
    MT_TRY(mt_tok_grow((void **)&ids->v, &ids->cap, ids->n + 1, sizeof *ids->v));
    ids->v[ids->n++] = id;
    return MT_OK;
}

mt_status_t mt_text_append(mt_text_t *t, const char *s, size_t n)
{
    MT_TRY(mt_tok_grow((void **)&t->s, &t->cap, t->n + n + 1, 1));
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = '\0';
    return MT_OK;
}
