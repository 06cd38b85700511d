/* mt_test.h: the few assertions meshtrain's test programs share.
 * A failed CHECK prints file:line and counts; the program's exit code is
 * mt_test_exit(): 0 pass, 1 fail.  MPI tests combine the count over all
 * ranks first (mt_test_exit_mpi), so every rank agrees on the verdict. */
#ifndef MT_TEST_H
#define MT_TEST_H

#include <mpi.h>
#include <stdio.h>
#include <string.h>

static int mt_test_failures;
static int mt_test_checks;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        mt_test_checks++;                                                       \
        if (!(cond)) {                                                          \
            mt_test_failures++;                                                 \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* The message must contain every needle. */
#define CHECK_CONTAINS(hay, needle)                                             \
    CHECK(strstr((hay), (needle)) != NULL, "expected \"%s\" in:\n%s", (needle), (hay))

static inline int mt_test_exit(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, mt_test_checks, mt_test_failures);
    return mt_test_failures ? 1 : 0;
}

static inline int mt_test_exit_mpi(const char *name, MPI_Comm comm)
{
    int total = 0, rank = 0, checks = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Allreduce(&mt_test_failures, &total, 1, MPI_INT, MPI_SUM, comm);
    MPI_Reduce(&mt_test_checks, &checks, 1, MPI_INT, MPI_SUM, 0, comm);
    if (rank == 0)
        printf("%s: %d checks over all ranks, %d failed\n", name, checks, total);
    return total ? 1 : 0;
}

#endif
