/* ckpt_cli.c: meshtrain-ckpt's inspection commands: list, verify, config
 * and steps over the checkpoints mt_ckpt_save writes (doc/checkpoints.md):
 * resolving PATH to a step directory, text and JSON output.  Takes its
 * output streams as arguments so tests can drive it in-process.  Reading
 * model.h5 is ckpt_inspect.c; parsing the command line, and sending export
 * and import to the hf layer, is the tool's dispatcher (app/ckpt_tool.c).
 *
 * It runs without an MPI launch and never calls MPI_Init: manifests are
 * checked by the library's plain POSIX mt_ckpt_verify and mt_ckpt_find_latest,
 * and HDF5 is used serially only.  It never writes a checkpoint. */
#include <config.h>

#include "ckpt_cli_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PROG "meshtrain-ckpt"
#define PATH_CAP MT_CKPT_PATH_CAP

void mt_ckpt_cli_usage(FILE *o)
{
    fprintf(o,
            "usage: " PROG " list [--json] PATH     header, every dataset, totals\n"
            "       " PROG " verify PATH            SHA-256 manifest, /meta format and version\n"
            "       " PROG " config PATH            the stored resolved config (YAML)\n"
            "       " PROG " steps [--json] DIR     every step_* directory and its status\n");
}

/* ------------------------------------------------------------ directories */

/* The name `latest` in dir holds, if it is a plain name; 0 if none. */
static int read_latest(const char *dir, char *name, size_t cap)
{
    char path[PATH_CAP];
    if (mt_ckpt_join(path, dir, "latest") != MT_OK)
        return 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int ok = fgets(name, (int)cap, f) != NULL;
    fclose(f);
    if (!ok)
        return 0;
    name[strcspn(name, "\r\n")] = '\0';
    return name[0] && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int report(FILE *err, const char *what)
{
    fprintf(err, PROG ": %s%s\n", what, mt_error_message());
    if (mt_error_hint_text()[0])
        fprintf(err, PROG ": hint: %s\n", mt_error_hint_text());
    return 1;
}

/* PATH as a step directory (step holds PATH_CAP): a directory with
 * model.h5 or a manifest, model.h5 itself, or a checkpoint_dir (then the
 * step `latest` names, or the newest whose manifest verifies). */
int mt_ckpt_cli_resolve(const char *path, char *step, FILE *err)
{
    char probe[PATH_CAP], name[256];
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(err, PROG ": %s: %s\n", path, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        const char *base = strrchr(path, '/');
        if (strcmp(base ? base + 1 : path, MT_CKPT_FILE) != 0) {
            fprintf(err, PROG ": %s: not a directory; give a step directory, its "
                    MT_CKPT_FILE ", or a checkpoint_dir\n", path);
            return 1;
        }
        if (!base)
            snprintf(step, PATH_CAP, ".");
        else /* the directory part; "/" for "/model.h5" */
            snprintf(step, PATH_CAP, "%.*s", base == path ? 1 : (int)(base - path), path);
        return 0;
    }
    int looks_like_step = (mt_ckpt_join(probe, path, MT_CKPT_FILE) == MT_OK &&
                           stat(probe, &st) == 0) ||
                          (mt_ckpt_join(probe, path, MT_CKPT_MANIFEST) == MT_OK &&
                           stat(probe, &st) == 0);
    if (looks_like_step) {
        snprintf(step, PATH_CAP, "%s", path);
        return 0;
    }
    if (read_latest(path, name, sizeof name)) {
        if (mt_ckpt_join(step, path, name) == MT_OK && is_dir(step)) {
            fprintf(err, PROG ": using %s (named by %s/latest)\n", step, path);
            return 0;
        }
        fprintf(err, PROG ": warning: %s/latest names %s, which does not exist\n", path, name);
    }
    int found;
    if (mt_ckpt_find_latest(path, step, PATH_CAP, &found, err) != MT_OK)
        return report(err, "");
    if (!found) {
        fprintf(err, PROG ": %s: not a step directory (no " MT_CKPT_FILE ") and no complete "
                "checkpoint under it\n", path);
        return 1;
    }
    fprintf(err, PROG ": using %s (the newest complete checkpoint in %s)\n", step, path);
    return 0;
}

/* ------------------------------------------------------------ output */

static void json_str(FILE *o, const char *s)
{
    if (!s) {
        fputs("null", o);
        return;
    }
    fputc('"', o);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(o, "\\%c", c);
        else if (c < 0x20)
            fprintf(o, "\\u%04x", c);
        else
            fputc(c, o);
    }
    fputc('"', o);
}

