/* comm.c: polite completion of non-blocking MPI operations (mt_comm.h). */
#define _GNU_SOURCE
/* MPICH annotates MPI_STATUSES_IGNORE arguments with access sizes that
 * GCC 12 misreads as an overflow of a zero-sized region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include "mt_comm.h"

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

mt_status_t mt_wait_all(int n, MPI_Request *reqs)
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

mt_status_t mt_allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op,
                         MPI_Comm comm)
{
    MPI_Request r;
    MT_MPI_TRY(MPI_Iallreduce(send, recv, count, type, op, comm, &r));
    MT_TRY(mt_wait_all(1, &r));
    return MT_OK;
}
