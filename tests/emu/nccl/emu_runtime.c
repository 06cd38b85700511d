/* emu_runtime.c: the CUDA runtime and NCCL calls of libmeshtrain's C
 * files, emulated on the host over MPI (`make emulate-nccl`; doc/gpu.md,
 * "Host emulation of the NCCL paths").
 *
 * "Device" memory is host memory.  A stream is a queue of pending items:
 * an NCCL operation (its MPI requests), a wait for another stream's event,
 * or a copy.  Compute-stream kernels and copies run on the host when they
 * are launched, once everything queued on that stream is done (emu_drain);
 * a copy on another stream is queued and runs only when something waits
 * for it (a join, a query, a later operation of its stream).  An NCCL
 * operation first completes what its stream waits on and the copies
 * before it (the data it sends), then posts non-blocking MPI calls and
 * queues their requests, so the host runs ahead as it does on a GPU.
 * Events are (stream, position) pairs.  Communicators are MPI
 * communicators of the same members, made from the unique id (which
 * names its creator's world rank).  Sends are synchronous (MPI_Issend): a
 * send completes once its receive is posted, as NCCL's do.  bf16 sums add
 * in fp32 and round each partial, as NCCL's reductions do per step.
 *
 * What this checks: the layer's buffers, counts, displacements, pads, wire
 * conversions and communicator use, the matching of point-to-point
 * operations, and that every consumer joins the operation it reads (a
 * missing join reads a buffer whose MPI receive has not completed).  What
 * it cannot: timing, true stream concurrency, NCCL's own failures. */
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime.h"
#include "emu.h"
#include "mt_bf16.h" /* mt_f32_to_bf16, mt_bf16_to_f32 */
#include "mt_comm_bf16.h" /* the library's bf16 type and sum: NCCL's bf16 sum */
#include "nccl.h"

/* MPICH annotates MPI_Testall/Waitall with array sizes that GCC checks
 * against the requests of an empty item (never passed: nreq > 0 first) */
#pragma GCC diagnostic ignored "-Wstringop-overflow"

/* ------------------------------------------------------------------ streams */

enum { ITEM_REQ, ITEM_DEP, ITEM_COPY };
typedef struct {
    int kind;
    MPI_Request *req;           /* ITEM_REQ: an NCCL operation's */
    int nreq;
    void *tmp;                  /* freed when done */
    struct mt_emu_stream *on;   /* ITEM_DEP: wait for item seq of stream on */
    long seq;
    void *dst;                  /* ITEM_COPY: n bytes or elements, mode */
    const void *src;
    int64_t n;
    int mode;
} item_t;

/* The overlap report (MT_EMU_OVERLAP=FILE): per kind of operation, how
 * many the compute stream joined, and how many compute kernels were
 * launched between an operation's post and its join: the work it can
 * overlap on a GPU, in stream order, which the emulation knows exactly. */
enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_P2P, OP_KINDS };
static const char *const op_name[OP_KINDS] = {"all_reduce", "all_gather", "reduce_scatter",
                                              "send_recv"};
static long op_posted[OP_KINDS], op_joined[OP_KINDS], op_hidden[OP_KINDS], op_kernels[OP_KINDS];
static long kernels; /* compute-stream kernels so far */

void mt_emu_kernel(void) { kernels++; }

struct mt_emu_stream {
    item_t *items;              /* items[k] is item number base + k + 1 */
    long base, n, cap;
    long done;                  /* items done (read by the watchdog thread) */
    /* the overlap report: item q's kind (OP_*, -1 for others) and the
     * kernels launched before it, kept for every item (the queue forgets
     * them), and the items the compute stream has joined */
    int *op_of;
    long *k_of, ncap, joined;
};

struct mt_emu_event {
    struct mt_emu_stream *s;
    long seq;
    double t;
};

#define MAX_STREAMS 1024
static struct mt_emu_stream *streams[MAX_STREAMS];
static int nstreams;
static struct mt_emu_stream compute_stream;
static pthread_t main_thread;
static int main_known;

static void fatal(const char *what)
{
    fprintf(stderr, "meshtrain NCCL emulation: %s\n", what);
    abort();
}

static int on_main(void)
{
    if (!main_known) {
        main_thread = pthread_self();
        main_known = 1;
    }
    return pthread_equal(main_thread, pthread_self());
}

