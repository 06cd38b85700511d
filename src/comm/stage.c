/* stage.c: host staging for collectives on backend memory (mt_stage.h). */
#include <config.h>

#include "mt_stage.h"

#include <stdint.h>
#include <stdlib.h>

#include "mt_comm.h"
#ifdef MT_HAVE_NCCL
#include "mt_cuda.h"
#include "mt_nccl.h"
#define CS ((cudaStream_t)mt_cuda_stream())
#endif

mt_status_t mt_stage_join(void *ticket)
{
#ifdef MT_HAVE_NCCL
    if (ticket)
        return mt_nccl_join_event(ticket, CS);
#endif
    (void)ticket;
    return MT_OK;
}

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
    mt_bf16_comm_free(&s->wire);
    if (s->dev)
        s->dev_be->device_free(s->dev);
    s->host = s->dev = NULL, s->cap = s->dev_cap = 0;
}

mt_status_t mt_stage_allreduce_sum(const mt_backend_t *be, mt_stage_buf_t *s, float *x, int n,
                                   MPI_Comm comm)
{
    if (!mt_stage_needed(be))
        return mt_allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, comm);
#ifdef MT_HAVE_NCCL
    mt_nccl_group_t *g = mt_nccl_for(comm);
    if (g) { /* device memory through NCCL; the compute stream waits for it */
        MT_TRY(mt_nccl_all_reduce_f32(g, x, (size_t)n, NULL, 0, CS));
        return mt_nccl_join(g, CS);
    }
#endif
    size_t bytes = sizeof(float) * (size_t)n;
    float *h = mt_stage_reserve(s, bytes);
    if (!h)
        MT_FAIL(MT_ERR_NOMEM, "host staging buffer of %zu bytes for an all-reduce", bytes);
    be->copy_to_host(h, x, bytes);
    MT_TRY(mt_allreduce(MPI_IN_PLACE, h, n, MPI_FLOAT, MPI_SUM, comm));
    be->copy_to_device(x, h, bytes);
    return MT_OK;
}

mt_status_t mt_stage_alltoallv(const mt_backend_t *be, mt_stage_buf_t *hs, mt_stage_buf_t *hr,
                               const void *send, const int *scounts, const int *sdispls,
                               void *recv, const int *rcounts, const int *rdispls,
                               MPI_Datatype row, size_t row_bytes, MPI_Comm comm,
                               void **ticket)
{
    MPI_Request rq;
    if (ticket)
        *ticket = NULL;
    if (!mt_stage_needed(be)) {
        MT_MPI_TRY(MPI_Ialltoallv(send, scounts, sdispls, row, recv, rcounts, rdispls, row, comm,
                                  &rq));
        return mt_wait_all(1, &rq);
    }
#ifdef MT_HAVE_NCCL
    mt_nccl_group_t *g = mt_nccl_for(comm);
    if (g) { /* device memory through NCCL (grouped sends and receives) */
        MT_TRY(mt_nccl_all_to_allv(g, send, scounts, sdispls, recv, rcounts, rdispls, row_bytes,
                                   CS));
        if (ticket) { /* the caller joins it (mt_stage_join) */
            *ticket = mt_nccl_last_event(g);
            return MT_OK;
        }
        return mt_nccl_join(g, CS);
    }
#endif
    int size;
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    size_t ns = 0, nr = 0; /* rows: the blocks are packed */
    for (int r = 0; r < size; r++)
        ns += (size_t)scounts[r], nr += (size_t)rcounts[r];
    void *s = mt_stage_reserve(hs, ns * row_bytes), *r = mt_stage_reserve(hr, nr * row_bytes);
    if (!s || !r)
        MT_FAIL(MT_ERR_NOMEM, "host staging buffers of %zu and %zu bytes for an all-to-all",
                ns * row_bytes, nr * row_bytes);
    be->copy_to_host(s, send, ns * row_bytes);
    MT_MPI_TRY(MPI_Ialltoallv(s, scounts, sdispls, row, r, rcounts, rdispls, row, comm, &rq));
    MT_TRY(mt_wait_all(1, &rq));
    be->copy_to_device(recv, r, nr * row_bytes);
    return MT_OK;
}

