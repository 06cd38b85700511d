/* test_pool.c: the device-memory pool's allocator (src/core/pool.c), on host
 * bookkeeping only.  Random allocations and frees against a shadow map of
 * the region: live allocations never overlap, stay inside it and are
 * 256-byte aligned; used and peak add up; freeing everything merges the
 * region back into one free block; a request larger than every free block
 * fails without changing anything; best fit picks the smallest hole; the
 * same calls give the same offsets (determinism); freeing twice or an
 * unknown offset is refused. */
#include <config.h>

#include "mt_pool.h"
#include "mt_test.h"

#include <stdint.h>
#include <stdlib.h>

#define CAP ((size_t)1 << 20)
#define SLOTS 200

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* one random sequence; offsets of every successful allocation in order go to trace */
static void random_run(size_t *trace, int *ntrace)
{
    mt_pool_t p;
    CHECK(mt_pool_init(&p, CAP + 100) == MT_OK, "init");
    CHECK(p.cap == CAP, "cap rounded down to the alignment: %zu", p.cap);
    static unsigned char owner[CAP / MT_POOL_ALIGN]; /* slot + 1 per 256-byte unit, 0 free */
    memset(owner, 0, sizeof owner);
    size_t off[SLOTS], size[SLOTS];
    bool live[SLOTS] = {false};
    size_t used = 0, peak = 0;
    *ntrace = 0;
    for (int it = 0; it < 20000; it++) {
        int s = (int)(next() % SLOTS);
        if (live[s]) {
            CHECK(mt_pool_free(&p, off[s]), "free of a live block");
            for (size_t u = off[s] / MT_POOL_ALIGN; u < (off[s] + size[s]) / MT_POOL_ALIGN; u++)
                owner[u] = 0;
            used -= size[s], live[s] = false;
            continue;
        }
        size_t bytes = (size_t)(next() % 3 == 0 ? next() % 40000 : next() % 3000);
        size_t o;
        if (!mt_pool_alloc(&p, bytes, &o)) {
            size_t need = bytes ? (bytes + MT_POOL_ALIGN - 1) / MT_POOL_ALIGN * MT_POOL_ALIGN
                                : MT_POOL_ALIGN;
            CHECK(mt_pool_largest_free(&p) < need, "alloc of %zu failed with a %zu-byte hole",
                  bytes, mt_pool_largest_free(&p));
            continue;
        }
        size_t sz = bytes ? (bytes + MT_POOL_ALIGN - 1) / MT_POOL_ALIGN * MT_POOL_ALIGN
                          : MT_POOL_ALIGN;
        CHECK(o % MT_POOL_ALIGN == 0 && o + sz <= CAP, "block %zu+%zu out of place", o, sz);
        for (size_t u = o / MT_POOL_ALIGN; u < (o + sz) / MT_POOL_ALIGN && u < CAP / MT_POOL_ALIGN; u++) {
            if (owner[u]) {
                CHECK(0, "block %zu+%zu overlaps slot %d", o, sz, owner[u] - 1);
                break;
            }
            owner[u] = (unsigned char)(s + 1);
        }
        off[s] = o, size[s] = sz, live[s] = true;
        used += sz;
        if (used > peak)
            peak = used;
        trace[(*ntrace)++] = o;
        CHECK(p.used == used && p.peak == peak, "used %zu/%zu peak %zu/%zu", p.used, used, p.peak,
              peak);
    }
    for (int s = 0; s < SLOTS; s++)
        if (live[s])
            CHECK(mt_pool_free(&p, off[s]), "final free");
    CHECK(p.n == 1 && !p.b[0].used && p.b[0].size == CAP && p.used == 0 && p.live == 0,
          "everything freed: %d blocks, used %zu", p.n, p.used);
    mt_pool_destroy(&p);
}

int main(void)
{
    static size_t t1[20000], t2[20000];
    int n1, n2;
    random_run(t1, &n1);
    rng = 88172645463325252ull;
    random_run(t2, &n2);
    CHECK(n1 == n2 && memcmp(t1, t2, sizeof *t1 * (size_t)n1) == 0,
          "the same calls gave other offsets");
    CHECK(n1 > 5000, "only %d allocations succeeded", n1);

    /* best fit, refusals, exhaustion */
    mt_pool_t p;
    size_t a, b, c, d, e, x;
    CHECK(mt_pool_init(&p, 10 * 1024) == MT_OK, "init");
    CHECK(mt_pool_alloc(&p, 1024, &a) && a == 0, "a");
    CHECK(mt_pool_alloc(&p, 3000, &b) && b == 1024, "b (3000 -> 3072)");
    CHECK(mt_pool_alloc(&p, 512, &c) && c == 4096, "c");
    CHECK(mt_pool_alloc(&p, 1, &d) && d == 4608, "d (1 -> 256)");
    CHECK(mt_pool_free(&p, b) && mt_pool_free(&p, d), "holes of 3072 and the tail");
    CHECK(!mt_pool_free(&p, b), "double free refused");
    CHECK(!mt_pool_free(&p, 100), "unknown offset refused");
    CHECK(mt_pool_alloc(&p, 2000, &e) && e == 1024, "best fit takes the 3072 hole, not the tail");
    CHECK(!mt_pool_alloc(&p, 6000, &x), "no hole of 6000");
    CHECK(mt_pool_largest_free(&p) == 10 * 1024 - 4608, "tail %zu", mt_pool_largest_free(&p));
    CHECK(mt_pool_alloc(&p, 10 * 1024 - 4608, &x) && x == 4608, "the whole tail");
    CHECK(mt_pool_alloc(&p, 0, &x) && x == 3072, "256 bytes from the 1024 left of the split hole");
    CHECK(mt_pool_alloc(&p, 768, &x) && x == 3328, "the rest of it");
    CHECK(!mt_pool_alloc(&p, 0, &x), "full");
    mt_pool_destroy(&p);
    return mt_test_exit("test_pool");
}