static long pushed(const struct mt_emu_stream *s) { return s->base + s->n; }

static long done_of(const struct mt_emu_stream *s)
{
    return __atomic_load_n(&s->done, __ATOMIC_ACQUIRE);
}

static item_t *push(struct mt_emu_stream *s)
{
    if (s->done == pushed(s)) /* all done: start over */
        s->base = s->done, s->n = 0;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->items = realloc(s->items, sizeof *s->items * (size_t)s->cap);
        if (!s->items)
            fatal("out of memory");
    }
    long q = pushed(s); /* this item's index in the overlap record */
    if (q >= s->ncap) {
        s->ncap = s->ncap ? 2 * s->ncap : 64;
        s->op_of = realloc(s->op_of, sizeof *s->op_of * (size_t)s->ncap);
        s->k_of = realloc(s->k_of, sizeof *s->k_of * (size_t)s->ncap);
        if (!s->op_of || !s->k_of)
            fatal("out of memory");
    }
    s->op_of[q] = -1;
    item_t *it = &s->items[s->n++];
    memset(it, 0, sizeof *it);
    return it;
}

static void finish(struct mt_emu_stream *s)
{
    item_t *it = &s->items[s->done - s->base];
    free(it->req);
    free(it->tmp);
    it->req = NULL, it->tmp = NULL;
    __atomic_store_n(&s->done, s->done + 1, __ATOMIC_RELEASE);
}

void mt_emu_convert(void *dst, const void *src, int64_t n, int to_bf16)
{
    if (to_bf16)
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = mt_f32_to_bf16(((const float *)src)[i]);
    else
        for (int64_t i = 0; i < n; i++)
            ((float *)dst)[i] = mt_bf16_to_f32(((const uint16_t *)src)[i]);
}

static void run_copy(const item_t *it)
{
    if (it->mode == 0)
        memmove(it->dst, it->src, (size_t)it->n);
    else
        mt_emu_convert(it->dst, it->src, it->n, it->mode == 1);
}

static int stream_test(struct mt_emu_stream *s, long upto, int copies);

