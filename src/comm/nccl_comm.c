/* nccl_comm.c: NCCL communicators per mesh group, collectives on their own
 * streams, and the timeout (see mt_nccl.h for the contract).
 *
 * A communicator is made by broadcasting rank 0's ncclUniqueId over the
 * group's MPI communicator and calling ncclCommInitRankConfig with
 * blocking = 0; init and every collective may return ncclInProgress, and
 * nccl_poll() then waits on ncclCommGetAsyncError with the timeout.  Groups
 * are created one after the other in mt_group_t order, which every rank
 * follows, so no two ranks wait on different communicators' inits.
 * It does not retry or shrink after a failure: an aborted communicator
 * stays aborted and the run ends (the job restarts from a checkpoint). */
#include "config.h"

#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_internal.h"
#include "mt_clock.h"
#include "mt_nccl.h"

static void nap(void)
{
    const struct timespec ts = {0, 200000}; /* 0.2 ms: cheap, and quick enough */
    nanosleep(&ts, NULL);
}

/* guards the groups' watchdog fields and their aborts (the watchdog thread) */
static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;

static mt_status_t fail_abort(mt_nccl_group_t *g, const char *what, const char *why)
{
    mt_error_set(MT_ERR_MPI, __FILE__, __LINE__, "NCCL %s on axis %s (rank %d of %d): %s", what,
                 g->axis, g->rank, g->size, why);
    mt_error_hint("another rank of this %s group failed or hangs: look at the first rank that "
                  "reported an error; NCCL_DEBUG=WARN says more; distributed.timeout_s sets the "
                  "wait",
                  g->axis);
    pthread_mutex_lock(&wd_lock); /* the watchdog may be looking at it */
    if (g->comm) {
        ncclCommAbort(g->comm);
        g->comm = NULL;
    }
    pthread_mutex_unlock(&wd_lock);
    return MT_ERR_MPI;
}

/* After a non-blocking NCCL call: wait while the communicator reports
 * ncclInProgress, up to the timeout. */
static mt_status_t nccl_poll(mt_nccl_group_t *g, ncclResult_t rc, const char *what)
{
    if (rc != ncclSuccess && rc != ncclInProgress)
        return fail_abort(g, what, ncclGetErrorString(rc));
    const double t0 = mt_now_s();
    for (;;) {
        ncclResult_t st = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(g->comm, &st);
        if (q != ncclSuccess)
            return fail_abort(g, what, ncclGetErrorString(q));
        if (st == ncclSuccess)
            return MT_OK;
        if (st != ncclInProgress)
            return fail_abort(g, what, ncclGetErrorString(st));
        if (mt_now_s() - t0 > g->timeout_s) {
            char why[96];
            snprintf(why, sizeof why, "still in progress after %.0f s", g->timeout_s);
            return fail_abort(g, what, why);
        }
        nap();
    }
}

mt_status_t mt_nccl_group_init(mt_nccl_group_t *g, MPI_Comm comm, const char *axis,
                               double timeout_s)
{
    memset(g, 0, sizeof *g);
    g->axis = axis;
    g->timeout_s = timeout_s > 0 ? timeout_s : 600.0;
    MT_MPI_TRY(MPI_Comm_rank(comm, &g->rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &g->size));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    int ok = 1; /* rank 0's ncclGetUniqueId, told to all so that none waits alone */
    ncclResult_t rc0 = ncclSuccess;
    if (g->rank == 0)
        ok = (rc0 = ncclGetUniqueId(&id)) == ncclSuccess;
    MT_MPI_TRY(MPI_Bcast(&ok, 1, MPI_INT, 0, comm));
    if (!ok)
        MT_FAIL(MT_ERR_MPI, "ncclGetUniqueId for axis %s failed on its rank 0%s%s", axis,
                g->rank == 0 ? ": " : "", g->rank == 0 ? ncclGetErrorString(rc0) : "");
    MT_MPI_TRY(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, comm));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&g->comm, g->size, id, g->rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress)
        MT_FAIL(MT_ERR_MPI, "ncclCommInitRankConfig for axis %s: %s", axis,
                ncclGetErrorString(rc));
    MT_TRY(nccl_poll(g, rc, "communicator init"));
    MT_CUDA_TRY(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    MT_CUDA_TRY(cudaEventCreateWithFlags(&g->ready, cudaEventDisableTiming));
    for (int i = 0; i < 64; i++)
        MT_CUDA_TRY(cudaEventCreateWithFlags(&g->ev[i], cudaEventDisableTiming));
    return MT_OK;
}

