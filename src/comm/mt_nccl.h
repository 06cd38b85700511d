/* mt_nccl.h: NCCL communicators for the mesh's process groups (built when
 * configure finds NCCL; MT_HAVE_NCCL in config.h).
 *
 * One communicator per mesh group (each axis and each flattened group of
 * mt_mesh.h), created from that group's MPI communicator by broadcasting
 * an ncclUniqueId over it.  Communicators are non-blocking (ncclConfig_t
 * blocking = 0): no NCCL call can hang the host, and mt_nccl_wait polls
 * for completion and for ncclCommGetAsyncError up to the timeout
 * (distributed.timeout_s), then aborts the communicator and returns an
 * error naming the collective and the axis, so every rank can exit.
 *
 * Collectives run on the group's own stream: each waits for an event
 * recorded on the caller's compute stream (so it sees the data the
 * compute produced) and records an event of its own that mt_nccl_join makes
 * the compute stream wait on; the compute stream is never blocked by the
 * host.  Untested on hardware so far (doc/gpu.md). */
#ifndef MT_NCCL_H
#define MT_NCCL_H

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>

#include "mt_mesh.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    ncclComm_t comm; /* NULL: the group does not exist on this layout */
    cudaStream_t stream;
    cudaEvent_t ready; /* recorded on the compute stream before a collective */
    int rank, size;
    const char *axis;  /* group name for messages ("dp_shard", "tp", ...) */
    double timeout_s;
    /* the watchdog's view (guarded by its lock): the last collective
     * enqueued, when, and whether its event may still be pending */
    const char *last;
    double last_t;
    int pending;
    /* one event per collective, recorded after it on `stream`, round robin:
     * a caller can wait for one collective (mt_nccl_last_event) or for the
     * last, which is all of them (mt_nccl_join) */
    cudaEvent_t ev[64];
    int ev_next;
} mt_nccl_group_t;

typedef struct {
    mt_nccl_group_t group[MT_NGROUPS];
    int alias[MT_NGROUPS]; /* g + 1 when the group has the members of group g
                            * before it (one communicator for both), else 0 */
    double timeout_s;      /* distributed.timeout_s, also for the groups
                            * adopted later (mt_nccl_adopt) */
} mt_nccl_t;

/* One communicator over the MPI communicator comm (collective over it),
 * named `axis` in error messages. */
mt_status_t mt_nccl_group_init(mt_nccl_group_t *g, MPI_Comm comm, const char *axis,
                               double timeout_s);
void mt_nccl_group_free(mt_nccl_group_t *g);

/* A communicator for every group of the mesh that collectives of device
 * memory use, in group order (collective over the mesh's communicator; the
 * device must already be bound): not for groups of one rank nor for the
 * pipeline group (its channels adopt communicators of their own:
 * mt_pp_exec_connect), and one for groups with
 * the same members (dp and dp_cp without cp, ...). */
mt_status_t mt_nccl_init(mt_nccl_t *n, const mt_mesh_t *mesh, double timeout_s);
void mt_nccl_free(mt_nccl_t *n);

/* The process's active groups.  Collectives of backend memory take NCCL
 * on a communicator registered here and MPI (staged) on any other
 * (mt_nccl_for gives the group of an MPI communicator, NULL when none).
 * Activating starts the watchdog thread as well: when a collective of an
 * active group is still pending after the group's timeout, or NCCL
 * reports an asynchronous error, it prints which collective on which axis
 * and rank, aborts every communicator and ends the process with exit
 * status 3, so a hang becomes an error on every rank (each rank's own
 * watchdog fires; the launcher ends the job) instead of a job that runs
 * out its allocation.  The host never has to wait on a collective for the
 * timeout to work, so collectives can overlap compute. */
mt_status_t mt_nccl_activate(mt_nccl_t *n, const mt_mesh_t *mesh);
void mt_nccl_deactivate(void);
mt_nccl_group_t *mt_nccl_for(MPI_Comm comm);
/* A communicator outside the mesh groups (the ranks holding the same
 * experts: train_moe.c) made and activated too, collective over comm;
 * nothing when no groups are active, comm has one rank or is known.
 * mt_nccl_deactivate frees it. */
mt_status_t mt_nccl_adopt(MPI_Comm comm, const char *axis);
/* Free the communicator adopted for comm (nothing when none), before
 * comm itself is freed: collective over comm; with abort, aborted
 * instead (work may be pending that will never complete). */
void mt_nccl_release(MPI_Comm comm, bool abort);

/* Collectives: enqueued on g's stream after the work already on
 * `compute` (a cudaStream_t; NULL: after g's own work only, for buffers
 * known to be free, as the pipeline's early receives); they return once
 * enqueued.  Counts are in
 * elements of `type`.  all_gather: recv holds size * count; reduce_scatter:
 * send holds size * count; all_to_all: send and recv hold size * count,
 * block r going to / coming from rank r (grouped send/recv). */
