/* pp_link.c: the pipeline executor's channels and transfers (pp_link.h,
 * mt_pp_exec.h; doc/pipeline.md "Channels, not tags", doc/gpu.md).
 *
 * MPI: a message is host memory, the activation (float32, or bf16 padded
 * to 8 bytes) then the MoE routing totals; sends are non-blocking from a
 * buffer of their own, receives block the host.  Under bf16 storage
 * (mt_backend_t.stores_bf16) the activation is bf16 bits already and is
 * copied, not converted, both ways and on NCCL too.
 *
 * NCCL: the activation stays on the device.  A send converts or copies it
 * into a device buffer of its own on the compute stream (the slot may be
 * reused before the send reads it) and is enqueued on the channel's
 * stream after it.  A receive is enqueued on the channel's stream into a
 * device buffer of its own without waiting for the compute stream (only
 * for the copy out of the buffer's previous message), so it runs as soon
 * as the peer sends, overlapping this rank's compute; the compute stream
 * waits for it and copies (widens) it into the slot.  The buffers are
 * made at setup, as many as mt_pp_sched_buffers says (a few, not one per
 * message: doc/pipeline.md "Message buffers"), and taken in turn: the k-th
 * send of a run converts into buffer k mod n once the compute stream has
 * seen the previous send from it complete; a receive's channel stream
 * waits for the previous copy out of its buffer.  The host never waits
 * for a buffer.  The
 * routing totals (host doubles) go by MPI over the channel's
 * communicator.  Each channel is connected once in mt_pp_exec_connect:
 * NCCL connects point-to-point peers at their first call, and a
 * non-blocking communicator's first call waits for the peer's, which in a
 * run would be a send that blocks. */
/* MPICH annotates MPI_STATUSES_IGNORE arguments with access sizes that
 * GCC 12 misreads as an overflow of a zero-sized region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include <config.h>

#include "pp_link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_comm.h"
#include "mt_comm_bf16.h"
#include "mt_stage.h"
#ifdef MT_HAVE_NCCL
#include "cuda_internal.h"
#include "mt_nccl.h"
#endif

#ifdef MT_HAVE_NCCL
static mt_status_t dbuf_add(const mt_backend_t *be, mt_pp_dbufs_t *p, size_t bytes,
                            const char *what, int *k);

/* Both ends agree: MIN of ok over the channel's two ranks. */
static int both_ok(const mt_pp_link_t *l, int ok)
{
    int both = 0;
    return MPI_Allreduce(&ok, &both, 1, MPI_INT, MPI_MIN, l->comm) == MPI_SUCCESS && both;
}

/* NCCL's connection of a channel, both ends at once: one float of d. */
static mt_status_t warm_up(mt_pp_exec_t *x, const mt_pp_link_t *l, float *d)
{
    mt_nccl_group_t *g = l->nccl;
    cudaStream_t cs = (cudaStream_t)mt_cuda_stream();
    mt_status_t s = l->ch.from == x->rank ? mt_nccl_send(g, d, 1, ncclFloat32, l->peer, cs)
                                          : mt_nccl_recv(g, d, 1, ncclFloat32, l->peer, cs);
    return s == MT_OK ? mt_nccl_wait(g, "connection") : s;
}

/* Every channel's NCCL communicator, connected, in the channels' order on
 * every rank (no two ranks wait at different communicators).  The two
 * ends agree before the init and before the connection: after a failure
 * a rank goes on through its channels, the peers skipping with it, so no
 * rank is left waiting for another.  The error agreed on over pp is a
 * first-hand one (a skip only follows another rank's failure). */