/* 1 when the item is done (a copy runs now when copies is set) */
static int item_test(item_t *it, int copies)
{
    if (it->kind == ITEM_DEP)
        return stream_test(it->on, it->seq, copies);
    if (it->kind == ITEM_COPY) {
        if (copies)
            run_copy(it);
        return copies;
    }
    int flag = 1;
    if (it->nreq > 0 && MPI_Testall(it->nreq, it->req, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        fatal("MPI_Testall failed");
    return flag;
}

/* Complete s's items up to number upto without blocking; 1 when done.
 * Without copies, stop at a copy: a stream's copies run only when
 * something waits for them (a join, a query, a later operation of the
 * stream), so a consumer that does not join reads the buffer before it. */
static int stream_test(struct mt_emu_stream *s, long upto, int copies)
{
    while (s->done < upto) {
        if (!item_test(&s->items[s->done - s->base], copies))
            return 0;
        finish(s);
    }
    return 1;
}

static void stream_wait(struct mt_emu_stream *s, long upto)
{
    while (s->done < upto) {
        item_t *it = &s->items[s->done - s->base];
        if (it->kind == ITEM_DEP)
            stream_wait(it->on, it->seq);
        else if (it->kind == ITEM_COPY)
            run_copy(it);
        else if (it->nreq > 0 && MPI_Waitall(it->nreq, it->req, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            fatal("MPI_Waitall failed");
        finish(s);
    }
}

/* Before a new operation of s: what it may read is there.  Everything up
 * to s's last queued wait or copy is done (in stream order); operations
 * queued after those may still be in flight (an early receive does not
 * hold up the next one). */
static void stream_ready(struct mt_emu_stream *s)
{
    long last = 0;
    for (long k = s->done - s->base; k < s->n; k++)
        if (s->items[k].kind != ITEM_REQ)
            last = s->base + k + 1;
    stream_wait(s, last);
}

static struct mt_emu_stream *S(cudaStream_t s) { return s ? s : &compute_stream; }

void mt_emu_progress(void)
{
    for (int i = 0; i < nstreams; i++)
        (void)stream_test(streams[i], pushed(streams[i]), 0);
}

void mt_emu_copy(cudaStream_t s, void *dst, const void *src, int64_t n, int mode)
{
    struct mt_emu_stream *x = S(s);
    if (x == &compute_stream) { /* the compute stream's work runs as it is launched */
        mt_emu_drain(s);
        item_t it = {.kind = ITEM_COPY, .dst = dst, .src = src, .n = n, .mode = mode};
        run_copy(&it);
        return;
    }
    item_t *it = push(x);
    it->kind = ITEM_COPY, it->dst = dst, it->src = src, it->n = n, it->mode = mode;
}

void mt_emu_drain(cudaStream_t s)
{
    struct mt_emu_stream *x = S(s);
    stream_wait(x, pushed(x));
    mt_emu_progress();
}

void mt_emu_drain_all(void)
{
    stream_wait(&compute_stream, pushed(&compute_stream));
    for (int i = 0; i < nstreams; i++)
        stream_wait(streams[i], pushed(streams[i]));
}

cudaStream_t mt_emu_compute_stream(void) { return &compute_stream; }

/* ------------------------------------------------------------------ CUDA runtime */

static size_t gpu_bytes(void)
{
    const char *e = getenv("MT_EMU_GPU_MB");
    long mb = e && atol(e) > 0 ? atol(e) : 1024;
    return (size_t)mb << 20;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    (void)on_main();
    return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    (void)d;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation");
    p->totalGlobalMem = gpu_bytes();
    p->major = 9, p->minor = 0, p->multiProcessorCount = 1;
    return cudaSuccess;
}

/* a GPU of its own per rank; MT_EMU_SHARED_GPU=1: one GPU that every rank
 * of the machine shares (the MPI-staged collectives then take over) */
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int d)
{
    (void)d;
    const char *e = getenv("MT_EMU_SHARED_GPU");
    if (e && atoi(e))
        snprintf(bus, (size_t)len, "emu:shared");
    else
        snprintf(bus, (size_t)len, "emu:%ld", (long)getpid());
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    *free_b = *total_b = gpu_bytes();
    return cudaSuccess;
}

/* the ranges of cudaMalloc and cudaMallocHost (mt_emu_device_ptr) */
typedef struct {
    const char *p;
    size_t n;
} range_t;
static range_t *ranges;
static int nranges, cap_ranges;

/* (p not const: GCC 12 takes a const pointer to new memory for a read) */
static void remember(void *p, size_t n)
{
    if (nranges == cap_ranges) {
        cap_ranges = cap_ranges ? 2 * cap_ranges : 64;
        ranges = realloc(ranges, (size_t)cap_ranges * sizeof *ranges);
        if (!ranges)
            fatal("out of host memory");
    }
    ranges[nranges].p = p, ranges[nranges].n = n ? n : 1;
    nranges++;
}

/* 1 when p started a range (now forgotten), else 0 */
static int forget(const void *p)
{
    for (int i = 0; i < nranges; i++)
        if (ranges[i].p == p) {
            ranges[i] = ranges[--nranges];
            return 1;
        }
    return 0;
}

int mt_emu_device_ptr(const void *p)
{
    for (int i = 0; i < nranges; i++)
        if ((const char *)p >= ranges[i].p && (const char *)p < ranges[i].p + ranges[i].n)
            return 1;
    return 0;
}

/* MT_EMU_POISON=1 (the kernel emulation, tests/emu/cuda) fills new
 * device memory with 0xff bytes, NaN as float: a kernel that reads memory
 * nothing wrote shows it, as cudaMalloc promises nothing either */
cudaError_t cudaMalloc(void **p, size_t bytes)
{
    /* 256-byte aligned, as cudaMalloc's (aligned_alloc: a multiple of it) */
    void *q = aligned_alloc(256, ((bytes ? bytes : 1) + 255) & ~(size_t)255);
    *p = NULL;
    if (!q)
        return cudaErrorMemoryAllocation;
    const char *e = getenv("MT_EMU_POISON");
    if (e && atoi(e))
        memset(q, 0xff, bytes);
    remember(q, bytes);
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    if (!*p)
        return cudaErrorMemoryAllocation;
    remember(*p, bytes);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (p && !forget(p))
        return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}

/* like a copy: after the stream's queued work (drained first) */
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s)
{
    mt_emu_drain(s);
    memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    (void)device;
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 232448; return cudaSuccess;
    }
    return cudaErrorInvalidValue;
}

cudaError_t cudaFree(void *p)
{
    if (p && !forget(p)) /* not an allocation's start, as the runtime refuses */
        return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    (void)kind;
    mt_emu_copy(s, dst, src, (int64_t)bytes, 0);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (on_main())
        mt_emu_drain_all();
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : e == cudaErrorNotReady ? "device not ready" : "error";
}

const char *cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess ? "cudaSuccess" : e == cudaErrorNotReady ? "cudaErrorNotReady"
                                                                     : "cudaError";
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    if (nstreams == MAX_STREAMS)
        fatal("too many streams");
    struct mt_emu_stream *x = calloc(1, sizeof *x);
    if (!x)
        return cudaErrorMemoryAllocation;
    streams[nstreams++] = x;
    *s = x;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s || s == &compute_stream)
        return cudaSuccess;
    stream_wait(s, pushed(s));
    for (int i = 0; i < nstreams; i++)
        if (streams[i] == s) {
            streams[i] = streams[--nstreams];
            break;
        }
    free(s->items);
    free(s->op_of);
    free(s->k_of);
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)flags;
    struct mt_emu_stream *x = S(s);
    if (!e->s || e->s == x)
        return cudaSuccess;
    if (x == &compute_stream && e->s->op_of) /* a join: what operations up to e overlapped */
        for (; e->s->joined < e->seq; e->s->joined++) {
            long q = e->s->joined;
            int op = e->s->op_of[q];
            if (op >= 0) {
                op_joined[op]++;
                op_kernels[op] += kernels - e->s->k_of[q];
                op_hidden[op] += kernels > e->s->k_of[q];
            }
        }
    if (done_of(e->s) >= e->seq)
        return cudaSuccess;
    item_t *it = push(x);
    it->kind = ITEM_DEP, it->on = e->s, it->seq = e->seq;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    mt_emu_drain(s);
    return cudaSuccess;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    *e = calloc(1, sizeof **e);
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    struct mt_emu_stream *x = S(s);
    e->seq = 0, e->t = now();
    __atomic_store_n(&e->s, x, __ATOMIC_RELEASE);
    __atomic_store_n(&e->seq, pushed(x), __ATOMIC_RELEASE);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    struct mt_emu_stream *x = __atomic_load_n(&e->s, __ATOMIC_ACQUIRE);
    long seq = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
    if (!x || done_of(x) >= seq)
        return cudaSuccess;
    if (!on_main()) /* the watchdog thread: no MPI calls there */
        return cudaErrorNotReady;
    return stream_test(x, seq, 1) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (e->s)
        stream_wait(e->s, e->seq);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)(1e3 * (b->t - a->t));
    return cudaSuccess;
}