mt_status_t mt_nccl_all_reduce(mt_nccl_group_t *g, const void *send, void *recv, size_t count,
                               ncclDataType_t type, ncclRedOp_t op, cudaStream_t compute);
mt_status_t mt_nccl_all_gather(mt_nccl_group_t *g, const void *send, void *recv, size_t count,
                               ncclDataType_t type, cudaStream_t compute);
mt_status_t mt_nccl_reduce_scatter(mt_nccl_group_t *g, const void *send, void *recv,
                                   size_t count, ncclDataType_t type, ncclRedOp_t op,
                                   cudaStream_t compute);
mt_status_t mt_nccl_all_to_all(mt_nccl_group_t *g, const void *send, void *recv, size_t count,
                               ncclDataType_t type, cudaStream_t compute);
mt_status_t mt_nccl_send(mt_nccl_group_t *g, const void *buf, size_t count, ncclDataType_t type,
                         int peer, cudaStream_t compute);
mt_status_t mt_nccl_recv(mt_nccl_group_t *g, void *buf, size_t count, ncclDataType_t type,
                         int peer, cudaStream_t compute);

/* The data-parallel collectives on float32 device memory, each a whole
 * sequence on g's stream (after the compute so far): with bf16 the values
 * travel as bf16 (converted on g's stream, ncclBfloat16 sums) and land as
 * float32 holding bf16 values.  `pad` is device memory of g->size x
 * max(counts) wire elements (n for the all-reduce), reused in stream order.
 *  all_gatherv:     rank r's counts[r] elements land at unit + displs[r];
 *                   mine is this rank's part (it may lie inside unit).
 *                   `how` is 0 (float32) or MT_NCCL_BF16 on the wire, and
 *                   under bf16 storage (doc/mixed-precision.md) also
 *                   MT_NCCL_UNIT_BITS: unit holds bf16 bits, which land as
 *                   they travelled (displs count bf16 elements), and
 *                   MT_NCCL_MINE_BITS: so does mine, sent as it is;
 *  reduce_scatterv: the sum over ranks of unit's part r lands in rank r's
 *                   mine (counts[r] elements); NCCL needs equal parts, so
 *                   they are padded to the largest;
 *  all_reduce_f32:  x summed in place over n elements. */
enum { MT_NCCL_BF16 = 1, MT_NCCL_UNIT_BITS = 2, MT_NCCL_MINE_BITS = 4 };
mt_status_t mt_nccl_all_gatherv(mt_nccl_group_t *g, const void *mine, void *unit,
                                const int *counts, const int *displs, void *pad, int how,
                                cudaStream_t compute);
mt_status_t mt_nccl_reduce_scatterv(mt_nccl_group_t *g, const float *unit, float *mine,
                                    const int *counts, const int *displs, void *pad, int bf16,
                                    cudaStream_t compute);
mt_status_t mt_nccl_all_reduce_f32(mt_nccl_group_t *g, float *x, size_t n, void *pad, int bf16,
                                   cudaStream_t compute);

/* All-to-all with per-peer counts of rows of row_bytes (displacements in
 * rows, as MPI_Alltoallv's): grouped sends and receives. */
mt_status_t mt_nccl_all_to_allv(mt_nccl_group_t *g, const void *send, const int *scounts,
                                const int *sdispls, void *recv, const int *rcounts,
                                const int *rdispls, size_t row_bytes, cudaStream_t compute);

/* One step of a ring: receive nb buffers of n floats (in[i]) from rank
 * `from` and send nb (out[i]) to rank `to`, grouped so that the opposite
 * directions cannot deadlock. */
mt_status_t mt_nccl_ring_step(mt_nccl_group_t *g, const float *const *out, float *const *in,
                              int nb, size_t n, int from, int to, cudaStream_t compute);

/* The event of g's last collective (valid until 63 more are issued: a
 * later one is recorded on it then, and waiting for that also waits for
 * this one, on the same stream), and a wait of `compute` for such an
 * event: the compute stream waits for that collective only, not for the
 * ones queued after it (a prefetched gather, a later reduce-scatter). */
void *mt_nccl_last_event(const mt_nccl_group_t *g);
mt_status_t mt_nccl_join_event(void *event, cudaStream_t compute);

/* Make `compute` wait (on the device) for g's collectives so far. */
mt_status_t mt_nccl_join(mt_nccl_group_t *g, cudaStream_t compute);

/* Block the host until g's collectives so far finish, polling
 * ncclCommGetAsyncError; after g->timeout_s seconds, or on an
 * asynchronous NCCL error, abort the communicator and fail with a message
 * naming `collective` and the axis. */
mt_status_t mt_nccl_wait(mt_nccl_group_t *g, const char *collective);

#ifdef __cplusplus
}
#endif
#endif
