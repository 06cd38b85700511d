/* hf_resolve.c: a Hugging Face model named in the config, found on local
 * disk, and the model section it describes.
 *
 * A name is a directory (config.json, and safetensors when weights are
 * read), or a hub id ("org/name") looked up in one local hub cache, as
 * huggingface_hub does with HF_HUB_OFFLINE=1: HF_HUB_CACHE, else
 * HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub.  There, models--org--name/refs/REVISION holds
 * the commit whose snapshots/COMMIT/ has the files; a revision that is a
 * commit names its snapshot directly.
 *
 * The model section comes from config.json (model.pretrained_model_name_or_path),
 * then the YAML's model.config block (AutoModel's from_config: inline
 * fields on top of the config.json it names, if any), then the model.*
 * keys the user set, each that changes a value with a warning.  Nothing
 * here downloads, and nothing here talks to other ranks: the apps do it on
 * rank 0 before validating and broadcasting. */
#include "hf_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config_internal.h"

#define MAX_JSON_BYTES (64u << 20)

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* "org/name" or "name": the hub's repository id characters, one slash at
 * most, no "..", no leading or trailing separator. */
static int hub_id(const char *s)
{
    int slashes = 0;
    size_t n = strlen(s);
    if (n == 0 || n > 200 || strstr(s, "..") || strstr(s, "--") || s[0] == '/' || s[0] == '.' ||
        s[0] == '-' || s[n - 1] == '/' || s[n - 1] == '.')
        return 0;
    for (const char *p = s; *p; p++) {
        if (*p == '/')
            slashes++;
        else if (!isalnum((unsigned char)*p) && !strchr("-_.", *p))
            return 0;
    }
    return slashes <= 1;
}

static int commit_hash(const char *s)
{
    size_t n = strlen(s);
    if (n != 40)
        return 0;
    for (const char *p = s; *p; p++)
        if (!isxdigit((unsigned char)*p))
            return 0;
    return 1;
}

/* The one hub cache huggingface_hub would use, and which setting chose it. */
static void hub_cache(char *out, size_t cap, const char **why)
{
    const char *e;
    if ((e = getenv("HF_HUB_CACHE")) && e[0]) {
        snprintf(out, cap, "%s", e), *why = "HF_HUB_CACHE";
    } else if ((e = getenv("HF_HOME")) && e[0]) {
        snprintf(out, cap, "%s/hub", e), *why = "HF_HOME";
    } else if ((e = getenv("XDG_CACHE_HOME")) && e[0]) {
        snprintf(out, cap, "%s/huggingface/hub", e), *why = "XDG_CACHE_HOME";
    } else {
        e = getenv("HOME");
        snprintf(out, cap, "%s/.cache/huggingface/hub", e && e[0] ? e : "."), *why = "HOME";
    }
}

/* Append "; what" to the list of places looked. */
static void looked(char *list, size_t cap, const char *fmt, const char *a, const char *b)
{
    size_t n = strlen(list);
    if (n + 4 >= cap)
        return;
    if (n)
        n += (size_t)snprintf(list + n, cap - n, "; ");
    snprintf(list + n, cap - n, fmt, a, b);
}

/* models--org--name/refs/REVISION -> snapshots/COMMIT (or the commit's own
 * snapshot); 0 and what was tried in `tried` when absent. */
static int in_cache(const char *cache, const char *id, const char *rev, char *dir, size_t cap,
                    char *tried, size_t tcap)
{
    char repo[MT_PATH_MAX + 256], path[2 * MT_PATH_MAX + 512], commit[128] = "";
    int k = snprintf(repo, sizeof repo, "%s/models--", cache);
    for (const char *p = id; *p && (size_t)k + 3 < sizeof repo; p++) {
        if (*p == '/')
            repo[k++] = '-', repo[k++] = '-';
        else
            repo[k++] = *p;
    }
    repo[k] = '\0';
    if (!is_dir(repo)) {
        looked(tried, tcap, "%s (no such directory)%s", repo, "");
        return 0;
    }
    snprintf(path, sizeof path, "%s/refs/%s", repo, rev);
    FILE *f = strstr(rev, "..") ? NULL : fopen(path, "r");
    if (f) {
        size_t n = fread(commit, 1, sizeof commit - 1, f);
        fclose(f);
        commit[n] = '\0';
        while (n && isspace((unsigned char)commit[n - 1]))
            commit[--n] = '\0';
        if (!commit[0] || strchr(commit, '/') || strstr(commit, "..")) {
            looked(tried, tcap, "%s (does not hold a commit)%s", path, "");
            return 0;
        }
    } else if (commit_hash(rev)) {
        snprintf(commit, sizeof commit, "%s", rev);
    } else {
        looked(tried, tcap, "%s (no such revision)%s", path, "");
        return 0;
    }
    snprintf(path, sizeof path, "%s/snapshots/%s", repo, commit);
    if (!is_dir(path)) {
        looked(tried, tcap, "%s (no such snapshot%s)", path, f ? ", though refs names it" : "");
        return 0;
    }
    if (strlen(path) >= cap) {
        looked(tried, tcap, "%s (path too long)%s", path, "");
        return 0;
    }
    snprintf(dir, cap, "%s", path);
    return 1;
}