void mt_nccl_group_free(mt_nccl_group_t *g)
{
    if (g->comm) {
        /* finalize is non-blocking too; poll it, then destroy */
        if (nccl_poll(g, ncclCommFinalize(g->comm), "communicator finalize") == MT_OK)
            ncclCommDestroy(g->comm);
        g->comm = NULL; /* on failure nccl_poll() has aborted it */
    }
    for (int i = 0; i < 64; i++)
        if (g->ev[i])
            cudaEventDestroy(g->ev[i]);
    if (g->ready)
        cudaEventDestroy(g->ready);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    memset(g, 0, sizeof *g);
}

mt_status_t mt_nccl_init(mt_nccl_t *n, const mt_mesh_t *mesh, double timeout_s)
{
    memset(n, 0, sizeof *n);
    n->timeout_s = timeout_s > 0 ? timeout_s : 600.0;
    for (int gi = 0; gi < MT_NGROUPS; gi++) {
        if (mesh->group[gi] == MPI_COMM_NULL || gi == MT_GROUP_PP)
            continue;
        int size = 1;
        MT_MPI_TRY(MPI_Comm_size(mesh->group[gi], &size));
        if (size == 1)
            continue;
        for (int gj = 0; gj < gi && !n->alias[gi]; gj++) { /* the same members: share */
            int res = MPI_UNEQUAL;
            if (n->group[gj].comm && MPI_Comm_compare(mesh->group[gi], mesh->group[gj], &res) ==
                                         MPI_SUCCESS && (res == MPI_IDENT || res == MPI_CONGRUENT))
                n->alias[gi] = gj + 1;
        }
        if (n->alias[gi])
            continue;
        const mt_status_t s =
            mt_nccl_group_init(&n->group[gi], mesh->group[gi], mt_group_name((mt_group_t)gi),
                               timeout_s);
        if (s != MT_OK) {
            mt_error_trace(__FILE__, __LINE__);
            mt_nccl_free(n);
            return s;
        }
    }
    return MT_OK;
}

void mt_nccl_free(mt_nccl_t *n)
{
    for (int gi = MT_NGROUPS - 1; gi >= 0; gi--)
        mt_nccl_group_free(&n->group[gi]);
}

/* ------------------------------------------------------------------ collectives */

/* the group's stream waits for the compute stream's work so far (none
 * when compute is NULL) */
static mt_status_t begin(mt_nccl_group_t *g, cudaStream_t compute, const char *what)
{
    if (!g->comm)
        MT_FAIL(MT_ERR_INTERNAL, "NCCL %s on axis %s: no communicator (not created or aborted)",
                what, g->axis ? g->axis : "?");
    if (!compute)
        return MT_OK;
    MT_CUDA_TRY(cudaEventRecord(g->ready, compute));
    MT_CUDA_TRY(cudaStreamWaitEvent(g->stream, g->ready, 0));
    return MT_OK;
}

static mt_status_t end(mt_nccl_group_t *g, ncclResult_t rc, const char *what)
{
    MT_TRY(nccl_poll(g, rc, what));
    pthread_mutex_lock(&wd_lock);
    const cudaError_t e = cudaEventRecord(g->ev[g->ev_next], g->stream);
    g->ev_next = (g->ev_next + 1) % 64;
    g->last = what, g->last_t = mt_now_s(), g->pending = 1;
    pthread_mutex_unlock(&wd_lock);
    if (e != cudaSuccess)
        return mt_error_cuda((int)e, "cudaEventRecord", __FILE__, __LINE__);
    return MT_OK;
}

