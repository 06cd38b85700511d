/* mt_data_cli.h: meshtrain-data, the dataset tool, as library entry points
 * so tests can drive it in-process with their own streams.
 *
 * Making datasets (doc/data.md, "meshtrain-data") is collective over a
 * communicator: run it as one process or under mpiexec.  --inspect,
 * --help, --version and usage errors need no MPI and never call MPI_Init. */
#ifndef MT_DATA_CLI_H
#define MT_DATA_CLI_H

#include <mpi.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The whole tool on comm (MPI initialised).  Returns the process exit
 * code: 0 ok, 1 error (every rank), 2 usage. */
int mt_data_main(MPI_Comm comm, int argc, char **argv, FILE *out, FILE *err);

/* The program: options parsed first; MPI is initialised only to make
 * datasets (on MPI_COMM_WORLD). */
int mt_data_tool_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
