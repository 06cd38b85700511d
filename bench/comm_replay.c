/* comm_replay.c: replay one training step's collectives without compute
 * and time them, for bench/bench_comm.sh.
 *
 *     mpiexec -n NP bench/comm_replay TRACE_PREFIX [REPS]
 *
 * Rank r reads TRACE_PREFIX.r, written by bench/pmpi_count.c under
 * meshtrain-dense, and takes the last whole step: the records between the
 * last two step markers.  The marker is the trainer's end-of-step stop-flag
 * agreement, a blocking MPI_Allreduce of one MPI_INT with MPI_MAX over the
 * whole world; it is left out of the replay because the trainer does not
 * count it in comm_wait_s.  Every other collective of that step is issued
 * in the same order, with the same type, counts, op and group, each one
 * completed (mt_wait_all, the trainer's own wait: it sleeps between polls
 * when ranks outnumber cores) before the next starts.  REPS (default 20)
 * timed repetitions follow 3 untimed ones; each starts after a barrier.
 *
 * Prints (rank 0) one line:
 *     replay step_s T allreduce_s .. allgather_s .. reduce_scatter_s ..
 *            other_s .. control_s .. calls N
 * step_s is the slowest rank's mean time per step; the per-kind times are
 * rank 0's.  Control is any collective of at most 64 bytes (loss sums,
 * token counts, the gradient norm).  Buffers hold garbage: the values do
 * not matter to the time.  It does not reproduce the trainer's buffer
 * addresses, in-place use or interleaving with compute, by design. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_comm.h"
#include "mt_comm_bf16.h"

/* bf16 records (the trainer's mp_policy wire type) replay with that type
 * and its sum op, so the replay pays the same user-op reduction. */
static mt_bf16_comm_t bf16;

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCE_SCATTER, C_OTHER, C_CONTROL, C_N };
static const char *const class_name[C_N] = {"allreduce", "allgather", "reduce_scatter", "other",
                                            "control"};

typedef struct {
    char kind[32], type[16], op[16], id[24];
    int esize, n, lo, blocking;
    long long count, own;
    /* set up for the replay */
    MPI_Comm comm;
    MPI_Datatype dt;
    MPI_Op mop;
    int cls;
    int *counts, *displs; /* v variants */
} rec_t;

static int die(const char *msg)
{
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "comm_replay: rank %d: %s\n", rank, msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
}

static int is_marker(const rec_t *r, int world)
{
    return strcmp(r->kind, "allreduce") == 0 && strcmp(r->type, "int") == 0 && r->count == 1 &&
           strcmp(r->op, "max") == 0 && r->blocking && r->n == world;
}

static rec_t *read_trace(const char *path, int world, int *nout)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 1024, n = 0;
    rec_t *all = malloc(cap * sizeof *all);
    char line[512];
    while (all && fgets(line, sizeof line, f)) {
        rec_t r;
        memset(&r, 0, sizeof r);
        unsigned long seq;
        if (sscanf(line, "call %lu %31s %15s %d %lld %lld %d %d %23s %d %15s", &seq, r.kind, r.type,
                   &r.esize, &r.count, &r.own, &r.n, &r.lo, r.id, &r.blocking, r.op) != 11)
            continue;
        if (n == cap) {
            rec_t *t = realloc(all, 2 * cap * sizeof *all);
            if (!t) {
                free(all);
                all = NULL;
                break;
            }
            all = t, cap *= 2;
        }
        all[n++] = r;
    }
    fclose(f);
    if (!all)
        return NULL;
    /* the last two markers bound the last whole step */
    long last = -1, prev = -1;
    for (size_t i = 0; i < n; i++)
        if (is_marker(&all[i], world))
            prev = last, last = (long)i;
    if (prev < 0) {
        free(all);
        *nout = -1;
        return NULL;
    }
    int m = (int)(last - prev - 1);
    rec_t *step = malloc(sizeof *step * (size_t)(m > 0 ? m : 1));
    if (step)
        memcpy(step, all + prev + 1, sizeof *step * (size_t)m);
    free(all);
    *nout = m;
    return step;
}

static MPI_Datatype datatype(rec_t *r, int reduction)
{
    if (strcmp(r->type, "float") == 0)
        return MPI_FLOAT;
    if (strcmp(r->type, "double") == 0)
        return MPI_DOUBLE;
    if (strcmp(r->type, "int") == 0)
        return MPI_INT;
    if (strcmp(r->type, "int64") == 0)
        return MPI_INT64_T;
    if (strcmp(r->type, "bf16") == 0)
        return bf16.type;
    /* anything else travels as its bytes */
    r->count *= r->esize, r->own *= r->esize, r->esize = 1;
    return reduction ? MPI_UNSIGNED_CHAR : MPI_BYTE;
}