/* ------------------------------------------------------------------ NCCL */

struct mt_emu_comm {
    MPI_Comm comm;
    int rank, size;
};

#define ID_MAGIC 0x4e43454d /* "MECN" */
typedef struct {
    int magic, root_world, serial;
} id_t_;

static int serial;

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    id_t_ x = {ID_MAGIC, 0, serial++};
    MPI_Comm_rank(MPI_COMM_WORLD, &x.root_world);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &x, sizeof x);
    return ncclSuccess;
}

/* tags on MPI_COMM_WORLD for the members' join and the root's answer */
#define TAG_JOIN 20000
#define TAG_LIST 23000
#define TAG_MAKE 26000

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    (void)config;
    (void)on_main();
    id_t_ x;
    memcpy(&x, id.internal, sizeof x);
    if (x.magic != ID_MAGIC || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    int me, *world = malloc(sizeof *world * (size_t)nranks);
    if (!world)
        return ncclSystemError;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const int tag = x.serial % 3000;
    if (rank == 0) {
        world[0] = me;
        for (int i = 1; i < nranks; i++) {
            int m[2];
            MPI_Recv(m, 2, MPI_INT, MPI_ANY_SOURCE, TAG_JOIN + tag, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            if (m[0] <= 0 || m[0] >= nranks)
                fatal("a member joined with a bad rank");
            world[m[0]] = m[1];
        }
        for (int i = 1; i < nranks; i++)
            MPI_Send(world, nranks, MPI_INT, world[i], TAG_LIST + tag, MPI_COMM_WORLD);
    } else {
        int m[2] = {rank, me};
        MPI_Send(m, 2, MPI_INT, x.root_world, TAG_JOIN + tag, MPI_COMM_WORLD);
        MPI_Recv(world, nranks, MPI_INT, x.root_world, TAG_LIST + tag, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    }
    MPI_Group wg, g;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_incl(wg, nranks, world, &g);
    struct mt_emu_comm *c = calloc(1, sizeof *c);
    if (!c || MPI_Comm_create_group(MPI_COMM_WORLD, g, TAG_MAKE + tag, &c->comm) != MPI_SUCCESS)
        fatal("cannot make the communicator");
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    free(world);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    if (c->rank != rank || c->size != nranks)
        fatal("communicator ranks do not follow the id's");
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    (void)comm;
    *state = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    (void)comm;
    mt_emu_drain_all();
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    MPI_Comm_free(&comm->comm);
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    (void)comm; /* peers may still be inside an operation on it: leaked */
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclSuccess ? "no error" : r == ncclInProgress ? "in progress" : "emulated error";
}

/* The library's bf16 wire type and sum (mt_comm_bf16.h: float32 adds, each
 * partial rounded, as NCCL's), made at first use. */
static const mt_bf16_comm_t *bf16_wire(void)
{
    static mt_bf16_comm_t w;
    if (!w.ready && mt_bf16_comm_init(&w) != MT_OK)
        fatal("bf16 wire type and sum");
    return &w;
}

static MPI_Datatype mpi_type(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    case ncclFloat16: return MPI_UINT16_T;
    case ncclBfloat16: return bf16_wire()->type;
    default: fatal("data type not emulated");
    }
    return MPI_DATATYPE_NULL;
}

static size_t type_bytes(ncclDataType_t t)
{
    int n = 0;
    MPI_Type_size(mpi_type(t), &n);
    return (size_t)n;
}

static MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t t)
{
    if (t == ncclBfloat16) {
        if (op != ncclSum)
            fatal("bf16 reductions other than sum are not emulated");
        return bf16_wire()->sum;
    }
    switch (op) {
    case ncclSum: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: fatal("reduction not emulated");
    }
    return MPI_OP_NULL;
}

