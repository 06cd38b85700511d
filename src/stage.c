/* stage.c: host staging for collectives on backend memory (mt_stage.h). */
#include "mt_stage.h"

#include <stdlib.h>

#include "mt_comm.h"

bool mt_stage_needed(const mt_backend_t *be) { return be != mt_backend_cpu(); }

void *mt_stage_reserve(mt_stage_buf_t *s, size_t bytes)
{
    if (bytes > s->cap) {
        free(s->host);
        s->host = malloc(bytes);
        s->cap = s->host ? bytes : 0;
    }
    return s->host;
}

void mt_stage_buf_free(mt_stage_buf_t *s)
{
    free(s->host);
    s->host = NULL, s->cap = 0;
}

mt_status_t mt_stage_allreduce_sum(const mt_backend_t *be, mt_stage_buf_t *s, float *x, int n,
                                   MPI_Comm comm)
{
    if (!mt_stage_needed(be))
        return mt_allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, comm);
    size_t bytes = sizeof(float) * (size_t)n;
    float *h = mt_stage_reserve(s, bytes);
    if (!h)
        MT_FAIL(MT_ERR_NOMEM, "host staging buffer of %zu bytes for an all-reduce", bytes);
    be->copy_to_host(h, x, bytes);
    MT_TRY(mt_allreduce(MPI_IN_PLACE, h, n, MPI_FLOAT, MPI_SUM, comm));
    be->copy_to_device(x, h, bytes);
    return MT_OK;
}
