/* pmpi_count.c: a PMPI interposition library that counts the collectives a
 * program issues, for bench/bench_comm.sh.  Loaded with LD_PRELOAD on the
 * mpiexec'd processes; each process writes, at MPI_Finalize, the file
 * $MT_PMPI_OUT.<world rank>: a per-kind summary and the ordered trace of
 * every collective (kind, datatype, element counts, communicator size and
 * identity, blocking or not, reduction op), which bench/comm_replay.c
 * replays and bench_comm.sh splits into steps.
 *
 * What it counts is each call's logical payload, the full buffer that the
 * collective is about: count x type size for all-reduce, bcast and reduce;
 * the whole receive buffer for all-gather(v); the sum of recvcounts for
 * reduce-scatter.  It also writes that payload times the ring factor of the
 * call's own group size n (2(n-1)/n for all-reduce, (n-1)/n for all-gather
 * and reduce-scatter, 1 for the rest): what one rank sends in a ring
 * algorithm.  It does not look at what the MPI library really puts on the
 * wire (its algorithm choice, shared-memory shortcuts), does not count
 * point-to-point or MPI-IO traffic, nor the large-count (_c) variants,
 * and does not time anything. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_ALLREDUCE, K_ALLGATHER, K_ALLGATHERV, K_REDUCE_SCATTER, K_REDUCE_SCATTER_BLOCK,
       K_BCAST, K_REDUCE, K_BARRIER, K_ALLTOALL, K_ALLTOALLV, K_GATHER, K_SCATTER, K_NKINDS };

static const char *const kind_name[K_NKINDS] = {
    "allreduce", "allgather", "allgatherv", "reduce_scatter", "reduce_scatter_block",
    "bcast", "reduce", "barrier", "alltoall", "alltoallv", "gather", "scatter"};

typedef struct {
    unsigned char kind, blocking;
    char type[8], op[8];
    int esize;          /* bytes per element */
    long long count;    /* elements of the whole logical buffer */
    long long own;      /* this rank's part (v and scatter variants), else count */
    int n, lo;          /* group size, lowest world rank in it */
    uint64_t id;        /* hash of the group's world ranks: tells groups apart */
} rec_t;

typedef struct {
    MPI_Comm comm;
    int n, rank, lo;
    uint64_t id;
} comm_info_t;

static rec_t *recs;
static size_t nrecs, caprecs;
static comm_info_t cinfo[64];
static int ncinfo;

static const comm_info_t *info_of(MPI_Comm comm)
{
    for (int i = 0; i < ncinfo; i++)
        if (cinfo[i].comm == comm)
            return &cinfo[i];
    static comm_info_t scratch;
    comm_info_t *c = ncinfo < (int)(sizeof cinfo / sizeof cinfo[0]) ? &cinfo[ncinfo++] : &scratch;
    c->comm = comm;
    PMPI_Comm_size(comm, &c->n);
    PMPI_Comm_rank(comm, &c->rank);
    MPI_Group g, wg;
    PMPI_Comm_group(comm, &g);
    PMPI_Comm_group(MPI_COMM_WORLD, &wg);
    int *in = malloc(sizeof(int) * (size_t)c->n), *out = malloc(sizeof(int) * (size_t)c->n);
    c->lo = -1;
    c->id = 1469598103934665603ULL; /* FNV-1a over the world ranks, in group order */
    if (in && out) {
        for (int i = 0; i < c->n; i++)
            in[i] = i;
        PMPI_Group_translate_ranks(g, c->n, in, wg, out);
        for (int i = 0; i < c->n; i++) {
            if (c->lo < 0 || out[i] < c->lo)
                c->lo = out[i];
            for (int b = 0; b < 4; b++) {
                c->id ^= (uint64_t)((unsigned)out[i] >> (8 * b) & 0xffu);
                c->id *= 1099511628211ULL;
            }
        }
    }
    free(in), free(out);
    PMPI_Group_free(&g);
    PMPI_Group_free(&wg);
    return c;
}

static void type_of(MPI_Datatype t, char name[8], int *size)
{
    PMPI_Type_size(t, size);
    char tn[MPI_MAX_OBJECT_NAME] = "";
    int len = 0;
    PMPI_Type_get_name(t, tn, &len);
    const char *s = t == MPI_FLOAT ? "float" : t == MPI_DOUBLE ? "double" : t == MPI_INT ? "int"
                    : t == MPI_INT64_T || t == MPI_LONG_LONG ? "int64" : t == MPI_BYTE ? "byte"
                    : strcmp(tn, "mt_bf16") == 0 ? "bf16" /* src/comm/comm_bf16.c's wire type */
                    : "other";
    snprintf(name, 8, "%s", s);
}

static void op_of(MPI_Op op, char name[8])
{
    snprintf(name, 8, "%s", op == MPI_SUM ? "sum" : op == MPI_MAX ? "max" : op == MPI_MIN ? "min"
                            : op == MPI_OP_NULL ? "-" : "other");
}

