/* app.c: the bootstrap shared by meshtrain-dense, -moe and -cp.
 *
 * The only file that touches MPI_COMM_WORLD (in mt_app_main).  It parses
 * the command line, has rank 0 load the config (and the model it names:
 * mt_config_load_model) and validate it, broadcasts
 * it, builds the mesh and prints what it resolved.  Failures are agreed on
 * with a collective, then every rank exits non-zero together. */
#include <config.h>

#include "mt_app.h"

#include "mt_comm.h"
#include "mt_hf.h"
#include "mt_train.h"
#ifdef MT_HAVE_CUDA
#include "mt_cuda.h"
#endif

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

mt_status_t mt_app_parse_args(int argc, char **argv, mt_app_args_t *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "--config") == 0 || strcmp(s, "-c") == 0) {
            if (i + 1 >= argc)
                MT_FAIL(MT_ERR_CONFIG, "%s needs a file name", s);
            a->config_path = argv[++i];
        } else if (strncmp(s, "--config=", 9) == 0) {
            a->config_path = s + 9;
        } else if (strcmp(s, "--dry-run") == 0) {
            a->dry_run = 1;
        } else if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            a->help = 1;
        } else if (strcmp(s, "--version") == 0) {
            a->version = 1;
        } else if (s[0] != '-' && strchr(s, '=')) {
            if (!a->config_path)
                MT_FAIL(MT_ERR_CONFIG, "override '%s' comes before --config FILE; overrides "
                        "apply to the file, so they come after it", s);
            if (a->noverrides >= MT_MAX_OVERRIDES)
                MT_FAIL(MT_ERR_CONFIG, "more than %d overrides", MT_MAX_OVERRIDES);
            a->overrides[a->noverrides++] = s;
        } else {
            MT_FAIL(MT_ERR_CONFIG, "unknown argument '%s' (expected --config FILE, --dry-run, "
                    "or section.key=value overrides)", s);
        }
    }
    if (!a->config_path && !a->help && !a->version)
        MT_FAIL(MT_ERR_CONFIG, "no config: pass --config FILE");
    return MT_OK;
}

mt_status_t mt_config_load_model(mt_config_t *cfg, const char *path, const char *const *overrides,
                                 int noverrides, FILE *warn)
{
    mt_config_init(cfg);
    MT_TRY(mt_config_load_file(cfg, path));
    for (int i = 0; i < noverrides; i++)
        MT_TRY(mt_config_override(cfg, overrides[i]));
    MT_TRY(mt_hf_apply_named_model(cfg, warn));
    return MT_OK;
}

void mt_config_resolve_device(mt_config_t *cfg, FILE *warn)
{
    if (cfg->distributed.device != MT_DEVICE_AUTO)
        return;
    int n = 0;
#ifdef MT_HAVE_CUDA
    n = mt_cuda_device_count();
#endif
    cfg->distributed.device = n > 0 ? MT_DEVICE_CUDA : MT_DEVICE_CPU;
    if (warn)
        fprintf(warn, "distributed.device: auto is %s (%s)\n", n > 0 ? "cuda" : "cpu",
#ifdef MT_HAVE_CUDA
                n > 0 ? "rank 0 sees a GPU" : "built with CUDA, but rank 0 sees no GPU"
#else
                "meshtrain is built without CUDA"
#endif
        );
}

/* Rank 0's part: file, overrides, the named model, validation. */
static mt_status_t load_local(mt_config_t *cfg, const mt_app_args_t *a, mt_app_kind_t app,
                              int world, const int *nodes, FILE *warn)
{
    MT_TRY(mt_config_load_model(cfg, a->config_path, a->overrides, a->noverrides, warn));
    mt_config_resolve_device(cfg, warn);
    MT_TRY(mt_config_validate(cfg, app, world, nodes, warn));
    return MT_OK;
}

mt_status_t mt_config_load_bcast(MPI_Comm comm, const mt_app_args_t *args, mt_app_kind_t app,
                                 mt_config_t *cfg, FILE *warn)
{
    int rank, size;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    int *nodes = malloc(sizeof *nodes * (size_t)size);
    mt_status_t s = nodes ? MT_OK : MT_ERR_NOMEM;
    MT_TRY(mt_agree(comm, s));
    s = mt_agree(comm, mt_node_map(comm, nodes, NULL));
    if (s == MT_OK && rank == 0)
        s = load_local(cfg, args, app, size, nodes, warn);
    free(nodes);

    int st = (int)s;
    MT_MPI_TRY(MPI_Bcast(&st, 1, MPI_INT, 0, comm));
    if (st != MT_OK) {
        /* Every rank carries rank 0's message, so any of them can report it. */
        static char msg[8192], hint[1024];
        if (rank == 0) {
            snprintf(msg, sizeof msg, "%s", mt_error_message());
            snprintf(hint, sizeof hint, "%s", mt_error_hint_text());
        }
        MT_MPI_TRY(MPI_Bcast(msg, sizeof msg, MPI_CHAR, 0, comm));
        MT_MPI_TRY(MPI_Bcast(hint, sizeof hint, MPI_CHAR, 0, comm));
        if (rank != 0) {
            mt_error_set((mt_status_t)st, __FILE__, __LINE__, "%s", msg);
            if (hint[0])
                mt_error_hint("%s", hint);
        }
        return (mt_status_t)st;
    }
    MT_MPI_TRY(MPI_Bcast(cfg, (int)sizeof *cfg, MPI_BYTE, 0, comm));
    return MT_OK;
}