static mt_status_t connect_nccl(mt_pp_exec_t *x)
{
    mt_status_t own = MT_OK;
    float *d = x->be->device_alloc(sizeof(float)); /* the connections' message */
    if (!d) {
        mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "pipeline channels: 4 bytes of device "
                     "memory");
        own = MT_ERR_NOMEM;
    }
    for (int i = 0; i < x->nlinks; i++) {
        mt_pp_link_t *l = &x->links[i];
        if (!both_ok(l, own == MT_OK))
            continue;
        mt_status_t s = mt_nccl_adopt(l->comm, l->name);
        if (s == MT_OK && !(l->nccl = mt_nccl_for(l->comm))) { /* NCCL is not active */
            mt_error_set(MT_ERR_INTERNAL, __FILE__, __LINE__, "pipeline channel %s: no NCCL "
                         "group after adopting it", l->name);
            s = MT_ERR_INTERNAL;
        }
        if (!both_ok(l, s == MT_OK)) {
            own = own == MT_OK ? s : own;
            continue;
        }
        if ((s = warm_up(x, l, d)) != MT_OK) {
            mt_error_trace(__FILE__, __LINE__);
            own = own == MT_OK ? s : own;
            d = NULL; /* the failed transfer may still write it: leaked */
        }
    }
    if (d)
        x->be->device_free(d);
    return mt_agree(x->pp, own);
}

/* A run's message buffers, made at once (mt_pp_sched_buffers: taken in
 * turn, never added to mid-run, which would wait for the compute stream). */
static mt_status_t reserve_nccl(mt_pp_exec_t *x, int64_t act)
{
    int p = x->sched.p, k;
    int *n = malloc(2 * sizeof *n * (size_t)p);
    if (!n)
        MT_FAIL(MT_ERR_NOMEM, "pipeline buffer counts");
    mt_status_t st = mt_pp_sched_buffers(&x->sched, n, n + p);
    int ns = n[x->rank], nr = n[p + x->rank];
    free(n);
    MT_TRY(st);
    size_t bytes = (x->bf16 ? 2 : 4) * (size_t)act;
    for (int i = 0; i < ns; i++)
        MT_TRY(dbuf_add(x->be, &x->dsend, bytes, "send", &k));
    for (int i = 0; i < nr; i++)
        MT_TRY(dbuf_add(x->be, &x->drecv, bytes, "receive", &k));
    return MT_OK;
}
#endif

mt_status_t mt_pp_exec_connect(mt_pp_exec_t *x, const mt_backend_t *be, bool nccl, bool bf16,
                               int64_t act)
{
    x->bf16 = bf16;
    x->bits = bf16 && be->stores_bf16;
    x->be = be;
    mt_pp_channel_t *ch = NULL;
    int n = 0;
    /* the same list on every rank; agreed, so no rank skips the splits */
    mt_status_t s0 = mt_agree(x->pp, mt_pp_sched_channels(&x->sched, &ch, &n));
    if (s0 != MT_OK) {
        free(ch);
        return s0;
    }
    x->links = calloc((size_t)(n > 0 ? n : 1), sizeof *x->links);
    mt_status_t st = x->links ? MT_OK : MT_ERR_NOMEM;
    for (int i = 0; i < n; i++) { /* every pp rank takes part in every split */
        bool sender = ch[i].from == x->rank, member = sender || ch[i].to == x->rank;
        MPI_Comm c = MPI_COMM_NULL;
        int rc = MPI_Comm_split(x->pp, member ? 0 : MPI_UNDEFINED, sender ? 0 : 1, &c);
        if (rc != MPI_SUCCESS && st == MT_OK)
            st = MT_ERR_MPI;
        if (!member || c == MPI_COMM_NULL)
            continue;
        if (!x->links) {
            MPI_Comm_free(&c);
            continue;
        }
        mt_pp_link_t *l = &x->links[x->nlinks++];
        l->ch = ch[i], l->comm = c, l->peer = sender ? 1 : 0;
        snprintf(l->name, sizeof l->name, "pp %s %d->%d", ch[i].grad ? "gradients" : "activations",
                 ch[i].from, ch[i].to);
    }
    free(ch);
    if (st != MT_OK)
        mt_error_set(st, __FILE__, __LINE__, "pipeline channels: %s",
                     st == MT_ERR_NOMEM ? "out of memory" : "MPI_Comm_split failed");
    MT_TRY(mt_agree(x->pp, st)); /* no rank goes on to connect_nccl's exchanges alone */
#ifdef MT_HAVE_NCCL
    if (nccl) {
        MT_TRY(connect_nccl(x));
        return reserve_nccl(x, act);
    }
#else
    (void)nccl, (void)act;
#endif
    return MT_OK;
}