/* ------------------------------------------------------------------ active groups, watchdog */

/* communicators adopted outside the mesh (mt_nccl_adopt): the expert
 * replicas' and the pipeline's channels (two a neighbour pair and more
 * with interleaved stages) */
#define MT_NCCL_EXTRA 64

static struct {
    MPI_Comm comm[MT_NGROUPS + MT_NCCL_EXTRA];
    mt_nccl_group_t *group[MT_NGROUPS + MT_NCCL_EXTRA];
    mt_nccl_group_t *extra[MT_NCCL_EXTRA]; /* owned here */
    int n, nextra, device, world_rank;
    double timeout_s; /* for adopted groups */
    volatile int stop;
    pthread_t thread;
    int running;
} wd;

/* A collective that hangs or failed: say which, abort every communicator
 * (NCCL kernels waiting on a peer return), end the process. */
static void fire(mt_nccl_group_t *g, const char *why)
{
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    fprintf(stderr, "meshtrain: rank %d (%s): NCCL %s on axis %s (rank %d of %d): %s\n"
                    "  hint: another rank of this %s group failed, hangs or is slower by more "
                    "than distributed.timeout_s; the first rank to report an error is the "
                    "place to look (NCCL_DEBUG=WARN says more); aborting the communicators "
                    "and this process\n",
            wd.world_rank, host, g->last ? g->last : "collective", g->axis, g->rank, g->size, why,
            g->axis);
    fflush(stderr);
    for (int i = 0; i < wd.n; i++) /* (a group may be listed twice: aliases) */
        if (wd.group[i]->comm) {
            ncclCommAbort(wd.group[i]->comm);
            wd.group[i]->comm = NULL;
        }
    _exit(3);
}

static void *watchdog(void *arg)
{
    (void)arg;
    cudaSetDevice(wd.device);
    const struct timespec tick = {0, 100000000}; /* 0.1 s */
    while (!wd.stop) {
        nanosleep(&tick, NULL);
        pthread_mutex_lock(&wd_lock);
        for (int i = 0; i < wd.n && !wd.stop; i++) {
            mt_nccl_group_t *g = wd.group[i];
            if (!g->comm || !g->pending)
                continue;
            const cudaError_t e = cudaEventQuery(mt_nccl_last_event(g));
            if (e == cudaSuccess) {
                g->pending = 0;
                continue;
            }
            ncclResult_t st = ncclSuccess;
            if (ncclCommGetAsyncError(g->comm, &st) == ncclSuccess && st != ncclSuccess &&
                st != ncclInProgress)
                fire(g, ncclGetErrorString(st));
            if (e != cudaErrorNotReady)
                fire(g, cudaGetErrorString(e));
            if (mt_now_s() - g->last_t > g->timeout_s) {
                char why[96];
                snprintf(why, sizeof why, "did not complete in %.0f s (distributed.timeout_s)",
                         g->timeout_s);
                fire(g, why);
            }
        }
        pthread_mutex_unlock(&wd_lock);
    }
    return NULL;
}

mt_status_t mt_nccl_activate(mt_nccl_t *n, const mt_mesh_t *mesh)
{
    mt_nccl_deactivate();
    wd.n = 0;
    for (int gi = 0; gi < MT_NGROUPS; gi++) {
        mt_nccl_group_t *g = n->alias[gi] ? &n->group[n->alias[gi] - 1] : &n->group[gi];
        if (g->comm && mesh->group[gi] != MPI_COMM_NULL) {
            wd.comm[wd.n] = mesh->group[gi];
            wd.group[wd.n++] = g;
        }
    }
    MT_CUDA_TRY(cudaGetDevice(&wd.device));
    wd.world_rank = mesh->rank;
    wd.timeout_s = n->timeout_s;
    wd.stop = 0;
    if (pthread_create(&wd.thread, NULL, watchdog, NULL) != 0)
        MT_FAIL(MT_ERR_INTERNAL, "cannot start the NCCL watchdog thread");
    wd.running = 1;
    return MT_OK;
}