static void shape_text(char *buf, size_t cap, const mt_ckpt_dataset_info_t *x, int json)
{
    if (x->ndim == 0 && !json) {
        snprintf(buf, cap, "scalar");
        return;
    }
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < x->ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", d ? ", " : "",
                                 (long long)x->dims[d]);
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
}

static const mt_ckpt_dataset_info_t *find_ds(const mt_ckpt_info_t *in, const char *path)
{
    for (int i = 0; i < in->nds; i++)
        if (strcmp(in->ds[i].path, path) == 0)
            return &in->ds[i];
    return NULL;
}

static const char *const train_fields[] = {"step", "consumed_samples", "data_epoch"};

static int cmd_list(const char *step, int json, FILE *out, FILE *err)
{
    mt_ckpt_info_t in;
    if (mt_ckpt_info_read(step, &in, 0, 1) != MT_OK) {
        mt_ckpt_info_free(&in);
        return report(err, "");
    }
    if (in.version != MT_CKPT_VERSION)
        fprintf(err, PROG ": warning: %s: format version %lld; this build reads version %d, so "
                "the layout may differ\n", in.fname, (long long)in.version, MT_CKPT_VERSION);
    struct stat st;
    int64_t params = 0, optim = 0, tensor_bytes = 0;
    int64_t file_bytes = stat(in.fname, &st) == 0 ? (int64_t)st.st_size : -1;
    for (int i = 0; i < in.nds; i++) {
        const mt_ckpt_dataset_info_t *x = &in.ds[i];
        tensor_bytes += x->bytes;
        if (strncmp(x->path, "/model/", 7) == 0)
            params += x->nelem;
        else if (strncmp(x->path, "/optim/", 7) == 0 && strcmp(x->path, "/optim/step") != 0)
            optim += x->nelem;
    }
    const mt_ckpt_dataset_info_t *tr[3];
    char buf[64], shape[256];
    for (int k = 0; k < 3; k++) {
        snprintf(buf, sizeof buf, "/train/%s", train_fields[k]);
        tr[k] = find_ds(&in, buf);
        tr[k] = tr[k] && tr[k]->has_value ? tr[k] : NULL;
    }
    if (json) {
        fputs("{\"step_dir\": ", out);
        json_str(out, step);
        fputs(", \"format\": ", out);
        json_str(out, in.format);
        fprintf(out, ", \"version\": %lld", (long long)in.version);
        for (int k = 0; k < 3; k++)
            tr[k] ? fprintf(out, ", \"%s\": %lld", train_fields[k], (long long)tr[k]->value)
                  : fprintf(out, ", \"%s\": null", train_fields[k]);
        fputs(", \"mesh\": ", out);
        json_str(out, in.mesh);
        in.has_world ? fprintf(out, ", \"world_size\": %lld", (long long)in.world_size)
                     : fputs(", \"world_size\": null", out);
        fputs(", \"software\": ", out);
        json_str(out, in.software);
        fputs(",\n \"datasets\": [", out);
        for (int i = 0; i < in.nds; i++) {
            const mt_ckpt_dataset_info_t *x = &in.ds[i];
            fputs(i ? ",\n  {\"path\": " : "\n  {\"path\": ", out);
            json_str(out, x->path);
            shape_text(shape, sizeof shape, x, 1);
            fprintf(out, ", \"shape\": %s, \"dtype\": \"%s\", \"elements\": %lld, \"bytes\": %lld",
                    shape, x->dtype, (long long)x->nelem, (long long)x->bytes);
            if (x->has_value)
                fprintf(out, ", \"value\": %lld", (long long)x->value);
            fputc('}', out);
        }
        fprintf(out, "],\n \"totals\": {\"datasets\": %d, \"model_parameters\": %lld, "
                "\"optimizer_state\": %lld, \"tensor_bytes\": %lld, \"file_bytes\": %lld}}\n",
                in.nds, (long long)params, (long long)optim, (long long)tensor_bytes,
                (long long)file_bytes);
        mt_ckpt_info_free(&in);
        return 0;
    }
    static const char *const labels[] = {"step", "consumed samples", "data epoch"};
    fprintf(out, "%-18s%s\n%-18s%s, version %lld\n", "step dir", step, "format", in.format,
            (long long)in.version);
    for (int k = 0; k < 3; k++)
        tr[k] ? fprintf(out, "%-18s%lld\n", labels[k], (long long)tr[k]->value)
              : fprintf(out, "%-18s(absent)\n", labels[k]);
    fprintf(out, "%-18s%s\n", "mesh", in.mesh ? in.mesh : "(absent)");
    in.has_world ? fprintf(out, "%-18s%lld\n", "world size", (long long)in.world_size)
                 : fprintf(out, "%-18s(absent)\n", "world size");
    fprintf(out, "%-18s%s\n\n", "software", in.software ? in.software : "(absent)");
    int pw = 7, sw = 5;
    for (int i = 0; i < in.nds; i++) {
        shape_text(shape, sizeof shape, &in.ds[i], 0);
        pw = (int)strlen(in.ds[i].path) > pw ? (int)strlen(in.ds[i].path) : pw;
        sw = (int)strlen(shape) > sw ? (int)strlen(shape) : sw;
    }
    fprintf(out, "%-*s  %-*s  %-8s %12s\n", pw, "dataset", sw, "shape", "dtype", "bytes");
    for (int i = 0; i < in.nds; i++) {
        shape_text(shape, sizeof shape, &in.ds[i], 0);
        fprintf(out, "%-*s  %-*s  %-8s %12lld\n", pw, in.ds[i].path, sw, shape, in.ds[i].dtype,
                (long long)in.ds[i].bytes);
    }
    fprintf(out, "\n%-18s%d\n%-18s%lld (%.2fM)\n%-18s%lld (%.2fM)\n%-18s%lld (%.2f MiB)\n"
            "%-18s%lld (%.2f MiB)\n", "datasets", in.nds,
            "model parameters", (long long)params, params / 1e6,
            "optimizer state", (long long)optim, optim / 1e6,
            "tensor bytes", (long long)tensor_bytes, tensor_bytes / 1048576.0,
            "file bytes", (long long)file_bytes, file_bytes / 1048576.0);
    mt_ckpt_info_free(&in);
    return 0;
}

