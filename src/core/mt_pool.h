/* mt_pool.h: a general-purpose allocator of offsets in one region [0, cap),
 * for the CUDA backend's device memory (cuda_setup.c: one cudaMalloc, cut
 * up by this).  Sizes are rounded up to 256 bytes, so every offset is
 * 256-byte aligned.  Best fit (the smallest free block that holds the
 * request, the lowest offset among equals); a freed block merges with
 * free neighbours, so freeing everything leaves one free block again.
 * Deterministic: the same calls give the same offsets.  Host bookkeeping
 * only; it never touches the region. */
#ifndef MT_POOL_H
#define MT_POOL_H

#include <stdbool.h>
#include <stddef.h>

#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_POOL_ALIGN 256

typedef struct {
    size_t off, size;
    bool used;
} mt_pool_block_t;

typedef struct {
    mt_pool_block_t *b; /* in offset order, covering [0, cap) */
    int n, max;
    size_t cap;         /* usable bytes (cap rounded down to the alignment) */
    size_t used, peak;  /* bytes in live allocations (rounded sizes), and their maximum */
    int live;           /* live allocations */
} mt_pool_t;

mt_status_t mt_pool_init(mt_pool_t *p, size_t cap);
/* *off of `bytes` (0 allowed: one aligned unit); false when no free block
 * holds it (or bookkeeping memory ran out). */
bool mt_pool_alloc(mt_pool_t *p, size_t bytes, size_t *off);
/* Release the allocation at off; false when off is not a live one. */
bool mt_pool_free(mt_pool_t *p, size_t off);
/* The largest free block (what one more allocation could get). */
size_t mt_pool_largest_free(const mt_pool_t *p);
void mt_pool_destroy(mt_pool_t *p);

#ifdef __cplusplus
}
#endif
#endif