void mt_nccl_deactivate(void)
{
    if (wd.running) {
        wd.stop = 1;
        pthread_join(wd.thread, NULL);
        wd.running = 0;
    }
    for (int i = 0; i < wd.nextra; i++) {
        mt_nccl_group_free(wd.extra[i]);
        free(wd.extra[i]);
    }
    wd.n = wd.nextra = 0;
}

mt_status_t mt_nccl_adopt(MPI_Comm comm, const char *axis)
{
    if (!wd.running || comm == MPI_COMM_NULL || mt_nccl_for(comm))
        return MT_OK;
    int size = 1;
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    if (size == 1)
        return MT_OK;
    /* what can fail here alone is agreed on first: no rank is left in the
     * init's broadcast */
    mt_nccl_group_t *g = wd.nextra < MT_NCCL_EXTRA ? calloc(1, sizeof *g) : NULL;
    int ok = g != NULL, all = 0;
    MT_MPI_TRY(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm));
    if (!all) {
        free(g);
        if (wd.nextra == MT_NCCL_EXTRA)
            MT_FAIL(MT_ERR_INTERNAL, "NCCL: more than %d communicators outside the mesh",
                    MT_NCCL_EXTRA);
        MT_FAIL(MT_ERR_NOMEM, "NCCL group for %s%s", axis, ok ? " (on another rank)" : "");
    }
    mt_status_t s = mt_nccl_group_init(g, comm, axis, wd.timeout_s);
    if (s != MT_OK) {
        mt_nccl_group_free(g);
        free(g);
        return s;
    }
    pthread_mutex_lock(&wd_lock); /* the watchdog walks the list */
    wd.extra[wd.nextra++] = g;
    wd.comm[wd.n] = comm, wd.group[wd.n] = g;
    wd.n++;
    pthread_mutex_unlock(&wd_lock);
    return MT_OK;
}

void mt_nccl_release(MPI_Comm comm, bool abort)
{
    pthread_mutex_lock(&wd_lock); /* the watchdog walks the list */
    mt_nccl_group_t *g = NULL;
    for (int i = 0; i < wd.nextra && !g; i++)
        if (wd.comm[wd.n - wd.nextra + i] == comm && comm != MPI_COMM_NULL) {
            g = wd.extra[i];
            for (int j = i; j + 1 < wd.nextra; j++)
                wd.extra[j] = wd.extra[j + 1];
            for (int j = wd.n - wd.nextra + i; j + 1 < wd.n; j++)
                wd.comm[j] = wd.comm[j + 1], wd.group[j] = wd.group[j + 1];
            wd.nextra--, wd.n--;
        }
    pthread_mutex_unlock(&wd_lock);
    if (g) {
        if (abort && g->comm) { /* no finalize that would wait for pending work */
            ncclCommAbort(g->comm);
            g->comm = NULL;
        }
        mt_nccl_group_free(g);
        free(g);
    }
}

mt_nccl_group_t *mt_nccl_for(MPI_Comm comm)
{
    if (comm == MPI_COMM_NULL)
        return NULL;
    for (int i = 0; i < wd.n; i++)
        if (wd.comm[i] == comm)
            return wd.group[i];
    return NULL;
}

mt_status_t mt_nccl_all_reduce(mt_nccl_group_t *g, const void *send, void *recv, size_t count,
                               ncclDataType_t type, ncclRedOp_t op, cudaStream_t compute)
{
    MT_TRY(begin(g, compute, "all_reduce"));
    MT_TRY(end(g, ncclAllReduce(send, recv, count, type, op, g->comm, g->stream), "all_reduce"));
    return MT_OK;
}

