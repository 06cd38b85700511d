/* comm.c: polite completion of non-blocking MPI operations (mt_comm.h). */
#define _GNU_SOURCE
/* MPICH annotates MPI_STATUSES_IGNORE arguments with access sizes that
 * GCC 12 misreads as an overflow of a zero-sized region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include "mt_comm.h"

#include "mt_clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static mt_wait_mode_t wait_mode = MT_WAIT_SPIN;

void mt_comm_set_wait_mode(MPI_Comm node)
{
    const char *env = getenv("MESHTRAIN_WAIT");
    if (env && strcmp(env, "spin") == 0) {
        wait_mode = MT_WAIT_SPIN;
        return;
    }
    if (env && strcmp(env, "sleep") == 0) {
        wait_mode = MT_WAIT_SLEEP;
        return;
    }
    int ranks = 1;
    MPI_Comm_size(node, &ranks);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    wait_mode = cores > 0 && ranks > cores ? MT_WAIT_SLEEP : MT_WAIT_SPIN;
}

int mt_comm_set_threads(MPI_Comm node)
{
#ifdef _OPENMP
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && env[0])
        return omp_get_max_threads();
    int ranks = 1;
    MPI_Comm_size(node, &ranks);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = cores > 0 ? (int)(cores / (ranks > 0 ? ranks : 1)) : 1;
    if (t < 1)
        t = 1;
    if (ranks > 1)
        omp_set_num_threads(t);
    return omp_get_max_threads();
#else
    (void)node;
    return 1;
#endif
}

mt_wait_mode_t mt_comm_wait_mode(void) { return wait_mode; }

static double wait_seconds;

double mt_comm_wait_seconds(void) { return wait_seconds; }

static mt_status_t wait_all(int n, MPI_Request *reqs)
{
    if (wait_mode != MT_WAIT_SLEEP) {
        MT_MPI_TRY(MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE));
        return MT_OK;
    }
    long ns = 2000;
    for (int polls = 0;; polls++) {
        int done = 0;
        MT_MPI_TRY(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
        if (done)
            return MT_OK;
        if (polls < 16)
            continue; /* a few quick polls before giving the core away */
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 200000)
            ns *= 2;
    }
}

mt_status_t mt_wait_all(int n, MPI_Request *reqs)
{
    double t = mt_now_s();
    mt_status_t s = wait_all(n, reqs);
    wait_seconds += mt_now_s() - t;
    return s;
}

mt_status_t mt_allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op,
                         MPI_Comm comm)
{
    MPI_Request r;
    MT_MPI_TRY(MPI_Iallreduce(send, recv, count, type, op, comm, &r));
    MT_TRY(mt_wait_all(1, &r));
    return MT_OK;
}

mt_status_t mt_agree(MPI_Comm comm, mt_status_t local)
{
    int rank, size, first;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    int mine = local == MT_OK ? size : rank;
    MT_TRY(mt_allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm)); /* polite wait */
    if (first == size)
        return MT_OK;
    struct {
        int status;
        char msg[8192];
        char hint[1024];
    } e;
    if (rank == first) {
        e.status = (int)local;
        snprintf(e.msg, sizeof e.msg, "%s", mt_error_message());
        snprintf(e.hint, sizeof e.hint, "%s", mt_error_hint_text());
    }
    MT_MPI_TRY(MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, first, comm));
    if (rank != first) {
        mt_error_set((mt_status_t)e.status, __FILE__, __LINE__, "%s", e.msg);
        if (e.hint[0])
            mt_error_hint("%s", e.hint);
    } else {
        mt_error_trace(__FILE__, __LINE__);
    }
    return (mt_status_t)e.status;
}

void mt_comm_fatal(MPI_Comm comm, int rc, const char *what)
{
    char es[MPI_MAX_ERROR_STRING] = "", host[256] = "?";
    int len = 0, rank = -1;
    MPI_Error_string(rc, es, &len);
    MPI_Comm_rank(comm, &rank);
    gethostname(host, sizeof host - 1);
    fprintf(stderr, "meshtrain: fatal MPI error in %s on rank %d of its group (%s): %s%s%s\n"
                    "  the other ranks are waiting in collectives this rank cannot join; "
                    "aborting the job\n", what, rank, host, es, mt_error_message()[0] ? ": " : "",
            mt_error_message());
    fflush(stderr);
    MPI_Abort(comm, 1);
    abort(); /* MPI_Abort does not return */
}