typedef struct {
    int64_t step;
    int tmp, manifest_ok, complete;
    char name[256];
    char *reason; /* corrupt: why */
} entry_t;

static int by_step(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    return x->step != y->step ? (x->step > y->step) - (x->step < y->step) : strcmp(x->name, y->name);
}

/* The names mt_ckpt_save makes: "step_<digits>", or ending ".tmp" while
 * unfinished.  Anything else in the directory is not ours. */
static int parse_step_name(const char *name, int64_t *step, int *tmp)
{
    if (strncmp(name, MT_CKPT_STEP_PREFIX, strlen(MT_CKPT_STEP_PREFIX)) != 0)
        return 0;
    const char *p = name + strlen(MT_CKPT_STEP_PREFIX);
    size_t digits = strspn(p, "0123456789"), rest;
    if (digits == 0 || digits > 18)
        return 0;
    *step = strtoll(p, NULL, 10);
    p += digits;
    rest = strlen(p);
    *tmp = rest > 0;
    return rest == 0 || (*p == '.' && rest >= 4 && strcmp(p + rest - 4, ".tmp") == 0);
}

static int cmd_steps(const char *dir, int json, FILE *out, FILE *err)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(err, PROG ": %s: cannot list: %s\n", dir, strerror(errno));
        return 1;
    }
    entry_t *v = NULL;
    int n = 0, cap = 0, code = 0;
    char latest[256], path[PATH_CAP];
    int has_latest = read_latest(dir, latest, sizeof latest), latest_seen = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        entry_t x = {0};
        if (!parse_step_name(e->d_name, &x.step, &x.tmp) || strlen(e->d_name) >= sizeof x.name ||
            mt_ckpt_join(path, dir, e->d_name) != MT_OK || !is_dir(path))
            continue;
        snprintf(x.name, sizeof x.name, "%s", e->d_name);
        if (n == cap) {
            entry_t *w = realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 16));
            if (!w) {
                fprintf(err, PROG ": out of memory listing %s\n", dir);
                code = 1;
                break;
            }
            v = w;
        }
        v[n++] = x;
    }
    closedir(d);
    if (n)
        qsort(v, (size_t)n, sizeof *v, by_step);
    const char *resume = NULL;
    for (int i = 0; i < n && !code; i++) {
        if (v[i].tmp || mt_ckpt_join(path, dir, v[i].name) != MT_OK)
            continue;
        v[i].complete = mt_ckpt_check_step(path, &v[i].manifest_ok) == MT_OK;
        if (!v[i].complete && !(v[i].reason = strdup(mt_error_message())))
            code = 1;
        if (v[i].manifest_ok)
            resume = v[i].name; /* sorted, so the last one wins */
        latest_seen |= has_latest && strcmp(v[i].name, latest) == 0;
    }
    static const char *const partial = "an unfinished or interrupted save (.tmp); never loaded";
    if (!code && json) {
        fputs("{\"checkpoint_dir\": ", out);
        json_str(out, dir);
        fputs(", \"latest\": ", out);
        json_str(out, has_latest ? latest : NULL);
        fputs(", \"resume\": ", out);
        json_str(out, resume);
        fputs(", \"steps\": [", out);
        for (int i = 0; i < n; i++) {
            fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", out);
            json_str(out, v[i].name);
            fprintf(out, ", \"step\": %lld, \"status\": \"%s\", \"reason\": ", (long long)v[i].step,
                    v[i].tmp ? "partial" : v[i].complete ? "complete" : "corrupt");
            json_str(out, v[i].tmp ? partial : v[i].reason);
            fprintf(out, ", \"latest\": %s}",
                    has_latest && strcmp(v[i].name, latest) == 0 ? "true" : "false");
        }
        fputs("]}\n", out);
    } else if (!code) {
        int w = 4;
        for (int i = 0; i < n; i++)
            w = (int)strlen(v[i].name) > w ? (int)strlen(v[i].name) : w;
        fprintf(out, "%-16s%s\n%-16s%s%s\n%-16s%s%s\n\n", "checkpoint_dir", dir, "latest",
                has_latest ? latest : "(none)",
                !has_latest ? "" : latest_seen ? " (marked *)" : " (missing!)", "auto-resume",
                resume ? resume : "(nothing: a fresh start)",
                resume ? " (the newest whose manifest verifies)" : "");
        if (!n)
            fprintf(out, "no step_* directories\n");
        for (int i = 0; i < n; i++)
            fprintf(out, "%c %-*s  %s%s%s\n",
                    has_latest && strcmp(v[i].name, latest) == 0 ? '*' : ' ', w, v[i].name,
                    v[i].tmp ? "partial: " : v[i].complete ? "complete" : "corrupt: ",
                    v[i].tmp ? partial : "", v[i].reason ? v[i].reason : "");
    }
    for (int i = 0; i < n; i++)
        free(v[i].reason);
    free(v);
    return code;
}