mt_status_t mt_nccl_all_gather(mt_nccl_group_t *g, const void *send, void *recv, size_t count,
                               ncclDataType_t type, cudaStream_t compute)
{
    MT_TRY(begin(g, compute, "all_gather"));
    MT_TRY(end(g, ncclAllGather(send, recv, count, type, g->comm, g->stream), "all_gather"));
    return MT_OK;
}

mt_status_t mt_nccl_reduce_scatter(mt_nccl_group_t *g, const void *send, void *recv,
                                   size_t count, ncclDataType_t type, ncclRedOp_t op,
                                   cudaStream_t compute)
{
    MT_TRY(begin(g, compute, "reduce_scatter"));
    MT_TRY(end(g, ncclReduceScatter(send, recv, count, type, op, g->comm, g->stream),
               "reduce_scatter"));
    return MT_OK;
}

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
#endif
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

mt_status_t mt_nccl_all_to_all(mt_nccl_group_t *g, const void *send, void *recv, size_t count,
                               ncclDataType_t type, cudaStream_t compute)
{
    MT_TRY(begin(g, compute, "all_to_all"));
    const size_t block = count * type_size(type);
    ncclResult_t rc = ncclGroupStart();
    for (int r = 0; r < g->size && (rc == ncclSuccess || rc == ncclInProgress); r++) {
        rc = ncclSend((const char *)send + (size_t)r * block, count, type, r, g->comm, g->stream);
        if (rc == ncclSuccess || rc == ncclInProgress)
            rc = ncclRecv((char *)recv + (size_t)r * block, count, type, r, g->comm, g->stream);
    }
    const ncclResult_t rc_end = ncclGroupEnd();
    MT_TRY(end(g, rc != ncclSuccess && rc != ncclInProgress ? rc : rc_end, "all_to_all"));
    return MT_OK;
}

mt_status_t mt_nccl_send(mt_nccl_group_t *g, const void *buf, size_t count, ncclDataType_t type,
                         int peer, cudaStream_t compute)
{
    MT_TRY(begin(g, compute, "send"));
    MT_TRY(end(g, ncclSend(buf, count, type, peer, g->comm, g->stream), "send"));
    return MT_OK;
}

mt_status_t mt_nccl_recv(mt_nccl_group_t *g, void *buf, size_t count, ncclDataType_t type,
                         int peer, cudaStream_t compute)
{
    MT_TRY(begin(g, compute, "recv"));
    MT_TRY(end(g, ncclRecv(buf, count, type, peer, g->comm, g->stream), "recv"));
    return MT_OK;
}

/* ------------------------------------------------------------------ uneven parts, bf16 */

static int max_count(const int *counts, int n)
{
    int m = 0;
    for (int r = 0; r < n; r++)
        m = counts[r] > m ? counts[r] : m;
    return m;
}

/* dst <- src, n elements, both float32 or (wire side bf16) converted, on g's stream */
static mt_status_t move(mt_nccl_group_t *g, void *dst, const void *src, int64_t n, int to_wire,
                        int bf16)
{
    if (n <= 0)
        return MT_OK;
    if (bf16) {
        mt_cuda_launch_convert(g->stream, dst, src, n, to_wire != 0);
        return MT_OK;
    }
    MT_CUDA_TRY(cudaMemcpyAsync(dst, src, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice,
                                g->stream));
    return MT_OK;
}

/* Rank r's padded slot of mc wire elements in pad, and the wire type. */
static char *slot(void *pad, int r, size_t mc, int bf16)
{
    return (char *)pad + (size_t)r * mc * (bf16 ? 2 : 4);
}

static ncclDataType_t wire_type(int bf16) { return bf16 ? ncclBfloat16 : ncclFloat32; }

