/* test_nccl: the NCCL layer (mt_nccl.h) on the ranks it is launched with:
 * a communicator over MPI_COMM_WORLD made by broadcasting the unique id,
 * all-reduce, all-gather, reduce-scatter and all-to-all of small float
 * buffers on the group's stream ordered after the compute stream, joined
 * back and waited for with the timeout, then the values checked; the
 * padded bf16 collectives of the data- and tensor-parallel layers
 * (all_gatherv, reduce_scatterv with uneven parts, all_reduce_f32) on
 * values whose sums are exact in bf16; and on two ranks or more a
 * one-way message with the receive enqueued early (compute NULL), as the
 * pipeline's channels do.  Exits
 * 77 on every rank when any rank sees no CUDA device (the build machines
 * and CI): there it proves that the NCCL build links.  One rank per GPU:
 * NCCL refuses two ranks on one device, so make check runs it at NP=1
 * (tests/comm/nccl-np1.mpi); a machine with N GPUs runs it with
 * `mpiexec -n N tests/comm/test_nccl` (doc/gpu.md). */
#include <stdlib.h>

#include "mt_cuda.h"
#include "mt_nccl.h"
#include "mt_test.h"

#define N 1000

static void fail_status(const char *what)
{
    fprintf(stderr, "test_nccl: %s: %s (%s)\nhint: %s\n", what, mt_error_message(),
            mt_error_where(), mt_error_hint_text());
    mt_test_failures++;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, have = mt_cuda_device_count() > 0, all = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (rank == 0)
            printf("test_nccl: no CUDA device on some rank: skipping (exit 77)\n");
        MPI_Finalize();
        return 77;
    }
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    mt_cuda_device_t dev;
    mt_cuda_arena_t arena;
    mt_nccl_group_t g;
    if (mt_cuda_device_init(&dev, node) != MT_OK ||
        mt_cuda_arena_init(&arena, "test", (size_t)128 << 20) != MT_OK ||
        mt_cuda_backend_init(&arena, (size_t)1 << 20) != MT_OK) {
        fail_status("device setup");
        MPI_Abort(MPI_COMM_WORLD, 99);
    }
    const mt_backend_t *be = mt_backend_cuda();
    cudaStream_t compute = (cudaStream_t)mt_cuda_stream();
    if (mt_nccl_group_init(&g, MPI_COMM_WORLD, "world", 60.0) != MT_OK) {
        fail_status("communicator");
        MPI_Abort(MPI_COMM_WORLD, 99);
    }
    CHECK(g.rank == rank && g.size == size, "nccl rank %d/%d vs mpi %d/%d", g.rank, g.size, rank,
          size);

    float *h = malloc((size_t)N * size * sizeof(float)), *r = malloc((size_t)N * size * sizeof(float));
    void *send, *recv;
    mt_cuda_arena_alloc(&arena, (size_t)N * size * sizeof(float), &send);
    mt_cuda_arena_alloc(&arena, (size_t)N * size * sizeof(float), &recv);
    /* element i of rank q's block b: q * 1e4 + b * 1e3 + i (exact in float) */
    for (int b = 0; b < size; b++)
        for (int i = 0; i < N; i++)
            h[b * N + i] = (float)(rank * 10000 + b * 1000 + i % 1000);
    be->copy_to_device(send, h, (size_t)N * size * sizeof(float));

    /* all-reduce of the first block */
    if (mt_nccl_all_reduce(&g, send, recv, N, ncclFloat32, ncclSum, compute) != MT_OK ||
        mt_nccl_wait(&g, "all_reduce") != MT_OK)
        fail_status("all_reduce");
    be->copy_to_host(r, recv, (size_t)N * sizeof(float));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (int q = 0; q < size; q++)
            want += q * 10000 + i % 1000;
        bad += r[i] != (float)want;
    }
    CHECK(bad == 0, "all_reduce: %d wrong elements", bad);

    /* all-gather of the first block, joined to the compute stream */
    if (mt_nccl_all_gather(&g, send, recv, N, ncclFloat32, compute) != MT_OK ||
        mt_nccl_join(&g, compute) != MT_OK)
        fail_status("all_gather");
    be->copy_to_host(r, recv, (size_t)N * size * sizeof(float)); /* ordered after the join */
    bad = 0;
    for (int q = 0; q < size; q++)
        for (int i = 0; i < N; i++)
            bad += r[q * N + i] != (float)(q * 10000 + i % 1000);
    CHECK(bad == 0, "all_gather: %d wrong elements", bad);

    /* reduce-scatter: block `rank` summed over ranks */
    if (mt_nccl_reduce_scatter(&g, send, recv, N, ncclFloat32, ncclSum, compute) != MT_OK ||
        mt_nccl_wait(&g, "reduce_scatter") != MT_OK)
        fail_status("reduce_scatter");
    be->copy_to_host(r, recv, (size_t)N * sizeof(float));
    bad = 0;
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (int q = 0; q < size; q++)
            want += q * 10000 + rank * 1000 + i % 1000;
        bad += r[i] != (float)want;
    }
    CHECK(bad == 0, "reduce_scatter: %d wrong elements", bad);

    /* all-to-all: block q of the result is rank q's block `rank` */
    if (mt_nccl_all_to_all(&g, send, recv, N, ncclFloat32, compute) != MT_OK ||
        mt_nccl_wait(&g, "all_to_all") != MT_OK)
        fail_status("all_to_all");
    be->copy_to_host(r, recv, (size_t)N * size * sizeof(float));
    bad = 0;
    for (int q = 0; q < size; q++)
        for (int i = 0; i < N; i++)
            bad += r[q * N + i] != (float)(q * 10000 + rank * 1000 + i % 1000);
    CHECK(bad == 0, "all_to_all: %d wrong elements", bad);

    /* bf16, uneven parts: rank q holds cnt[q] = N - 37 q elements of
     * value q + i % 4 (sums over 8 ranks stay exact in bf16) */
    int *cnt = malloc(sizeof(int) * (size_t)size), *dsp = malloc(sizeof(int) * (size_t)size);
    int tot = 0;
    for (int q = 0; q < size; q++)
        cnt[q] = N - 37 * q, dsp[q] = tot, tot += cnt[q];
    void *pad;
    mt_cuda_arena_alloc(&arena, (size_t)N * size * 2, &pad);
    for (int i = 0; i < tot; i++)
        h[i] = (float)(rank + i % 4);
    be->copy_to_device(send, h, (size_t)tot * sizeof(float));
    if (mt_nccl_all_gatherv(&g, (float *)send + dsp[rank], recv, cnt, dsp, pad, 1, compute) !=
            MT_OK || mt_nccl_join(&g, compute) != MT_OK)
        fail_status("all_gatherv bf16");
    be->copy_to_host(r, recv, (size_t)tot * sizeof(float));
    bad = 0;
    for (int q = 0; q < size; q++)
        for (int i = 0; i < cnt[q]; i++)
            bad += r[dsp[q] + i] != (float)(q + (dsp[q] + i) % 4);
    CHECK(bad == 0, "all_gatherv bf16: %d wrong elements", bad);
    if (mt_nccl_reduce_scatterv(&g, send, recv, cnt, dsp, pad, 1, compute) != MT_OK ||
        mt_nccl_join(&g, compute) != MT_OK)
        fail_status("reduce_scatterv bf16");
    be->copy_to_host(r, recv, (size_t)cnt[rank] * sizeof(float));
    bad = 0;
    for (int i = 0; i < cnt[rank]; i++) {
        int want = 0;
        for (int q = 0; q < size; q++)
            want += q + (dsp[rank] + i) % 4;
        bad += r[i] != (float)want;
    }
    CHECK(bad == 0, "reduce_scatterv bf16: %d wrong elements", bad);
    if (mt_nccl_all_reduce_f32(&g, send, (size_t)N, pad, 1, compute) != MT_OK ||
        mt_nccl_join(&g, compute) != MT_OK)
        fail_status("all_reduce_f32 bf16");
    be->copy_to_host(r, send, (size_t)N * sizeof(float));
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += r[i] != (float)(size * (size - 1) / 2 + size * (i % 4));
    CHECK(bad == 0, "all_reduce_f32 bf16: %d wrong elements", bad);

    /* one way, as a pipeline channel: rank 2k sends to 2k + 1, whose
     * receive is enqueued early (compute NULL) and joined */
    for (int i = 0; i < N; i++)
        h[i] = (float)(rank * 10000 + i);
    be->copy_to_device(send, h, (size_t)N * sizeof(float));
    int peer = rank ^ 1;
    if (peer < size) {
        mt_status_t st = rank % 2 ? mt_nccl_recv(&g, recv, N, ncclFloat32, peer, NULL)
                                  : mt_nccl_send(&g, send, N, ncclFloat32, peer, compute);
        if (st != MT_OK || mt_nccl_join(&g, compute) != MT_OK)
            fail_status("send/recv");
        if (rank % 2) {
            be->copy_to_host(r, recv, (size_t)N * sizeof(float));
            bad = 0;
            for (int i = 0; i < N; i++)
                bad += r[i] != (float)(peer * 10000 + i);
            CHECK(bad == 0, "early receive: %d wrong elements from rank %d", bad, peer);
        }
    }
    free(cnt), free(dsp);

    mt_nccl_group_free(&g);
    mt_cuda_backend_free();
    mt_cuda_arena_free(&arena);
    free(h), free(r);
    MPI_Comm_free(&node);
    const int rc = mt_test_exit_mpi("test_nccl", MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