/* MT_EMU_HANG=R:K: world rank R's K-th NCCL operation (from 1) never
 * completes, as a rank that died or hangs inside a collective (the
 * watchdog's test) */
static int hang_now(void)
{
    static long ops;
    const char *e = getenv("MT_EMU_HANG");
    int r, me;
    long k;
    ops++;
    if (!e || sscanf(e, "%d:%ld", &r, &k) != 2)
        return 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    return me == r && ops == k;
}

static int report_rank; /* the world rank, known while MPI is up */

static void overlap_report(void)
{
    const char *path = getenv("MT_EMU_OVERLAP");
    int me = report_rank;
    char file[4096];
    snprintf(file, sizeof file, "%s.%d", path, me);
    FILE *f = fopen(file, "w");
    if (!f)
        return;
    for (int k = 0; k < OP_KINDS; k++)
        fprintf(f, "%s posted %ld joined %ld overlapped %ld kernels %ld\n", op_name[k],
                op_posted[k], op_joined[k], op_hidden[k], op_kernels[k]);
    fclose(f);
}

/* a queued operation (kind op) of n requests on s, after what s waits on */
static item_t *begin_op(cudaStream_t s, int nreq, int op)
{
    static int reporting;
    if (!reporting && getenv("MT_EMU_OVERLAP")) {
        reporting = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &report_rank);
        atexit(overlap_report);
    }
    struct mt_emu_stream *x = S(s);
    stream_ready(x);
    op_posted[op]++;
    item_t *it = push(x);
    it->kind = ITEM_REQ, it->nreq = nreq;
    x->op_of[pushed(x) - 1] = op, x->k_of[pushed(x) - 1] = kernels;
    it->req = calloc((size_t)(nreq > 0 ? nreq : 1), sizeof *it->req);
    if (!it->req)
        fatal("out of memory");
    if (hang_now()) { /* a receive nobody sends, in place of the operation */
        static int sink;
        it->nreq = 1;
        MPI_Irecv(&sink, 1, MPI_INT, MPI_ANY_SOURCE, 31999, MPI_COMM_SELF, &it->req[0]);
        return NULL;
    }
    return it;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s)
{
    item_t *it = begin_op(s, 1, OP_ALL_REDUCE);
    if (!it)
        return ncclSuccess;
    if (MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type(type),
                       mpi_op(op, type), comm->comm, &it->req[0]) != MPI_SUCCESS)
        return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t s)
{
    item_t *it = begin_op(s, 1, OP_ALL_GATHER);
    if (!it)
        return ncclSuccess;
    const size_t b = count * type_bytes(type);
    const void *in = send;
    if ((const char *)send == (const char *)recv + (size_t)comm->rank * b)
        in = MPI_IN_PLACE; /* NCCL's in-place: own part at its slot */
    else if ((const char *)send < (const char *)recv + (size_t)comm->size * b &&
             (const char *)send + b > (const char *)recv)
        fatal("all_gather: send overlaps recv but is not the rank's slot");
    if (MPI_Iallgather(in, (int)count, mpi_type(type), recv, (int)count, mpi_type(type),
                       comm->comm, &it->req[0]) != MPI_SUCCESS)
        return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s)
{
    item_t *it = begin_op(s, 1, OP_REDUCE_SCATTER);
    if (!it)
        return ncclSuccess;
    const size_t b = count * type_bytes(type), all = b * (size_t)comm->size;
    if ((const char *)recv < (const char *)send + all && (const char *)recv + b > (const char *)send) {
        /* NCCL's in-place (recv is the rank's slot of send): from a copy */
        if (!(it->tmp = malloc(all)))
            fatal("out of memory");
        memcpy(it->tmp, send, all);
        send = it->tmp;
    }
    if (MPI_Ireduce_scatter_block(send, recv, (int)count, mpi_type(type), mpi_op(op, type),
                                  comm->comm, &it->req[0]) != MPI_SUCCESS)
        return ncclSystemError;
    return ncclSuccess;
}