static double now(void) { return MPI_Wtime(); }

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc < 2)
        return die("usage: comm_replay TRACE_PREFIX [REPS]");
    int reps = argc > 2 ? atoi(argv[2]) : 20, warm = 3;
    if (reps < 1)
        reps = 1;
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    mt_comm_set_wait_mode(node);
    if (mt_bf16_comm_init(&bf16) != MT_OK)
        return die("cannot create the bf16 type and sum op");

    char path[4096];
    snprintf(path, sizeof path, "%s.%d", argv[1], rank);
    int n = 0;
    rec_t *rec = read_trace(path, world, &n);
    if (!rec)
        return die(n < 0 ? "the trace has fewer than two step markers (run at least 2 steps)"
                         : "cannot read the trace");
    int lo_n = n, hi_n = n;
    MPI_Allreduce(MPI_IN_PLACE, &lo_n, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi_n, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (lo_n != hi_n)
        return die("ranks traced different numbers of collectives in the step");

    /* Groups: the k-th distinct group of the step is the k-th on every
     * rank (the same code issued them); split by its lowest world rank. */
    char ids[64][24];
    MPI_Comm comms[64];
    int ncomm = 0;
    size_t maxbytes = 64;
    for (int i = 0; i < n; i++) {
        rec_t *r = &rec[i];
        int k = 0;
        while (k < ncomm && strcmp(ids[k], r->id) != 0)
            k++;
        if (k == ncomm) {
            if (ncomm == 64)
                return die("more than 64 groups");
            snprintf(ids[k], sizeof ids[k], "%s", r->id);
            MPI_Comm_split(MPI_COMM_WORLD, r->lo, rank, &comms[k]);
            int sz;
            MPI_Comm_size(comms[k], &sz);
            if (sz != r->n)
                return die("a replayed group's size differs from the traced one");
            ncomm++;
        }
        r->comm = comms[k];
        int red = strcmp(r->op, "-") != 0;
        r->dt = datatype(r, red);
        r->mop = strcmp(r->op, "max") == 0 ? MPI_MAX : strcmp(r->op, "min") == 0 ? MPI_MIN
                 : strcmp(r->type, "bf16") == 0 ? bf16.sum : MPI_SUM;
        double bytes = (double)r->count * r->esize;
        r->cls = bytes <= 64 ? C_CONTROL
                 : strcmp(r->kind, "allreduce") == 0 ? C_ALLREDUCE
                 : strncmp(r->kind, "allgather", 9) == 0 ? C_ALLGATHER
                 : strncmp(r->kind, "reduce_scatter", 14) == 0 ? C_REDUCE_SCATTER : C_OTHER;
        if (strcmp(r->kind, "allgatherv") == 0 || strcmp(r->kind, "reduce_scatter") == 0) {
            r->counts = malloc(sizeof(int) * (size_t)r->n);
            r->displs = malloc(sizeof(int) * (size_t)r->n);
            if (!r->counts || !r->displs)
                return die("out of memory");
            int own = (int)r->own;
            MPI_Allgather(&own, 1, MPI_INT, r->counts, 1, MPI_INT, r->comm);
            for (int j = 0, d = 0; j < r->n; j++)
                r->displs[j] = d, d += r->counts[j];
        }
        if ((size_t)(bytes + 64) > maxbytes)
            maxbytes = (size_t)(bytes + 64);
    }
    int same = ncomm, lo_c = ncomm;
    MPI_Allreduce(MPI_IN_PLACE, &lo_c, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (lo_c != same)
        return die("ranks saw different numbers of groups");

    char *sbuf = calloc(maxbytes, 1), *rbuf = calloc(maxbytes, 1);
    if (!sbuf || !rbuf)
        return die("out of memory");
    double t_cls[C_N] = {0}, total = 0;
    for (int it = 0; it < warm + reps; it++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int i = 0; i < n; i++) {
            rec_t *r = &rec[i];
            MPI_Request q = MPI_REQUEST_NULL;
            int c = (int)r->count, own = (int)r->own, rc = MPI_SUCCESS;
            double t1 = now();
            if (strcmp(r->kind, "allreduce") == 0)
                rc = MPI_Iallreduce(sbuf, rbuf, c, r->dt, r->mop, r->comm, &q);
            else if (strcmp(r->kind, "allgather") == 0)
                rc = MPI_Iallgather(sbuf, own, r->dt, rbuf, own, r->dt, r->comm, &q);
            else if (strcmp(r->kind, "allgatherv") == 0)
                rc = MPI_Iallgatherv(sbuf, own, r->dt, rbuf, r->counts, r->displs, r->dt, r->comm,
                                     &q);
            else if (strcmp(r->kind, "reduce_scatter") == 0)
                rc = MPI_Ireduce_scatter(sbuf, rbuf, r->counts, r->dt, r->mop, r->comm, &q);
            else if (strcmp(r->kind, "reduce_scatter_block") == 0)
                rc = MPI_Ireduce_scatter_block(sbuf, rbuf, own, r->dt, r->mop, r->comm, &q);
            else if (strcmp(r->kind, "bcast") == 0)
                rc = MPI_Ibcast(rbuf, c, r->dt, 0, r->comm, &q);
            else if (strcmp(r->kind, "reduce") == 0)
                rc = MPI_Ireduce(sbuf, rbuf, c, r->dt, r->mop, 0, r->comm, &q);
            else if (strcmp(r->kind, "barrier") == 0)
                rc = MPI_Ibarrier(r->comm, &q);
            else if (strcmp(r->kind, "alltoall") == 0)
                rc = MPI_Ialltoall(sbuf, own, r->dt, rbuf, own, r->dt, r->comm, &q);
            else
                return die("a collective kind the replay does not know (gather, scatter, "
                           "alltoallv) is in the step");
            if (rc != MPI_SUCCESS || mt_wait_all(1, &q) != MT_OK)
                return die("a replayed collective failed");
            if (it >= warm)
                t_cls[r->cls] += now() - t1;
        }
        if (it >= warm)
            total += now() - t0;
    }
    double step_s = total / reps, slowest = 0;
    MPI_Reduce(&step_s, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("replay step_s %.6f", slowest);
        for (int k = 0; k < C_N; k++)
            printf(" %s_s %.6f", class_name[k], t_cls[k] / reps);
        printf(" calls %d reps %d\n", n, reps);
    }
    for (int i = 0; i < n; i++)
        free(rec[i].counts), free(rec[i].displs);
    free(rec), free(sbuf), free(rbuf);
    mt_bf16_comm_free(&bf16);
    MPI_Finalize();
    return 0;
}
