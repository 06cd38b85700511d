/* mt_ckpt_cli.h: meshtrain-ckpt, the checkpoint tool, as library entry
 * points so tests can drive it in-process with their own streams.
 *
 * list, verify, config and steps read checkpoints (doc/checkpoints.md) and
 * never write them.  They need no MPI launch and never call MPI_Init: they
 * open model.h5 with HDF5's default (serial) driver, which a parallel HDF5
 * build serves without MPI; the MPI-IO driver would not work there.
 *
 * export and import (doc/hf-interchange.md) convert to and from Hugging
 * Face safetensors; they are collective over a communicator. */
#ifndef MT_CKPT_CLI_H
#define MT_CKPT_CLI_H

#include <mpi.h>
#include <stdio.h>

#include "mt_hf.h" /* mt_ckpt_hf_main: export and import */

#ifdef __cplusplus
extern "C" {
#endif

/* meshtrain-ckpt {list|verify|config|steps} [--json] PATH.  Returns the
 * process exit code: 0 ok, 1 error (a bad or missing checkpoint), 2 usage. */
int mt_ckpt_main(int argc, char **argv, FILE *out, FILE *err);

/* The program: export and import run between MPI_Init and MPI_Finalize
 * on MPI_COMM_WORLD (a single process, or under mpiexec); every other
 * command goes to mt_ckpt_main without MPI. */
int mt_ckpt_tool_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
