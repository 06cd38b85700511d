/* data_parts.c: walking the parts of a concatenated dataset
 * (dataset.paths), for the token and mask readers alike. */
#include <config.h>

#include "mt_data.h"

void mt_dataset_each_part(const mt_dataset_t *ds, int64_t start, int64_t n, void *out,
                          size_t elem,
                          void (*read)(const mt_dataset_t *, int64_t, int64_t, void *))
{
    int p = 0;
    while (p + 1 < ds->n_parts && ds->part_start[p + 1] <= start)
        p++;
    char *o = out;
    while (n > 0) {
        int64_t at = start - ds->part_start[p], k = ds->part_start[p + 1] - start;
        if (k > n)
            k = n;
        read(&ds->parts[p], at, k, o);
        o += (size_t)k * elem, start += k, n -= k, p++;
    }
}
