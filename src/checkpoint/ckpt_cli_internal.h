/* ckpt_cli_internal.h: meshtrain-ckpt's checkpoint side, for the tool's
 * dispatcher (app/ckpt_tool.c) and the hf layer's export: ckpt_cli.c
 * (the inspection commands, path resolution, output) and ckpt_inspect.c
 * (reading a model.h5 with serial HDF5, no MPI).  Not installed; the
 * tool's entry point is mt_ckpt_cli.h. */
#ifndef MT_CKPT_CLI_INTERNAL_H
#define MT_CKPT_CLI_INTERNAL_H

#include "checkpoint_internal.h"

#define MT_CKPT_INFO_MAX_RANK 32 /* HDF5's H5S_MAX_RANK */

/* One dataset of the file, described from the file itself. */
typedef struct {
    char *path;   /* "/model/model.norm.weight" */
    int ndim;     /* 0: scalar */
    int64_t dims[MT_CKPT_INFO_MAX_RANK];
    char dtype[16]; /* "float32", "int64", "string", ... */
    int64_t nelem;
    int64_t bytes;  /* nelem x element size: the logical size, not storage */
    int has_value;  /* an integer scalar (/train/step ...), read into value */
    int64_t value;
} mt_ckpt_dataset_info_t;

typedef struct {
    char fname[MT_CKPT_PATH_CAP]; /* step_dir/model.h5 */
    char *format, *mesh, *software; /* /meta attributes; NULL when absent */
    int64_t version, world_size;
    int has_world;
    mt_ckpt_dataset_info_t *ds; /* sorted by path, digits by value (layers.2 < layers.10) */
    int nds, cap;
} mt_ckpt_info_t;

/* Open step_dir/model.h5 serially, read-only.  /meta format must be
 * meshtrain-checkpoint; with `strict` the version must be this build's.
 * With `datasets`, describe every dataset.  Free with mt_ckpt_info_free
 * whatever it returns. */
mt_status_t mt_ckpt_info_read(const char *step_dir, mt_ckpt_info_t *in, int strict,
                              int datasets);
void mt_ckpt_info_free(mt_ckpt_info_t *in);

/* The manifest (mt_ckpt_verify), then the file's format and version.
 * *manifest_ok says whether the manifest passed: that alone is what
 * mt_ckpt_find_latest, and so resume: auto, checks. */
mt_status_t mt_ckpt_check_step(const char *step_dir, int *manifest_ok);

/* PATH (a step directory, its model.h5, or a checkpoint_dir) as a step
 * directory into step (MT_CKPT_PATH_CAP bytes); notes and errors go to
 * err.  Returns 0, or the exit code 1.  (ckpt_cli.c) */
int mt_ckpt_cli_resolve(const char *path, char *step, FILE *err);

/* The inspection commands (ckpt_cli.c), by their command-line names. */
enum {
    MT_CKPT_CLI_LIST,
    MT_CKPT_CLI_VERIFY,
    MT_CKPT_CLI_CONFIG,
    MT_CKPT_CLI_STEPS,
    MT_CKPT_CLI_NCOMMANDS
};
/* "list", "verify", "config" or "steps" as its MT_CKPT_CLI_*; -1 for
 * anything else (NULL included). */
int mt_ckpt_cli_command(const char *name);
/* Run inspection command c on PATH (steps: a checkpoint_dir), as the
 * tool does: returns the exit code (0 ok, 1 a bad or missing checkpoint
 * or an output error). */
int mt_ckpt_cli_run(int c, const char *path, int json, FILE *out, FILE *err);
/* Their lines of the usage text, from "usage:" on. */
void mt_ckpt_cli_usage(FILE *o);

#endif