#ifdef MT_HAVE_NCCL
/* After a failed run a transfer may never complete: then the buffers
 * are left to the process's end instead of waited for. */
static void dbufs_free(const mt_backend_t *be, mt_pp_dbufs_t *p, bool failed)
{
    for (int i = 0; i < p->n && !failed; i++) { /* a transfer may still use it */
        cudaEventSynchronize((cudaEvent_t)p->free_ev[i]);
        cudaEventDestroy((cudaEvent_t)p->free_ev[i]);
        be->device_free(p->buf[i]);
    }
    free(p->buf), free(p->free_ev);
    memset(p, 0, sizeof *p);
}
#endif

void mt_pp_link_free(mt_pp_exec_t *x)
{
#ifdef MT_HAVE_NCCL
    dbufs_free(x->be, &x->dsend, x->failed);
    dbufs_free(x->be, &x->drecv, x->failed);
#endif
    for (int i = 0; i < x->nlinks; i++) {
#ifdef MT_HAVE_NCCL
        if (x->links[i].nccl) /* aborted after a failed run: nothing waits on a peer */
            mt_nccl_release(x->links[i].comm, x->failed);
#endif
        MPI_Comm_free(&x->links[i].comm);
    }
    free(x->links);
    x->links = NULL, x->nlinks = 0;
    free(x->recv_buf), free(x->scratch);
    for (int i = 0; i < x->nsend && !x->failed; i++) /* else an MPI send may still read it */
        free(x->send_buf[i]);
    free(x->send_buf), free(x->send_req);
    x->recv_buf = NULL, x->scratch = NULL, x->send_buf = NULL, x->send_req = NULL, x->nsend = 0;
}

void mt_pp_link_begin(mt_pp_exec_t *x)
{
#ifdef MT_HAVE_NCCL
    x->dsend.next = x->drecv.next = 0;
#else
    (void)x;
#endif
}

/* The link of a send or receive action. */
static mt_status_t link_of(const mt_pp_exec_t *x, const mt_pp_action_t *a, mt_pp_link_t **l)
{
    mt_pp_channel_t c = mt_pp_action_channel(a, x->rank);
    for (int i = 0; i < x->nlinks; i++)
        if (x->links[i].ch.from == c.from && x->links[i].ch.to == c.to &&
            x->links[i].ch.grad == c.grad) {
            *l = &x->links[i];
            return MT_OK;
        }
    char what[96];
    mt_pp_action_format(a, what, sizeof what);
    MT_FAIL(MT_ERR_INTERNAL, "pipeline %s: no channel (mt_pp_exec_connect not called?)", what);
}

#ifdef MT_HAVE_NCCL
/* The next buffer of pool p in turn (mt_pp_link_begin restarts the turn,
 * so a run's k-th transfer takes buffer k mod n, the order
 * mt_pp_sched_check_buffers plays).  Its free_ev marks the end of its
 * previous use, maybe in the run before, which completes (pp_buffers.c);
 * none yet: a wait on it returns at once. */
static mt_status_t dbuf_next(mt_pp_dbufs_t *p, const char *what, int *k)
{
    if (p->n < 1)
        MT_FAIL(MT_ERR_INTERNAL, "pipeline: no device %s buffers (the lists' counts disagree "
                "with the executor's)", what);
    *k = p->next;
    p->next = (p->next + 1) % p->n;
    return MT_OK;
}