/* point-to-point: posted at once outside a group, at ncclGroupEnd inside */
typedef struct {
    int send;
    void *buf;
    size_t bytes;
    int peer;
    ncclComm_t comm;
    cudaStream_t s;
} p2p_t;

static p2p_t *pend;
static int npend, cappend, depth;
static ncclResult_t group_post(void);

static ncclResult_t p2p(int send, const void *buf, size_t count, ncclDataType_t type, int peer,
                        ncclComm_t comm, cudaStream_t s)
{
    if (peer < 0 || peer >= comm->size)
        return ncclInvalidArgument;
    if (npend == cappend) {
        cappend = cappend ? 2 * cappend : 64;
        if (!(pend = realloc(pend, sizeof *pend * (size_t)cappend)))
            fatal("out of memory");
    }
    pend[npend++] = (p2p_t){send, (void *)buf, count * type_bytes(type), peer, comm, s};
    return depth > 0 ? ncclSuccess : group_post();
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t s)
{
    return p2p(1, buf, count, type, peer, comm, s);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t s)
{
    return p2p(0, buf, count, type, peer, comm, s);
}

ncclResult_t ncclGroupStart(void)
{
    depth++;
    return ncclSuccess;
}

/* the pending operations of stream s posted: keep the other streams' */
static void drop(cudaStream_t s)
{
    int m = 0;
    for (int i = 0; i < npend; i++)
        if (pend[i].s != s)
            pend[m++] = pend[i];
    npend = m;
}

/* the pending operations, one queued item per stream: receives posted
 * first, then sends (a group is one operation) */
static ncclResult_t group_post(void)
{
    while (npend > 0) {
        cudaStream_t s = pend[0].s;
        int n = 0;
        for (int i = 0; i < npend; i++)
            n += pend[i].s == s;
        item_t *it = begin_op(s, n, OP_P2P);
        int k = 0;
        if (!it) { /* hangs: nothing posted */
            drop(s);
            continue;
        }
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < npend; i++) {
                p2p_t *p = &pend[i];
                if (p->s != s || p->send != pass)
                    continue;
                if (p->bytes > (size_t)INT32_MAX)
                    fatal("message over 2 GiB");
                int rc = p->send ? MPI_Issend(p->buf, (int)p->bytes, MPI_BYTE, p->peer, 0,
                                             p->comm->comm, &it->req[k++])
                                 : MPI_Irecv(p->buf, (int)p->bytes, MPI_BYTE, p->peer, 0,
                                             p->comm->comm, &it->req[k++]);
                if (rc != MPI_SUCCESS)
                    return ncclSystemError;
            }
        drop(s);
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (depth == 0)
        return ncclInvalidUsage;
    return --depth > 0 ? ncclSuccess : group_post();
}
