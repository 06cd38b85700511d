/* mt_comm.h: waiting for non-blocking MPI operations without starving the
 * ranks that share a core.
 *
 * MPICH's blocking calls busy-poll.  With more ranks than cores (tests
 * oversubscribe 8 ranks on 2 cores; some sites oversubscribe on purpose)
 * that costs a scheduler time slice per message.  mt_wait_all tests the
 * requests, and when the node is oversubscribed, sleeps between tests with
 * a short backoff.  It measured 26 ms -> 3 ms per 8-rank all-reduce on 2
 * cores.  On a node with a core per rank it spins like MPI_Waitall. */
#ifndef MT_COMM_H
#define MT_COMM_H

#include <mpi.h>

#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_WAIT_AUTO, MT_WAIT_SPIN, MT_WAIT_SLEEP } mt_wait_mode_t;

/* Decide once from the node communicator: sleep when it has more ranks
 * than online cores.  MESHTRAIN_WAIT=spin|sleep overrides. */
void mt_comm_set_wait_mode(MPI_Comm node);

/* CPU threads per rank: unless OMP_NUM_THREADS is set, the node's cores
 * divided among its ranks (at least 1), so that ranks sharing a node do
 * not oversubscribe it with OpenMP (and OpenMP OpenBLAS) threads.
 * Returns the number chosen.  `node` is the node-local group. */
int mt_comm_set_threads(MPI_Comm node);
mt_wait_mode_t mt_comm_wait_mode(void);

/* Complete n requests (MPI_REQUEST_NULL entries are fine). */
mt_status_t mt_wait_all(int n, MPI_Request *reqs);

/* Collective.  MT_OK if every rank passed MT_OK; otherwise every rank
 * returns the status of the lowest failing rank and carries its message
 * and hint, so any rank can report it and all report the same thing. */
mt_status_t mt_agree(MPI_Comm comm, mt_status_t local);

/* An MPI failure inside a hook that runs in the middle of the model's
 * forward or backward, where the other ranks already wait in the next
 * collective and no agreement can reach them: print the error (rank, host,
 * message) and abort the job through comm.  Does not return. */
void mt_comm_fatal(MPI_Comm comm, int rc, const char *what);

/* Seconds this process has spent inside mt_wait_all (and so in
 * mt_allreduce): communication that compute did not hide. */
double mt_comm_wait_seconds(void);

/* A blocking all-reduce that waits politely (MPI_Iallreduce + mt_wait_all). */
mt_status_t mt_allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op,
                         MPI_Comm comm);

#ifdef __cplusplus
}
#endif
#endif