/* A new buffer of pool p, the k-th. */
static mt_status_t dbuf_add(const mt_backend_t *be, mt_pp_dbufs_t *p, size_t bytes,
                            const char *what, int *k)
{
    void **b = realloc(p->buf, sizeof *b * (size_t)(p->n + 1));
    if (b)
        p->buf = b;
    void **e = realloc(p->free_ev, sizeof *e * (size_t)(p->n + 1));
    if (e)
        p->free_ev = e;
    cudaEvent_t ev = NULL;
    if (!b || !e || cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
        MT_FAIL(MT_ERR_NOMEM, "pipeline device %s buffer %d", what, p->n);
    void *d = be->device_alloc(bytes); /* zeroed, the compute stream waited for */
    if (!d) {
        cudaEventDestroy(ev);
        MT_FAIL(MT_ERR_NOMEM, "pipeline device %s buffer %d of %zu bytes", what, p->n, bytes);
    }
    p->buf[p->n] = d, p->free_ev[p->n] = ev;
    *k = p->n++;
    return MT_OK;
}

/* The activation part of a transfer through the channel's NCCL
 * communicator (the file's comment). */
static mt_status_t nccl_transfer(mt_pp_exec_t *x, const mt_pp_link_t *l, bool send, float *buf,
                                 int64_t n)
{
    mt_nccl_group_t *g = l->nccl;
    cudaStream_t cs = (cudaStream_t)mt_cuda_stream();
    ncclDataType_t t = x->bf16 ? ncclBfloat16 : ncclFloat32;
    size_t bytes = (x->bf16 ? 2 : 4) * (size_t)n;
    int k = 0;
    if (send) {
        MT_TRY(dbuf_next(&x->dsend, "send", &k));
        /* the buffer's previous send has read it */
        MT_CUDA_TRY(cudaStreamWaitEvent(cs, (cudaEvent_t)x->dsend.free_ev[k], 0));
        if (x->bf16 && !x->bits)
            mt_cuda_f32_to_bf16(x->dsend.buf[k], buf, n);
        else
            x->be->copy(x->dsend.buf[k], buf, bytes);
        MT_TRY(mt_nccl_send(g, x->dsend.buf[k], (size_t)n, t, l->peer, cs));
        MT_CUDA_TRY(cudaEventRecord((cudaEvent_t)x->dsend.free_ev[k], g->stream));
        return MT_OK;
    }
    MT_TRY(dbuf_next(&x->drecv, "receive", &k));
    /* not after the compute so far: only after the buffer's previous copy out */
    MT_CUDA_TRY(cudaStreamWaitEvent(g->stream, (cudaEvent_t)x->drecv.free_ev[k], 0));
    MT_TRY(mt_nccl_recv(g, x->drecv.buf[k], (size_t)n, t, l->peer, NULL));
    MT_TRY(mt_nccl_join(g, cs)); /* the channel's stream holds this rank's receives only */
    if (x->bf16 && !x->bits)
        mt_cuda_bf16_to_f32(buf, x->drecv.buf[k], n);
    else
        x->be->copy(buf, x->drecv.buf[k], bytes);
    MT_CUDA_TRY(cudaEventRecord((cudaEvent_t)x->drecv.free_ev[k], cs));
    return MT_OK;
}
#endif

/* A send buffer (host) whose last send has completed, or a new one of
 * `bytes`: every host message of a run has the same size. */
static mt_status_t send_buffer(mt_pp_exec_t *x, size_t bytes, int *k)
{
    for (int i = 0; i < x->nsend; i++) {
        int done = 0;
        MT_MPI_TRY(MPI_Test(&x->send_req[i], &done, MPI_STATUS_IGNORE));
        if (done) {
            *k = i;
            return MT_OK;
        }
    }
    char **b = realloc(x->send_buf, sizeof *b * (size_t)(x->nsend + 1));
    if (b)
        x->send_buf = b;
    MPI_Request *q = realloc(x->send_req, sizeof *q * (size_t)(x->nsend + 1));
    if (q)
        x->send_req = q;
    if (!b || !q || !(x->send_buf[x->nsend] = malloc(bytes)))
        MT_FAIL(MT_ERR_NOMEM, "pipeline send buffer %d", x->nsend);
    x->send_req[x->nsend] = MPI_REQUEST_NULL;
    *k = x->nsend++;
    return MT_OK;
}

/* The activation buf [n] of be's memory into a host message h (out), or
 * back from it. */
static mt_status_t move_act(mt_pp_exec_t *x, const mt_backend_t *be, char *h, float *buf,
                            int64_t n, bool out)
{
    if (!x->bf16 || x->bits) { /* float32, or bf16 storage's bits: as they are */
        size_t bytes = (x->bits ? 2 : 4) * (size_t)n;
        if (out)
            be->copy_to_host(h, buf, bytes);
        else
            be->copy_to_device(buf, h, bytes);
        return MT_OK;
    }
    if (mt_stage_needed(be) && !x->scratch &&
        !(x->scratch = malloc(sizeof(float) * (size_t)n)))
        MT_FAIL(MT_ERR_NOMEM, "pipeline bf16 staging buffer");
    if (out)
        mt_bf16_pack_from(be, (uint16_t *)h, buf, x->scratch, n);
    else
        mt_bf16_unpack_to(be, buf, (const uint16_t *)h, x->scratch, n);
    return MT_OK;
}

mt_status_t mt_pp_link_transfer(mt_pp_exec_t *x, const mt_backend_t *be, const mt_pp_action_t *a,
                                float *buf, int64_t n, double *route, int64_t nr)
{
    mt_pp_link_t *l = NULL;
    MT_TRY(link_of(x, a, &l));
    int rc, k = 0;
    bool send = a->kind == MT_PP_SEND_ACT || a->kind == MT_PP_SEND_GRAD;
    bool host_act = true;
#ifdef MT_HAVE_NCCL
    if (l->nccl) {
        MT_TRY(nccl_transfer(x, l, send, buf, n));
        x->bytes_sent += send ? (x->bf16 ? 2.0 : 4.0) * (double)n : 0.0;
        if (nr == 0)
            return MT_OK;
        host_act = false;
    }
#endif
    size_t ab = !host_act ? 0 : x->bf16 ? (2 * (size_t)n + 7) & ~(size_t)7 : 4 * (size_t)n;
    size_t mb = ab + sizeof(double) * (size_t)nr;
    /* a float32 activation alone on the CPU backend is received in place */
    bool in_place = host_act && !x->bf16 && nr == 0 && !mt_stage_needed(be);
    MPI_Request rq;
    if (send) {
        MT_TRY(send_buffer(x, mb, &k));
        if (host_act)
            MT_TRY(move_act(x, be, x->send_buf[k], buf, n, true));
        if (nr > 0)
            memcpy(x->send_buf[k] + ab, route, sizeof(double) * (size_t)nr);
        rc = MPI_Isend(x->send_buf[k], (int)mb, MPI_BYTE, l->peer, 0, l->comm, &x->send_req[k]);
        x->bytes_sent += (double)mb;
    } else if (in_place) {
        rc = MPI_Irecv(buf, (int)mb, MPI_BYTE, l->peer, 0, l->comm, &rq);
    } else {
        if (!x->recv_buf && !(x->recv_buf = malloc(mb)))
            MT_FAIL(MT_ERR_NOMEM, "pipeline receive buffer");
        rc = MPI_Irecv(x->recv_buf, (int)mb, MPI_BYTE, l->peer, 0, l->comm, &rq);
    }
    if (rc != MPI_SUCCESS) {
        char what[96];
        mt_pp_action_format(a, what, sizeof what);
        MT_FAIL(MT_ERR_MPI, "pipeline %s: MPI error %d", what, rc);
    }
    if (send)
        return MT_OK;
    MT_TRY(mt_wait_all(1, &rq));
    if (!in_place) {
        if (host_act)
            MT_TRY(move_act(x, be, x->recv_buf, buf, n, false));
        if (nr > 0)
            memcpy(route, x->recv_buf + ab, sizeof(double) * (size_t)nr);
    }
    return MT_OK;
}