/* ------------------------------------------------------------ commands */

static const char *const command_names[] = {"list", "verify", "config", "steps"};

int mt_ckpt_cli_command(const char *name)
{
    for (int k = 0; name && k < MT_CKPT_CLI_NCOMMANDS; k++)
        if (strcmp(name, command_names[k]) == 0)
            return k;
    return -1;
}

int mt_ckpt_cli_run(int c, const char *path, int json, FILE *out, FILE *err)
{
    char step[PATH_CAP];
    int code = c == MT_CKPT_CLI_STEPS ? cmd_steps(path, json, out, err) : mt_ckpt_cli_resolve(path, step, err);
    if (c == MT_CKPT_CLI_LIST && code == 0) {
        code = cmd_list(step, json, out, err);
    } else if (c == MT_CKPT_CLI_VERIFY && code == 0) {
        int manifest_ok;
        if (mt_ckpt_check_step(step, &manifest_ok) != MT_OK)
            code = report(err, "verify failed: ");
        else
            fprintf(out, "%s: OK (" MT_CKPT_MANIFEST " matches; " MT_CKPT_FORMAT " version %d)\n",
                    step, MT_CKPT_VERSION);
    } else if (c == MT_CKPT_CLI_CONFIG && code == 0) {
        char *yaml;
        if (mt_ckpt_read_config(step, &yaml) != MT_OK) {
            code = report(err, "");
        } else {
            size_t len = strlen(yaml);
            fputs(yaml, out);
            if (len && yaml[len - 1] != '\n')
                fputc('\n', out);
            free(yaml);
        }
    }
    if (fflush(out) != 0 || ferror(out)) {
        fprintf(err, PROG ": cannot write the output: %s\n", strerror(errno));
        return 1;
    }
    return code;
}
