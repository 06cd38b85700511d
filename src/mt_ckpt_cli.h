/* mt_ckpt_cli.h: meshtrain-ckpt, the checkpoint inspection tool, as a
 * library entry point so tests can drive it in-process with their own
 * streams.  It reads checkpoints (doc/checkpoints.md) and never writes
 * them.  It needs no MPI launch and never calls MPI_Init: it opens model.h5
 * with HDF5's default (serial) driver, which a parallel HDF5 build serves
 * without MPI; the MPI-IO driver would not work there. */
#ifndef MT_CKPT_CLI_H
#define MT_CKPT_CLI_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* meshtrain-ckpt {list|verify|config|steps} [--json] PATH.  Returns the
 * process exit code: 0 ok, 1 error (a bad or missing checkpoint), 2 usage. */
int mt_ckpt_main(int argc, char **argv, FILE *out, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