mt_status_t mt_hf_resolve_name(const char *name, const char *revision, const char *key,
                               char *dir, size_t cap)
{
    char tried[4096] = "", cfgjson[MT_PATH_MAX + 32];
    const char *rev = revision && revision[0] ? revision : "main";
    if (!name || !name[0])
        MT_FAIL(MT_ERR_CONFIG, "%s is empty: give a directory or a hub id org/name", key);
    int found = 0;
    if (is_dir(name)) { /* a local directory wins, as in transformers */
        if (strlen(name) >= cap)
            MT_FAIL(MT_ERR_RANGE, "%s: the path is too long", key);
        snprintf(dir, cap, "%s", name);
        found = 1;
    } else {
        looked(tried, sizeof tried, "%s (no such directory)%s", name, "");
    }
    const char *why = "";
    if (!found && hub_id(name)) {
        char cache[MT_PATH_MAX + 64];
        hub_cache(cache, sizeof cache, &why);
        found = in_cache(cache, name, rev, dir, cap, tried, sizeof tried);
    }
    if (!found) {
        mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s '%s'%s%s: not found on local disk; "
                     "looked in: %s", key, name, revision && revision[0] ? " at revision " : "",
                     revision && revision[0] ? revision : "", tried);
        mt_error_hint("meshtrain never downloads: fetch the model once where there is a network "
                      "(huggingface-cli download %s%s%s), with HF_HUB_CACHE or HF_HOME pointing "
                      "at the cache the job sees, or give a local directory%s%s%s",
                      name, revision && revision[0] ? " --revision " : "",
                      revision && revision[0] ? revision : "",
                      why[0] ? " (the cache was chosen by " : "", why,
                      why[0] ? ")" : "");
        return MT_ERR_CONFIG;
    }
    snprintf(cfgjson, sizeof cfgjson, "%s/config.json", dir);
    if (!is_file(cfgjson))
        MT_FAIL(MT_ERR_CONFIG, "%s '%s': %s has no config.json: a Hugging Face model directory "
                "holds config.json and its *.safetensors", key, name, dir);
    return MT_OK;
}

mt_status_t mt_hf_resolve(const mt_model_config_t *m, char *dir, size_t cap)
{
    return mt_hf_resolve_name(m->pretrained_model_name_or_path, m->revision,
                              "model.pretrained_model_name_or_path", dir, cap);
}

/* ------------------------------------------------------------ the model section */

/* AutoModel's config classes (`_target_: transformers.LlamaConfig`) name
 * the model_type an inline block may leave out. */
static const char *model_type_of_target(const char *t)
{
    static const struct { const char *cls, *type; } map[] = {
        {"LlamaConfig", "llama"}, {"Qwen2Config", "qwen2"}, {"Qwen3Config", "qwen3"},
        {"Qwen3MoeConfig", "qwen3_moe"}, {"MistralConfig", "mistral"},
        {"MixtralConfig", "mixtral"}, {"OlmoeConfig", "olmoe"}};
    const char *dot = strrchr(t, '.');
    const char *cls = dot ? dot + 1 : t;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(cls, map[i].cls) == 0)
            return map[i].type;
    return NULL;
}

/* What transformers' from_pretrained takes besides config fields. */
static int loader_kwarg(const char *k)
{
    static const char *const kw[] = {"_target_", "pretrained_model_name_or_path", "revision",
                                     "trust_remote_code", "cache_dir", "local_files_only",
                                     "force_download", "token", "subfolder"};
    for (size_t i = 0; i < sizeof kw / sizeof kw[0]; i++)
        if (strcmp(k, kw[i]) == 0)
            return 1;
    return 0;
}