/* n bf16 bits copied as they are (a side of a bf16 gather that holds them) */
static mt_status_t move_bits(mt_nccl_group_t *g, void *dst, const void *src, int64_t n)
{
    if (n > 0)
        MT_CUDA_TRY(cudaMemcpyAsync(dst, src, sizeof(uint16_t) * (size_t)n,
                                    cudaMemcpyDeviceToDevice, g->stream));
    return MT_OK;
}

mt_status_t mt_nccl_all_gatherv(mt_nccl_group_t *g, const void *mine, void *unit,
                                const int *counts, const int *displs, void *pad, int how,
                                cudaStream_t compute)
{
    const int bf16 = (how & MT_NCCL_BF16) != 0;
    const char *what = bf16 ? "all_gather (bf16)" : "all_gather";
    if ((how & (MT_NCCL_UNIT_BITS | MT_NCCL_MINE_BITS)) && !bf16)
        MT_FAIL(MT_ERR_RANGE, "%s: bf16 bits need the bf16 wire (MT_NCCL_BF16)", what);
    const size_t mc = (size_t)max_count(counts, g->size), ue = how & MT_NCCL_UNIT_BITS ? 2 : 4;
    char *own = slot(pad, g->rank, mc, bf16);
    MT_TRY(begin(g, compute, what));
    if (how & MT_NCCL_MINE_BITS)
        MT_TRY(move_bits(g, own, mine, counts[g->rank]));
    else
        MT_TRY(move(g, own, mine, counts[g->rank], 1, bf16));
    MT_TRY(nccl_poll(g, ncclAllGather(own, pad, mc, wire_type(bf16), g->comm, g->stream), what));
    for (int r = 0; r < g->size; r++) {
        char *at = (char *)unit + ue * (size_t)displs[r];
        if (how & MT_NCCL_UNIT_BITS)
            MT_TRY(move_bits(g, at, slot(pad, r, mc, bf16), counts[r]));
        else
            MT_TRY(move(g, at, slot(pad, r, mc, bf16), counts[r], 0, bf16));
    }
    return end(g, ncclSuccess, what);
}

mt_status_t mt_nccl_reduce_scatterv(mt_nccl_group_t *g, const float *unit, float *mine,
                                    const int *counts, const int *displs, void *pad, int bf16,
                                    cudaStream_t compute)
{
    const char *what = bf16 ? "reduce_scatter (bf16)" : "reduce_scatter";
    const size_t mc = (size_t)max_count(counts, g->size);
    char *own = slot(pad, g->rank, mc, bf16);
    MT_TRY(begin(g, compute, what));
    /* each part at the start of its padded slot; the slots' tails sum into
     * the tails, which nobody reads */
    for (int r = 0; r < g->size; r++)
        MT_TRY(move(g, slot(pad, r, mc, bf16), unit + displs[r], counts[r], 1, bf16));
    MT_TRY(nccl_poll(g, ncclReduceScatter(pad, own, mc, wire_type(bf16), ncclSum, g->comm,
                                          g->stream),
                     what));
    MT_TRY(move(g, mine, own, counts[g->rank], 0, bf16));
    return end(g, ncclSuccess, what);
}

mt_status_t mt_nccl_all_reduce_f32(mt_nccl_group_t *g, float *x, size_t n, void *pad, int bf16,
                                   cudaStream_t compute)
{
    const char *what = bf16 ? "all_reduce (bf16)" : "all_reduce";
    MT_TRY(begin(g, compute, what));
    if (!bf16) {
        MT_TRY(nccl_poll(g, ncclAllReduce(x, x, n, ncclFloat32, ncclSum, g->comm, g->stream),
                         what));
    } else {
        MT_TRY(move(g, pad, x, (int64_t)n, 1, 1));
        MT_TRY(nccl_poll(g, ncclAllReduce(pad, pad, n, ncclBfloat16, ncclSum, g->comm, g->stream),
                         what));
        MT_TRY(move(g, x, pad, (int64_t)n, 0, 1));
    }
    return end(g, ncclSuccess, what);
}