mt_status_t mt_stage_isend(const mt_backend_t *be, float *host, const float *x, int n, int dest,
                           int tag, MPI_Comm comm, MPI_Request *rq)
{
    if (host)
        be->copy_to_host(host, x, sizeof(float) * (size_t)n);
    MT_MPI_TRY(MPI_Isend(host ? host : x, n, MPI_FLOAT, dest, tag, comm, rq));
    return MT_OK;
}

mt_status_t mt_stage_irecv(float *host, float *x, int n, int src, int tag, MPI_Comm comm,
                           MPI_Request *rq)
{
    MT_MPI_TRY(MPI_Irecv(host ? host : x, n, MPI_FLOAT, src, tag, comm, rq));
    return MT_OK;
}

void mt_stage_recv_finish(const mt_backend_t *be, const float *host, float *x, int n)
{
    if (host)
        be->copy_to_device(x, host, sizeof(float) * (size_t)n);
}

#define BF16_PIECE ((int64_t)1 << 24) /* elements of one bf16 message */

mt_status_t mt_stage_allreduce_grad(const mt_backend_t *be, mt_stage_buf_t *s, float *x,
                                    int64_t n, MPI_Comm comm, bool bf16)
{
    const int64_t piece = bf16 ? BF16_PIECE : (int64_t)1 << 30;
    int size = 1;
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    if (size == 1)
        return MT_OK;
#ifdef MT_HAVE_NCCL
    mt_nccl_group_t *g = bf16 && mt_stage_needed(be) ? mt_nccl_for(comm) : NULL;
    size_t need = 2 * (size_t)(n < piece ? n : piece);
    if (g && need > s->dev_cap) {
        if (s->dev) { /* after the sums that still read it (device_free waits for them) */
            MT_TRY(mt_nccl_join(g, CS));
            s->dev_be->device_free(s->dev);
        }
        if (!(s->dev = be->device_alloc(need)))
            MT_FAIL(MT_ERR_NOMEM, "device buffer of %zu bytes for bf16 gradient sums", need);
        s->dev_cap = need, s->dev_be = be;
    }
#endif
    if (bf16 && !s->wire.ready)
        MT_TRY(mt_bf16_comm_init(&s->wire));
    for (int64_t o = 0; o < n; o += piece) {
        int k = (int)(n - o < piece ? n - o : piece);
        if (!bf16) {
            MT_TRY(mt_stage_allreduce_sum(be, s, x + o, k, comm));
            continue;
        }
#ifdef MT_HAVE_NCCL
        if (g) { /* pieces in stream order through one wire buffer */
            MT_TRY(mt_nccl_all_reduce_f32(g, x + o, (size_t)k, s->dev, 1, CS));
            continue;
        }
#endif
        /* host: [the floats, when staged] [the bf16 message] */
        bool staged = mt_stage_needed(be);
        size_t fl = staged ? sizeof(float) * (size_t)k : 0;
        char *h = mt_stage_reserve(s, fl + 2 * (size_t)k);
        if (!h)
            MT_FAIL(MT_ERR_NOMEM, "host buffers of a bf16 gradient sum (%d elements)", k);
        float *scratch = staged ? (float *)h : NULL;
        uint16_t *w = (uint16_t *)(h + fl);
        mt_bf16_pack_from(be, w, x + o, scratch, k);
        MT_TRY(mt_allreduce(MPI_IN_PLACE, w, k, s->wire.type, s->wire.sum, comm));
        mt_bf16_unpack_to(be, x + o, w, scratch, k);
    }
#ifdef MT_HAVE_NCCL
    if (g)
        return mt_nccl_join(g, CS);
#endif
    return MT_OK;
}