static rec_t *add(int kind, int blocking, MPI_Comm comm, MPI_Datatype type, long long count,
                  long long own, MPI_Op op)
{
    if (nrecs == caprecs) {
        size_t cap = caprecs ? 2 * caprecs : 4096;
        rec_t *r = realloc(recs, cap * sizeof *r);
        if (!r)
            return NULL;
        recs = r, caprecs = cap;
    }
    rec_t *r = &recs[nrecs++];
    const comm_info_t *c = info_of(comm);
    r->kind = (unsigned char)kind, r->blocking = (unsigned char)blocking;
    type_of(type, r->type, &r->esize);
    op_of(op, r->op);
    r->count = count, r->own = own;
    r->n = c->n, r->lo = c->lo, r->id = c->id;
    return r;
}

static long long sum_counts(const int *counts, int n)
{
    long long s = 0;
    for (int i = 0; i < n; i++)
        s += counts[i];
    return s;
}

static int comm_size(MPI_Comm comm) { return info_of(comm)->n; }
static int comm_rank(MPI_Comm comm) { return info_of(comm)->rank; }

static double ring_factor(int kind, int n)
{
    if (n <= 1)
        return 0.0;
    switch (kind) {
    case K_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case K_ALLGATHER: case K_ALLGATHERV: case K_REDUCE_SCATTER: case K_REDUCE_SCATTER_BLOCK:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

/* ---- the interposed calls ---- */

int MPI_Allreduce(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm)
{
    add(K_ALLREDUCE, 1, comm, t, count, count, op);
    return PMPI_Allreduce(s, r, count, t, op, comm);
}

int MPI_Iallreduce(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                   MPI_Request *req)
{
    add(K_ALLREDUCE, 0, comm, t, count, count, op);
    return PMPI_Iallreduce(s, r, count, t, op, comm, req);
}

int MPI_Allgather(const void *s, int sc, MPI_Datatype st, void *r, int rc, MPI_Datatype rt,
                  MPI_Comm comm)
{
    add(K_ALLGATHER, 1, comm, rt, (long long)rc * comm_size(comm), rc, MPI_OP_NULL);
    return PMPI_Allgather(s, sc, st, r, rc, rt, comm);
}

int MPI_Iallgather(const void *s, int sc, MPI_Datatype st, void *r, int rc, MPI_Datatype rt,
                   MPI_Comm comm, MPI_Request *req)
{
    add(K_ALLGATHER, 0, comm, rt, (long long)rc * comm_size(comm), rc, MPI_OP_NULL);
    return PMPI_Iallgather(s, sc, st, r, rc, rt, comm, req);
}

int MPI_Allgatherv(const void *s, int sc, MPI_Datatype st, void *r, const int rcs[],
                   const int displs[], MPI_Datatype rt, MPI_Comm comm)
{
    add(K_ALLGATHERV, 1, comm, rt, sum_counts(rcs, comm_size(comm)), rcs[comm_rank(comm)],
        MPI_OP_NULL);
    return PMPI_Allgatherv(s, sc, st, r, rcs, displs, rt, comm);
}

int MPI_Iallgatherv(const void *s, int sc, MPI_Datatype st, void *r, const int rcs[],
                    const int displs[], MPI_Datatype rt, MPI_Comm comm, MPI_Request *req)
{
    add(K_ALLGATHERV, 0, comm, rt, sum_counts(rcs, comm_size(comm)), rcs[comm_rank(comm)],
        MPI_OP_NULL);
    return PMPI_Iallgatherv(s, sc, st, r, rcs, displs, rt, comm, req);
}

int MPI_Reduce_scatter(const void *s, void *r, const int rcs[], MPI_Datatype t, MPI_Op op,
                       MPI_Comm comm)
{
    add(K_REDUCE_SCATTER, 1, comm, t, sum_counts(rcs, comm_size(comm)), rcs[comm_rank(comm)], op);
    return PMPI_Reduce_scatter(s, r, rcs, t, op, comm);
}

int MPI_Ireduce_scatter(const void *s, void *r, const int rcs[], MPI_Datatype t, MPI_Op op,
                        MPI_Comm comm, MPI_Request *req)
{
    add(K_REDUCE_SCATTER, 0, comm, t, sum_counts(rcs, comm_size(comm)), rcs[comm_rank(comm)], op);
    return PMPI_Ireduce_scatter(s, r, rcs, t, op, comm, req);
}

int MPI_Reduce_scatter_block(const void *s, void *r, int rc, MPI_Datatype t, MPI_Op op,
                             MPI_Comm comm)
{
    add(K_REDUCE_SCATTER_BLOCK, 1, comm, t, (long long)rc * comm_size(comm), rc, op);
    return PMPI_Reduce_scatter_block(s, r, rc, t, op, comm);
}

int MPI_Ireduce_scatter_block(const void *s, void *r, int rc, MPI_Datatype t, MPI_Op op,
                              MPI_Comm comm, MPI_Request *req)
{
    add(K_REDUCE_SCATTER_BLOCK, 0, comm, t, (long long)rc * comm_size(comm), rc, op);
    return PMPI_Ireduce_scatter_block(s, r, rc, t, op, comm, req);
}

int MPI_Bcast(void *b, int count, MPI_Datatype t, int root, MPI_Comm comm)
{
    add(K_BCAST, 1, comm, t, count, count, MPI_OP_NULL);
    return PMPI_Bcast(b, count, t, root, comm);
}

int MPI_Ibcast(void *b, int count, MPI_Datatype t, int root, MPI_Comm comm, MPI_Request *req)
{
    add(K_BCAST, 0, comm, t, count, count, MPI_OP_NULL);
    return PMPI_Ibcast(b, count, t, root, comm, req);
}

int MPI_Reduce(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, int root,
               MPI_Comm comm)
{
    add(K_REDUCE, 1, comm, t, count, count, op);
    return PMPI_Reduce(s, r, count, t, op, root, comm);
}

int MPI_Ireduce(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, int root,
                MPI_Comm comm, MPI_Request *req)
{
    add(K_REDUCE, 0, comm, t, count, count, op);
    return PMPI_Ireduce(s, r, count, t, op, root, comm, req);
}

int MPI_Barrier(MPI_Comm comm)
{
    add(K_BARRIER, 1, comm, MPI_BYTE, 0, 0, MPI_OP_NULL);
    return PMPI_Barrier(comm);
}

int MPI_Ibarrier(MPI_Comm comm, MPI_Request *req)
{
    add(K_BARRIER, 0, comm, MPI_BYTE, 0, 0, MPI_OP_NULL);
    return PMPI_Ibarrier(comm, req);
}

int MPI_Alltoall(const void *s, int sc, MPI_Datatype st, void *r, int rc, MPI_Datatype rt,
                 MPI_Comm comm)
{
    add(K_ALLTOALL, 1, comm, st, (long long)sc * comm_size(comm), sc, MPI_OP_NULL);
    return PMPI_Alltoall(s, sc, st, r, rc, rt, comm);
}

int MPI_Alltoallv(const void *s, const int scs[], const int sd[], MPI_Datatype st, void *r,
                  const int rcs[], const int rd[], MPI_Datatype rt, MPI_Comm comm)
{
    long long n = sum_counts(scs, comm_size(comm));
    add(K_ALLTOALLV, 1, comm, st, n, n, MPI_OP_NULL);
    return PMPI_Alltoallv(s, scs, sd, st, r, rcs, rd, rt, comm);
}

int MPI_Gather(const void *s, int sc, MPI_Datatype st, void *r, int rc, MPI_Datatype rt,
               int root, MPI_Comm comm)
{
    add(K_GATHER, 1, comm, st, (long long)sc * comm_size(comm), sc, MPI_OP_NULL);
    return PMPI_Gather(s, sc, st, r, rc, rt, root, comm);
}

int MPI_Scatter(const void *s, int sc, MPI_Datatype st, void *r, int rc, MPI_Datatype rt,
                int root, MPI_Comm comm)
{
    add(K_SCATTER, 1, comm, rt, (long long)rc * comm_size(comm), rc, MPI_OP_NULL);
    return PMPI_Scatter(s, sc, st, r, rc, rt, root, comm);
}

/* A freed communicator's handle may be reused for a different group. */
int MPI_Comm_free(MPI_Comm *comm)
{
    for (int i = 0; i < ncinfo; i++)
        if (cinfo[i].comm == *comm) {
            cinfo[i] = cinfo[--ncinfo];
            break;
        }
    return PMPI_Comm_free(comm);
}

static void write_summary(void)
{
    const char *prefix = getenv("MT_PMPI_OUT");
    if (!prefix || !prefix[0])
        return;
    int rank = 0, size = 1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", prefix, rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "pmpi_count: rank %d: cannot write %s\n", rank, path);
        return;
    }
    long long calls[K_NKINDS] = {0};
    double payload[K_NKINDS] = {0}, ring[K_NKINDS] = {0};
    for (size_t i = 0; i < nrecs; i++) {
        const rec_t *r = &recs[i];
        double b = (double)r->count * r->esize;
        calls[r->kind]++;
        payload[r->kind] += b;
        ring[r->kind] += b * ring_factor(r->kind, r->n);
    }
    fprintf(f, "# pmpi_count world_rank %d world_size %d records %zu\n", rank, size, nrecs);
    fprintf(f, "# summary KIND CALLS PAYLOAD_BYTES RING_BYTES_SENT\n");
    for (int k = 0; k < K_NKINDS; k++)
        if (calls[k])
            fprintf(f, "summary %s %lld %.0f %.0f\n", kind_name[k], calls[k], payload[k], ring[k]);
    fprintf(f, "# call SEQ KIND TYPE ESIZE COUNT OWN N LO ID BLOCKING OP\n");
    for (size_t i = 0; i < nrecs; i++) {
        const rec_t *r = &recs[i];
        fprintf(f, "call %zu %s %s %d %lld %lld %d %d %016llx %d %s\n", i, kind_name[r->kind],
                r->type, r->esize, r->count, r->own, r->n, r->lo, (unsigned long long)r->id,
                r->blocking, r->op);
    }
    fclose(f);
}

int MPI_Finalize(void)
{
    write_summary();
    free(recs);
    recs = NULL, nrecs = caprecs = 0;
    return PMPI_Finalize();
}
