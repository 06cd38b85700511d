/* plan_cli.c: meshtrain-plan's command line.  Runs without an MPI launch:
 * it validates a config for a world size the user names, with the same
 * mt_config_validate the apps run, and prints the plan.  Takes its output
 * streams as arguments so tests can drive it in-process. */
#include <config.h>

#include "mt_app.h"
#include "mt_plan.h"
#include "train_device.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void plan_usage(FILE *out)
{
    fprintf(out,
            "usage: meshtrain-plan --config FILE --world-size N [--ranks-per-node G] [--json]\n"
            "                      [--app auto|dense|moe|cp] [--all-groups] [--print-config]\n"
            "                      [--gpu-memory GIB] [section.key=value ...]\n"
            "       meshtrain-plan --config-reference\n"
            "Validates FILE for N ranks (G per node, default all on one node) exactly as the\n"
            "apps do, then prints the resolved sizes, every axis's groups, a per-rank memory\n"
            "estimate and the pipeline bubble. --gpu-memory: whether a rank fits a GPU of GIB\n"
            "GiB (distributed.device cuda). Exit status: 0 valid (and fits), 1 invalid config,\n"
            "2 usage, 3 valid but does not fit the --gpu-memory GPU.\n");
}

static int parse_count(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 1)
        return 0;
    *out = v;
    return 1;
}

int mt_plan_main(int argc, char **argv, FILE *out, FILE *err)
{
    const char *config = NULL, *app_name = "auto";
    const char *overrides[MT_MAX_OVERRIDES];
    int nover = 0, json = 0, all_groups = 0, print_config = 0;
    long long world = 0, per_node = 0;
    double gpu_gib = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            plan_usage(out);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            fprintf(out, "meshtrain-plan (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
            return 0;
        } else if (strcmp(a, "--config-reference") == 0) {
            mt_config_write_reference(out);
            return 0;
        } else if (strcmp(a, "--config") == 0 && next) {
            config = argv[++i];
        } else if (strcmp(a, "--world-size") == 0 && next) {
            if (!parse_count(argv[++i], &world)) {
                fprintf(err, "meshtrain-plan: --world-size needs a positive integer, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--ranks-per-node") == 0 && next) {
            if (!parse_count(argv[++i], &per_node)) {
                fprintf(err, "meshtrain-plan: --ranks-per-node needs a positive integer, got '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--gpu-memory") == 0 && next) {
            char *end;
            gpu_gib = strtod(argv[++i], &end);
            if (end == argv[i] || *end || !(gpu_gib > 0)) {
                fprintf(err, "meshtrain-plan: --gpu-memory needs a size in GiB, got '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--app") == 0 && next) {
            app_name = argv[++i];
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--all-groups") == 0) {
            all_groups = 1;
        } else if (strcmp(a, "--print-config") == 0) {
            print_config = 1;
        } else if (a[0] != '-' && strchr(a, '=') && config) {
            if (nover >= MT_MAX_OVERRIDES) {
                fprintf(err, "meshtrain-plan: more than %d overrides\n", MT_MAX_OVERRIDES);
                return 2;
            }
            overrides[nover++] = a;
        } else {
            fprintf(err, "meshtrain-plan: unexpected argument '%s'%s\n", a,
                    strchr(a, '=') ? " (overrides come after --config FILE)" : "");
            plan_usage(err);
            return 2;
        }
    }
    if (!config || world == 0) {
        fprintf(err, "meshtrain-plan: --config FILE and --world-size N are required\n");
        plan_usage(err);
        return 2;
    }
    if (per_node == 0)
        per_node = world;

    mt_config_t *cfg = malloc(sizeof *cfg);
    int *nodes = malloc(sizeof *nodes * (size_t)world);
    int code = 1;
    if (!cfg || !nodes) {
        fprintf(err, "meshtrain-plan: out of memory for a world of %lld\n", world);
        goto done;
    }
    for (long long r = 0; r < world; r++)
        nodes[r] = (int)(r / per_node);

    /* a model by name: its config.json sizes the plan (no weights are read) */
    mt_status_t s = mt_config_load_model(cfg, config, overrides, nover, err);
    mt_app_kind_t app = MT_APP_ANY;
    if (s == MT_OK && cfg->distributed.device == MT_DEVICE_AUTO && gpu_gib > 0) {
        cfg->distributed.device = MT_DEVICE_CUDA; /* --gpu-memory plans for a GPU */
        fprintf(err, "distributed.device: auto is cuda (--gpu-memory)\n");
    }
    if (s == MT_OK)
        mt_config_resolve_device(cfg, err);
    if (s == MT_OK) {
        if (strcmp(app_name, "dense") == 0)
            app = MT_APP_DENSE;
        else if (strcmp(app_name, "moe") == 0)
            app = MT_APP_MOE;
        else if (strcmp(app_name, "cp") == 0)
            app = MT_APP_CP;
        else if (strcmp(app_name, "auto") == 0)
            app = cfg->model.num_experts > 0 ? MT_APP_MOE
                  : (cfg->packed_sequence.packed_sequence_size > 0 || cfg->distributed.cp_size > 1)
                      ? MT_APP_CP
                      : MT_APP_DENSE;
        else {
            fprintf(err, "meshtrain-plan: --app must be auto, dense, moe or cp, got '%s'\n", app_name);
            code = 2;
            goto done;
        }
        s = mt_config_validate(cfg, app, world, nodes, err);
    }
    if (s != MT_OK) {
        fprintf(err, "meshtrain-plan: %s is not valid for %lld ranks (%lld per node):\n%s\n", config,
                world, per_node, mt_error_message());
        goto done;
    }
    mt_plan_t plan;
    /* bf16 storage as the trainer decides it (train_device.c) */
    unsigned flags = mt_train_bf16_storage_on(cfg) ? MT_PLAN_BF16_STORAGE : 0;
    if (mt_plan_compute_ex(cfg, flags, &plan) != MT_OK) {
        fprintf(err, "meshtrain-plan: %s\n", mt_error_message());
        goto done;
    }
    if (json) {
        mt_plan_write_json(cfg, &plan, out);
    } else {
        fprintf(out, "meshtrain-plan: %s is valid for %s on %lld ranks\n\n", config,
                mt_app_kind_name(app), world);
        if (print_config) {
            mt_config_write_yaml(cfg, out);
            fputc('\n', out);
        }
        mt_plan_write_text(cfg, &plan, out, all_groups ? 0 : 8);
    }
    code = 0;
    if (gpu_gib > 0) { /* the verdict goes to err: --json keeps out one object */
        double need = mt_plan_gpu_bytes_needed(&plan) / (1024.0 * 1024.0 * 1024.0);
        if (cfg->distributed.device != MT_DEVICE_CUDA) {
            fprintf(err, "meshtrain-plan: --gpu-memory needs distributed.device: cuda\n");
            code = 2;
        } else if (need > gpu_gib) {
            fprintf(err, "meshtrain-plan: does not fit: a rank needs a GPU of %.2f GiB, this one "
                         "has %.2f GiB (pp rank %d; lower the micro-batch, turn on "
                         "distributed.activation_checkpointing, or shard more: tp, pp, "
                         "fsdp2)\n", need, gpu_gib, plan.worst_pp_rank);
            code = 3;
        } else {
            fprintf(err, "meshtrain-plan: fits: a rank needs a GPU of %.2f GiB of the %.2f GiB\n",
                    need, gpu_gib);
        }
    }
done:
    free(nodes);
    free(cfg);
    return code;
}
