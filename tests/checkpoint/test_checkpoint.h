/* test_checkpoint.h: the parts of test_checkpoint that live in their own
 * files.  mt_test.h's counters are per file, so each part hands its
 * counts back to main, which adds them before the verdict. */
#ifndef TEST_CHECKPOINT_H
#define TEST_CHECKPOINT_H

#include <mpi.h>

/* test_checkpoint_blocks.c: tensors saved and loaded as blocks of rows x
 * columns (tensor parallelism's column blocks), under root/blocks. */
void test_blocks(MPI_Comm comm, const char *root, int *checks, int *failures);

/* Only write step 1 of the block tensors, as a grid of blocks, into dir
 * (for tests/checkpoint/checkpoint_h5dump.sh); 0 when every rank succeeded. */
int save_blocks_only(MPI_Comm comm, const char *dir);

/* test_checkpoint_sha256.c: SHA-256 vectors, in memory and from a file
 * under root (rank 0 only). */
void test_sha256(const char *root, int *checks, int *failures);

#endif
