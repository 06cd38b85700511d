/* mt_app.h: what the thin mains in apps/ call.
 *
 * mt_app_main is the bootstrap: the only code that touches MPI_COMM_WORLD.
 * Everything below it takes a communicator.  Failures are agreed on by all
 * ranks through a collective before anyone exits, so no rank is left
 * waiting in a collective. */
#ifndef MT_APP_H
#define MT_APP_H

#include <mpi.h>
#include <stdio.h>

#include "mt_config.h"
#include "mt_comm.h" /* mt_agree */
#include "mt_mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_MAX_OVERRIDES 64

typedef struct {
    const char *config_path;
    const char *overrides[MT_MAX_OVERRIDES];
    int noverrides;
    int dry_run; /* validate, build the mesh, print, exit */
    int help, version;
} mt_app_args_t;

/* Parse `--config FILE [--dry-run] [section.key=value ...]`. */
mt_status_t mt_app_parse_args(int argc, char **argv, mt_app_args_t *args);

/* The config of every front end before validation: FILE, the overrides,
 * then the model it names (mt_hf_apply_named_model: config.json and
 * model.config under the explicit model.* keys, warnings to `warn`).  Not
 * collective: the apps run it on rank 0, meshtrain-plan in its process. */
/* distributed.device auto: cuda when rank 0 sees a GPU and the build has
 * CUDA, else cpu; one line to warn says which.  Before validation. */
void mt_config_resolve_device(mt_config_t *cfg, FILE *warn);
mt_status_t mt_config_load_model(mt_config_t *cfg, const char *path, const char *const *overrides,
                                 int noverrides, FILE *warn);

/* Load, override and validate on rank 0 of comm, then broadcast; collective.
 * On failure every rank returns the same status and holds rank 0's message
 * (see mt_error_message); only rank 0 should print it. */
mt_status_t mt_config_load_bcast(MPI_Comm comm, const mt_app_args_t *args, mt_app_kind_t app,
                                 mt_config_t *cfg, FILE *warn);

/* mt_agree (mt_comm.h): ranks agree on a status before anyone acts on it. */

/* Print an error the way every app does: program, rank, host, message,
 * origin and hint. */
void mt_report_error(FILE *err, const char *prog, int rank, mt_status_t s);

/* The whole app: MPI init, config, mesh, (training), finalize.  Returns the
 * process exit code. */
int mt_app_main(mt_app_kind_t app, int argc, char **argv);

/* meshtrain-plan, with its streams, so tests can drive it. */
int mt_plan_main(int argc, char **argv, FILE *out, FILE *err);

/* meshtrain-generate (generate_cli.c): on comm, which must be one rank
 * (several are refused); mt_generate_tool_main is the program, between
 * MPI_Init and MPI_Finalize.  Exit codes: 0 ok, 1 error, 2 usage. */
int mt_generate_main(MPI_Comm comm, int argc, char **argv, FILE *out, FILE *err);
int mt_generate_tool_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
