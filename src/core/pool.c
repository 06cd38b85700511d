/* pool.c: best-fit allocator of offsets with coalescing (mt_pool.h). */
#include "mt_pool.h"

#include <stdlib.h>
#include <string.h>

mt_status_t mt_pool_init(mt_pool_t *p, size_t cap)
{
    memset(p, 0, sizeof *p);
    p->cap = cap / MT_POOL_ALIGN * MT_POOL_ALIGN;
    p->max = 64;
    p->b = malloc(sizeof *p->b * (size_t)p->max);
    if (!p->b)
        MT_FAIL(MT_ERR_NOMEM, "memory pool bookkeeping");
    p->b[0] = (mt_pool_block_t){0, p->cap, false};
    p->n = p->cap > 0;
    return MT_OK;
}

static bool make_room(mt_pool_t *p)
{
    if (p->n < p->max)
        return true;
    mt_pool_block_t *b = realloc(p->b, sizeof *b * (size_t)p->max * 2);
    if (!b)
        return false;
    p->b = b, p->max *= 2;
    return true;
}

bool mt_pool_alloc(mt_pool_t *p, size_t bytes, size_t *off)
{
    if (bytes > p->cap)
        return false;
    size_t size = bytes == 0 ? MT_POOL_ALIGN : (bytes + MT_POOL_ALIGN - 1) / MT_POOL_ALIGN *
                                                   MT_POOL_ALIGN;
    int best = -1;
    for (int i = 0; i < p->n; i++)
        if (!p->b[i].used && p->b[i].size >= size && (best < 0 || p->b[i].size < p->b[best].size))
            best = i;
    if (best < 0)
        return false;
    if (p->b[best].size > size) { /* split: the rest stays free after it */
        if (!make_room(p))
            return false;
        memmove(&p->b[best + 2], &p->b[best + 1], sizeof *p->b * (size_t)(p->n - best - 1));
        p->b[best + 1] = (mt_pool_block_t){p->b[best].off + size, p->b[best].size - size, false};
        p->b[best].size = size;
        p->n++;
    }
    p->b[best].used = true;
    p->used += size, p->live++;
    if (p->used > p->peak)
        p->peak = p->used;
    *off = p->b[best].off;
    return true;
}

bool mt_pool_free(mt_pool_t *p, size_t off)
{
    int lo = 0, hi = p->n - 1, i = -1;
    while (lo <= hi) { /* blocks are in offset order */
        int mid = (lo + hi) / 2;
        if (p->b[mid].off == off) {
            i = mid;
            break;
        }
        if (p->b[mid].off < off)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    if (i < 0 || !p->b[i].used)
        return false;
    p->b[i].used = false;
    p->used -= p->b[i].size, p->live--;
    if (i + 1 < p->n && !p->b[i + 1].used) { /* merge the next */
        p->b[i].size += p->b[i + 1].size;
        memmove(&p->b[i + 1], &p->b[i + 2], sizeof *p->b * (size_t)(p->n - i - 2));
        p->n--;
    }
    if (i > 0 && !p->b[i - 1].used) { /* into the previous */
        p->b[i - 1].size += p->b[i].size;
        memmove(&p->b[i], &p->b[i + 1], sizeof *p->b * (size_t)(p->n - i - 1));
        p->n--;
    }
    return true;
}

size_t mt_pool_largest_free(const mt_pool_t *p)
{
    size_t m = 0;
    for (int i = 0; i < p->n; i++)
        if (!p->b[i].used && p->b[i].size > m)
            m = p->b[i].size;
    return m;
}

void mt_pool_destroy(mt_pool_t *p)
{
    free(p->b);
    memset(p, 0, sizeof *p);
}