static mt_status_t load_config_json(const char *dir, json_t **j, char *name, size_t cap)
{
    if (snprintf(name, cap, "%s/config.json", dir) >= (int)cap)
        MT_FAIL(MT_ERR_RANGE, "%s: the path is too long", dir);
    MT_TRY(mt_hf_json_load(name, MAX_JSON_BYTES, j));
    if (!json_is_object(*j)) {
        const char *type = mt_hf_json_type(*j);
        json_decref(*j);
        *j = NULL;
        MT_FAIL(MT_ERR_IO, "%s: the file is a JSON %s, expected an object", name, type);
    }
    return MT_OK;
}

/* The JSON object config.json and model.config describe: *j (new), its
 * name for messages in `name`. */
static mt_status_t merged_json(const mt_config_t *cfg, json_t **out, char *name, size_t cap,
                               FILE *note)
{
    const mt_model_config_t *m = &cfg->model;
    char dir[MT_PATH_MAX + 512];
    json_t *base = NULL, *inl = NULL;
    *out = NULL;
    name[0] = '\0';
    if (m->pretrained_model_name_or_path[0]) {
        MT_TRY(mt_hf_resolve(m, dir, sizeof dir));
        MT_TRY(load_config_json(dir, &base, name, cap));
        if (note) /* which snapshot a hub id resolved to, for the log */
            fprintf(note, "note: model.pretrained_model_name_or_path %s is %s\n",
                    m->pretrained_model_name_or_path, dir);
    }
    if (m->hf_config[0]) {
        char what[MT_PATH_MAX + 32];
        snprintf(what, sizeof what, "%s: model.config",
                 cfg->source_file[0] ? cfg->source_file : "(config)");
        mt_status_t s = mt_hf_json_parse(m->hf_config, strlen(m->hf_config), what, &inl);
        if (s == MT_OK && !json_is_object(inl))
            s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s: expected a mapping, got "
                             "a %s", what, mt_hf_json_type(inl));
        const json_t *p = json_object_get(inl, "pretrained_model_name_or_path");
        if (s == MT_OK && p && !json_is_string(p))
            s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s.pretrained_model_name_or_"
                             "path: expected a string, got a %s", what, mt_hf_json_type(p));
        if (s == MT_OK && p) { /* from_config: this config.json, not the weights' */
            const json_t *r = json_object_get(inl, "revision");
            char key[MT_PATH_MAX + 64];
            snprintf(key, sizeof key, "%s.pretrained_model_name_or_path", what);
            s = mt_hf_resolve_name(json_string_value(p), json_is_string(r) ? json_string_value(r)
                                   : m->revision, key, dir, sizeof dir);
            if (s == MT_OK && note)
                fprintf(note, "note: model.config's pretrained_model_name_or_path %s is %s\n",
                        json_string_value(p), dir);
            json_decref(base);
            base = NULL;
            if (s == MT_OK)
                s = load_config_json(dir, &base, name, cap);
        }
        const json_t *t = json_object_get(inl, "_target_");
        const char *type = json_is_string(t) ? model_type_of_target(json_string_value(t)) : NULL;
        if (s == MT_OK && !base) {
            base = json_object();
            snprintf(name, cap, "%s", what);
        } else if (s == MT_OK && strlen(name) + 20 < cap) {
            strcat(name, " with model.config");
        }
        if (s == MT_OK && type && !json_object_get(inl, "model_type") &&
            !json_object_get(base, "model_type"))
            json_object_set_new(base, "model_type", json_string(type));
        const char *k;
        json_t *v;
        json_object_foreach(inl, k, v) /* nothing unless an object */
            if (s == MT_OK && !loader_kwarg(k))
                json_object_set(base, k, v);
        json_decref(inl);
        if (s != MT_OK) {
            json_decref(base);
            return s;
        }
    }
    *out = base;
    return MT_OK;
}

/* model.* keys that are meshtrain's own, not config.json's: setting one
 * overrides nothing config.json said. */
