/* ckpt_tool.c: meshtrain-ckpt's dispatcher.  It parses the inspection
 * commands' command line (list, verify, config, steps: checkpoint layer,
 * no MPI) and hands export and import to the hf layer, starting MPI for
 * those two only, so that inspecting a checkpoint needs no MPI launch.
 * The usage text is both layers' lines together. */
#include <config.h>

#include "ckpt_cli_internal.h"
#include "mt_ckpt_cli.h"

#include <errno.h>
#include <string.h>

#define PROG "meshtrain-ckpt"

static void usage(FILE *o)
{
    mt_ckpt_cli_usage(o);
    mt_ckpt_hf_usage(o);
    fprintf(o,
            "PATH is a step directory, its model.h5, or a checkpoint_dir (then the step\n"
            "directory `latest` names, or else the newest complete one). list, verify, config\n"
            "and steps run without MPI; export and import start it. Exit status: 0 ok, 1 bad\n"
            "or missing checkpoint or model, 2 usage.\n");
}

static int usage_error(int c, const char *cmd, const char *path, FILE *err)
{
    if (!cmd)
        fprintf(err, PROG ": a command is required\n");
    else if (c < 0 && (strcmp(cmd, "export") == 0 || strcmp(cmd, "import") == 0))
        fprintf(err, PROG ": %s is collective: run the meshtrain-ckpt program, or call "
                "mt_ckpt_hf_main with a communicator\n", cmd);
    else if (c < 0)
        fprintf(err, PROG ": unknown command '%s'\n", cmd);
    else if (!path)
        fprintf(err, PROG ": %s needs a %s\n", cmd, c == MT_CKPT_CLI_STEPS ? "DIR" : "PATH");
    usage(err);
    return 2;
}

int mt_ckpt_main(int argc, char **argv, FILE *out, FILE *err)
{
    const char *cmd = NULL, *path = NULL;
    int json = 0, options = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            usage(out);
            return 0;
        } else if (options && strcmp(a, "--version") == 0) {
            fprintf(out, PROG " (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
            return 0;
        } else if (options && strcmp(a, "--json") == 0) {
            json = 1;
        } else if (options && strcmp(a, "--") == 0) {
            options = 0;
        } else if (options && a[0] == '-' && a[1]) {
            fprintf(err, PROG ": unknown option '%s'\n", a);
            usage(err);
            return 2;
        } else if (!cmd) {
            cmd = a;
        } else if (!path) {
            path = a;
        } else {
            fprintf(err, PROG ": unexpected argument '%s': one PATH per call\n", a);
            usage(err);
            return 2;
        }
    }
    int c = mt_ckpt_cli_command(cmd);
    if (c < 0 || !path)
        return usage_error(c, cmd, path, err);
    if (json && (c == MT_CKPT_CLI_VERIFY || c == MT_CKPT_CLI_CONFIG)) {
        fprintf(err, PROG ": --json applies to list and steps, not %s\n", cmd);
        return 2;
    }
    return mt_ckpt_cli_run(c, path, json, out, err);
}

/* The first argument that is not an option: the command. */
static const char *command_of(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (argv[i][0] != '-')
            return argv[i];
    return NULL;
}

int mt_ckpt_tool_main(int argc, char **argv)
{
    const char *cmd = command_of(argc, argv);
    if (!cmd || (strcmp(cmd, "export") != 0 && strcmp(cmd, "import") != 0))
        return mt_ckpt_main(argc, argv, stdout, stderr);
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, PROG ": %s: MPI_Init failed\n", cmd);
        return 1;
    }
    int rc = mt_ckpt_hf_main(MPI_COMM_WORLD, argc, argv, stdout, stderr);
    MPI_Finalize();
    return rc;
}
