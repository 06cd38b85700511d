/* bench_load.c: the load of a model by name at start, alone, for
 * bench_load.sh: mt_hf_load_weights, the function the trainer calls, into
 * blocks split by rows over the ranks as FSDP splits a model (each rank
 * reads 1/size of every tensor), the destination touched first as the
 * trainer's initialised weights are.  Without the rest of a training run,
 * so a 1B model loads on a machine that could not train it.
 *
 *   mpiexec -n N bench_load NAME [REPEATS]
 *
 * Prints one line per repeat: seconds and GB/s of the files' tensor bytes,
 * and the CPU seconds of all ranks together (the figure a shared machine
 * disturbs least). */
#include <config.h>

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hf_internal.h"
#include "mt_hf.h"

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm comm = MPI_COMM_WORLD;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (argc < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: bench_load NAME [REPEATS]\n");
        MPI_Finalize();
        return 2;
    }
    int repeats = argc > 2 ? atoi(argv[2]) : 3;
    mt_config_t *cfg = calloc(1, sizeof *cfg);
    mt_status_t s = MT_OK;
    if (rank == 0) {
        mt_config_init(cfg);
        snprintf(cfg->model.pretrained_model_name_or_path,
                 sizeof cfg->model.pretrained_model_name_or_path, "%s", argv[1]);
        s = mt_hf_apply_named_model(cfg, stderr);
    }
    MPI_Bcast(&s, 1, MPI_INT, 0, comm);
    if (s != MT_OK) {
        if (rank == 0)
            fprintf(stderr, "bench_load: %s\n", mt_error_message());
        MPI_Finalize();
        return 1;
    }
    MPI_Bcast(&cfg->model, (int)sizeof cfg->model, MPI_BYTE, 0, comm);
    mt_hf_tensor_t *x;
    int n;
    if (mt_hf_expected_tensors(&cfg->model, &x, &n) != MT_OK) {
        fprintf(stderr, "bench_load: %s\n", mt_error_message());
        MPI_Abort(comm, 1);
    }
    mt_ckpt_tensor_t *t = calloc((size_t)n, sizeof *t);
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        int64_t rows = x[i].shape[0], cols = x[i].ndim > 1 ? x[i].shape[1] : 1;
        snprintf(t[i].path, sizeof t[i].path, "/model/%s", x[i].name);
        t[i].ndim = x[i].ndim;
        t[i].shape[0] = rows, t[i].shape[1] = x[i].shape[1];
        t[i].row_offset = rows * rank / size;
        t[i].row_count = rows * (rank + 1) / size - t[i].row_offset;
        size_t numel = (size_t)(t[i].row_count * cols);
        t[i].data = malloc(sizeof(float) * (numel ? numel : 1));
        if (!t[i].data) {
            fprintf(stderr, "bench_load: out of memory\n");
            MPI_Abort(comm, 1);
        }
        /* touched (not zeros: malloc and memset 0 may become calloc's
         * untouched pages), as the trainer's initialised weights are */
        for (size_t k = 0; k < numel; k++)
            t[i].data[k] = 1.0f;
        bytes += (double)(rows * cols) * 2.0; /* reported per bf16 byte of the files */
    }
    for (int r = 0; r < repeats; r++) {
        MPI_Barrier(comm);
        double t0 = MPI_Wtime(), c0 = cpu_seconds();
        s = mt_hf_load_weights(comm, &cfg->model, t, n, r == 0 && rank == 0 ? stdout : NULL);
        double cpu = cpu_seconds() - c0, cpu_all = 0;
        MPI_Barrier(comm);
        double dt = MPI_Wtime() - t0;
        MPI_Reduce(&cpu, &cpu_all, 1, MPI_DOUBLE, MPI_SUM, 0, comm);
        if (s != MT_OK) {
            if (rank == 0)
                fprintf(stderr, "bench_load: %s\n", mt_error_message());
            MPI_Finalize();
            return 1;
        }
        if (rank == 0)
            printf("bench_load: %d rank%s: %.3f s, %.2f GB/s of %.2f GB, %.3f CPU s\n", size,
                   size == 1 ? "" : "s", dt, bytes / dt / 1e9, bytes / 1e9, cpu_all);
        fflush(stdout);
    }
    for (int i = 0; i < n; i++)
        free(t[i].data);
    free(t);
    free(x);
    free(cfg);
    MPI_Finalize();
    return 0;
}