static int meshtrain_only(const char *path)
{
    static const char *const own[] = {"model.num_shared_experts", "model.moe_capacity_factor",
                                      "model.moe_router_bias_update_rate",
                                      "model.pretrained_model_name_or_path", "model.revision"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (strcmp(path, own[i]) == 0)
            return 1;
    return 0;
}

static size_t value_size(const mt_cfg_key_t *k)
{
    switch (k->type) {
    case MT_T_INT: return sizeof(int64_t);
    case MT_T_OPT_INT: return sizeof(mt_opt_int_t);
    case MT_T_FLOAT: return sizeof(double);
    case MT_T_BOOL: return sizeof(bool);
    case MT_T_STRING: return MT_PATH_MAX;
    case MT_T_ENUM: return sizeof(int);
    default: return 0; /* no model key is a list */
    }
}

static int same_value(const mt_cfg_key_t *k, const void *a, const void *b)
{
    if (k->type == MT_T_STRING)
        return strcmp(a, b) == 0;
    if (k->type == MT_T_OPT_INT) {
        const mt_opt_int_t *x = a, *y = b;
        return x->set == y->set && (!x->set || x->value == y->value);
    }
    if (k->type == MT_T_FLOAT)
        return *(const double *)a == *(const double *)b;
    return memcmp(a, b, value_size(k)) == 0;
}

static void show_value(const mt_cfg_key_t *k, const void *v, char *buf, size_t cap)
{
    switch (k->type) {
    case MT_T_INT: snprintf(buf, cap, "%lld", (long long)*(const int64_t *)v); break;
    case MT_T_OPT_INT: {
        const mt_opt_int_t *o = v;
        if (o->set)
            snprintf(buf, cap, "%lld", (long long)o->value);
        else
            snprintf(buf, cap, "none");
        break;
    }
    case MT_T_FLOAT: snprintf(buf, cap, "%.17g", *(const double *)v); break;
    case MT_T_BOOL: snprintf(buf, cap, "%s", *(const bool *)v ? "true" : "false"); break;
    case MT_T_STRING: snprintf(buf, cap, "\"%.200s\"", (const char *)v); break;
    case MT_T_ENUM:
        snprintf(buf, cap, "%s", mt_cfg_enum_canonical(k->enums, *(const int *)v));
        break;
    default: snprintf(buf, cap, "?");
    }
}

mt_status_t mt_hf_apply_named_model(mt_config_t *cfg, FILE *warn)
{
    mt_model_config_t *m = &cfg->model;
    if (!m->pretrained_model_name_or_path[0] && !m->hf_config[0])
        return MT_OK;
    char name[2 * MT_PATH_MAX + 64];
    json_t *j;
    MT_TRY(merged_json(cfg, &j, name, sizeof name, warn));
    /* config.json starts from the schema's defaults, not from the keys
     * the user set: those come after it, each one reported */
    mt_config_t *d = malloc(sizeof *d);
    if (!d) {
        json_decref(j);
        MT_FAIL(MT_ERR_NOMEM, "config");
    }
    mt_config_init(d);
    mt_model_config_t x = d->model;
    free(d);
    mt_status_t s = mt_hf_config_to_model(j, name, &x, warn);
    json_decref(j);
    MT_TRY(s);
    memcpy(x.pretrained_model_name_or_path, m->pretrained_model_name_or_path,
           sizeof x.pretrained_model_name_or_path);
    memcpy(x.revision, m->revision, sizeof x.revision);
    memcpy(x.hf_config, m->hf_config, sizeof x.hf_config);
    char *cb = (char *)cfg, *xb = (char *)&x;
    size_t model_at = offsetof(mt_config_t, model);
    for (int i = 0; i < mt_cfg_nkeys; i++) {
        const mt_cfg_key_t *k = &mt_cfg_keys[i];
        size_t sz = value_size(k);
        if (strncmp(k->path, "model.", 6) != 0 || cfg->key_origin[i].kind == MT_ORIGIN_DEFAULT ||
            sz == 0 || k->offset < model_at || k->offset + sz > model_at + sizeof x)
            continue;
        void *mine = cb + k->offset, *theirs = xb + (k->offset - model_at);
        if (!same_value(k, mine, theirs) && !meshtrain_only(k->path) && warn) {
            char loc[MT_PATH_MAX + 300], a[256], b[256];
            mt_diag_location(cfg, &cfg->key_origin[i], loc, sizeof loc);
            show_value(k, mine, a, sizeof a);
            show_value(k, theirs, b, sizeof b);
            fprintf(warn, "warning: %s%s = %s overrides %s from %s\n", loc, k->path, a, b, name);
        }
        memcpy(theirs, mine, sz);
    }
    *m = x;
    return MT_OK;
}