mt_status_t mt_nccl_all_to_allv(mt_nccl_group_t *g, const void *send, const int *scounts,
                                const int *sdispls, void *recv, const int *rcounts,
                                const int *rdispls, size_t row_bytes, cudaStream_t compute)
{
    MT_TRY(begin(g, compute, "all_to_allv"));
    ncclResult_t rc = ncclGroupStart();
    for (int r = 0; r < g->size && (rc == ncclSuccess || rc == ncclInProgress); r++) {
        if (scounts[r] > 0)
            rc = ncclSend((const char *)send + (size_t)sdispls[r] * row_bytes,
                          (size_t)scounts[r] * row_bytes, ncclInt8, r, g->comm, g->stream);
        if (rcounts[r] > 0 && (rc == ncclSuccess || rc == ncclInProgress))
            rc = ncclRecv((char *)recv + (size_t)rdispls[r] * row_bytes,
                          (size_t)rcounts[r] * row_bytes, ncclInt8, r, g->comm, g->stream);
    }
    const ncclResult_t rc_end = ncclGroupEnd();
    return end(g, rc != ncclSuccess && rc != ncclInProgress ? rc : rc_end, "all_to_allv");
}

mt_status_t mt_nccl_ring_step(mt_nccl_group_t *g, const float *const *out, float *const *in,
                              int nb, size_t n, int from, int to, cudaStream_t compute)
{
    MT_TRY(begin(g, compute, "ring send/recv"));
    ncclResult_t rc = ncclGroupStart();
    for (int i = 0; i < nb && (rc == ncclSuccess || rc == ncclInProgress); i++)
        rc = ncclRecv(in[i], n, ncclFloat32, from, g->comm, g->stream);
    for (int i = 0; i < nb && (rc == ncclSuccess || rc == ncclInProgress); i++)
        rc = ncclSend(out[i], n, ncclFloat32, to, g->comm, g->stream);
    const ncclResult_t rc_end = ncclGroupEnd();
    return end(g, rc != ncclSuccess && rc != ncclInProgress ? rc : rc_end, "ring send/recv");
}

void *mt_nccl_last_event(const mt_nccl_group_t *g)
{
    return g->ev[(g->ev_next + 63) % 64];
}

mt_status_t mt_nccl_join_event(void *event, cudaStream_t compute)
{
    MT_CUDA_TRY(cudaStreamWaitEvent(compute, (cudaEvent_t)event, 0));
    return MT_OK;
}

mt_status_t mt_nccl_join(mt_nccl_group_t *g, cudaStream_t compute)
{
    MT_CUDA_TRY(cudaStreamWaitEvent(compute, (cudaEvent_t)mt_nccl_last_event(g), 0));
    return MT_OK;
}

mt_status_t mt_nccl_wait(mt_nccl_group_t *g, const char *collective)
{
    if (!g->comm)
        MT_FAIL(MT_ERR_INTERNAL, "NCCL %s on axis %s: no communicator", collective,
                g->axis ? g->axis : "?");
    const double t0 = mt_now_s();
    for (;;) {
        const cudaError_t e = cudaEventQuery((cudaEvent_t)mt_nccl_last_event(g));
        if (e == cudaSuccess)
            return MT_OK;
        if (e != cudaErrorNotReady)
            return mt_error_cuda((int)e, "cudaEventQuery", __FILE__, __LINE__);
        ncclResult_t st = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(g->comm, &st);
        if (q != ncclSuccess)
            return fail_abort(g, collective, ncclGetErrorString(q));
        if (st != ncclSuccess && st != ncclInProgress)
            return fail_abort(g, collective, ncclGetErrorString(st));
        if (mt_now_s() - t0 > g->timeout_s) {
            char why[96];
            snprintf(why, sizeof why, "did not complete in %.0f s (distributed.timeout_s)",
                     g->timeout_s);
            return fail_abort(g, collective, why);
        }
        nap();
    }
}