void mt_report_error(FILE *err, const char *prog, int rank, mt_status_t s)
{
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    fprintf(err, "%s: error on rank %d (%s): %s:\n%s\n", prog, rank, host, mt_status_name(s),
            mt_error_message());
    if (mt_error_where()[0])
        fprintf(err, "  (detected at %s)\n", mt_error_where());
    if (mt_error_hint_text()[0])
        fprintf(err, "  hint: %s\n", mt_error_hint_text());
    fflush(err);
}

/* Rank 0 reports its failure; another rank reports its own only when rank
 * 0 did not fail, so an error every rank hits is printed once.  Collective. */
static void report_agreed(MPI_Comm comm, const char *prog, int rank, mt_status_t local)
{
    int root_failed = local != MT_OK;
    MPI_Bcast(&root_failed, 1, MPI_INT, 0, comm);
    if (local != MT_OK && (rank == 0 || !root_failed))
        mt_report_error(stderr, prog, rank, local);
}

static void usage(FILE *out, const char *prog)
{
    fprintf(out,
            "usage: %s --config FILE [--dry-run] [section.key=value ...]\n"
            "  --config FILE   YAML config (NeMo AutoModel field names; doc/config-reference.md)\n"
            "  --dry-run       validate the config on this allocation, build the mesh, print "
            "both, exit\n"
            "  section.key=value  override a key, e.g. distributed.tp_size=2\n"
            "Launch with srun or mpiexec; check a config without launching with meshtrain-plan.\n",
            prog);
}

int mt_app_main(mt_app_kind_t app, int argc, char **argv)
{
    const char *prog = mt_app_kind_name(app);
    int rank = 0, size = 1;
    MPI_Comm world;
    mt_app_args_t args;
    mt_config_t *cfg = NULL;
    mt_mesh_t mesh;
    int code = 1;

    MPI_Init(&argc, &argv);
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);

    /* Every rank parses the same argv, so all agree without communicating. */
    mt_status_t s = mt_app_parse_args(argc, argv, &args);
    if (s != MT_OK || args.help || args.version) {
        if (rank == 0) {
            if (s != MT_OK) {
                mt_report_error(stderr, prog, rank, s);
                usage(stderr, prog);
            } else if (args.version) {
                printf("%s (%s) %s\n", prog, PACKAGE_NAME, PACKAGE_VERSION);
            } else {
                usage(stdout, prog);
            }
        }
        code = s == MT_OK ? 0 : 2;
        goto out;
    }

    cfg = malloc(sizeof *cfg);
    s = mt_agree(world, cfg ? MT_OK : MT_ERR_NOMEM);
    if (s != MT_OK)
        goto fail;
    s = mt_config_load_bcast(world, &args, app, cfg, rank == 0 ? stderr : NULL);
    if (s != MT_OK) {
        if (rank == 0)
            mt_report_error(stderr, prog, rank, s);
        goto out;
    }
    if (rank == 0) {
        printf("%s %s: %d rank%s, config %s\n", prog, PACKAGE_VERSION, size, size == 1 ? "" : "s",
               args.config_path);
        printf("--- resolved config ---\n");
        mt_config_write_yaml(cfg, stdout);
        printf("---\n");
        fflush(stdout);
    }

    mt_status_t local = mt_mesh_init(&mesh, world, cfg);
    report_agreed(world, prog, rank, local);
    s = mt_agree(world, local);
    if (s != MT_OK)
        goto out;
    if (rank == 0) {
        printf("mesh: %d node%s, groups:\n", mesh.num_nodes, mesh.num_nodes == 1 ? "" : "s");
        mt_layout_write_groups(&mesh.layout, stdout, 8);
        fflush(stdout);
    }

    if (args.dry_run) {
        if (rank == 0)
            printf("%s: dry run: the config and the %d-rank mesh are valid\n", prog, size);
        code = 0;
    } else if (app == MT_APP_DENSE || app == MT_APP_CP ||
               app == MT_APP_MOE) { /* cp: packed rows, context parallelism */
        mt_train_result_t res;
        local = mt_train(world, cfg, &mesh, rank == 0 ? stdout : NULL, &res);
        report_agreed(world, prog, rank, local);
        s = mt_agree(world, local);
        code = s == MT_OK ? 0 : 1;
        if (s == MT_OK && rank == 0)
            printf("%s: done after step %lld%s\n", prog, (long long)res.last_step,
                   res.stopped_by_signal ? " (stopped by a signal; resume with checkpoint.resume: "
                                           "auto)" : "");
    } else {
        local = mt_error_set(MT_ERR_UNSUPPORTED, __FILE__, __LINE__,
                             "%s cannot train yet: this release validates its configs and "
                             "builds the mesh only", prog);
        mt_error_hint("run with --dry-run to check a config on an allocation");
        if (rank == 0)
            mt_report_error(stderr, prog, rank, local);
        code = 1;
    }
    mt_mesh_free(&mesh);
    goto out;

fail:
    if (rank == 0)
        mt_report_error(stderr, prog, rank, s);
out:
    free(cfg);
    MPI_Comm_free(&world);
    MPI_Finalize();
    return code;
}
