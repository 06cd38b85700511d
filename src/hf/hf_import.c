/* hf_import.c: a Hugging Face model directory (config.json plus
 * model.safetensors, or the shards model.safetensors.index.json lists) as
 * a step-0 meshtrain checkpoint: /model tensors converted to float32, zero
 * AdamW state, step 0, written by mt_ckpt_save (so the layout, atomic write
 * and manifest are the trainer's own).
 *
 * Every rank parses config.json and the safetensors headers (small), checks
 * every tensor against the dense model config.json describes, then reads
 * only its own rows of each tensor with pread and hands them to
 * mt_ckpt_save as its hyperslab.  Checks refuse, naming the tensor, what
 * training could not use: missing, extra or misshaped tensors, dtypes other
 * than F32, BF16 and F16.  Nothing is downloaded: hf_dir is local. */
#include "hf_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_internal.h"
#include "mt_comm.h"
#include "config_internal.h"

#define MAX_JSON_BYTES (64u << 20)

typedef struct {
    mt_st_file_t *f;  /* safetensors files */
    int nf;
} source_t;

static void source_free(source_t *src)
{
    for (int i = 0; i < src->nf; i++)
        mt_st_file_free(&src->f[i]);
    free(src->f);
    memset(src, 0, sizeof *src);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* ------------------------------------------------------------ the config */

/* Model keys the --config file sets must agree with config.json. */
static mt_status_t compare_model(const mt_config_t *cfg, const mt_model_config_t *hf,
                                 const char *json_name)
{
    const mt_model_config_t *c = &cfg->model;
    int64_t ckv = c->num_key_value_heads.set ? c->num_key_value_heads.value : c->num_attention_heads;
    struct {
        const char *key;
        double mine, theirs;
    } k[] = {
        {"model.vocab_size", (double)c->vocab_size, (double)hf->vocab_size},
        {"model.hidden_size", (double)c->hidden_size, (double)hf->hidden_size},
        {"model.intermediate_size", (double)c->intermediate_size, (double)hf->intermediate_size},
        {"model.num_hidden_layers", (double)c->num_hidden_layers, (double)hf->num_hidden_layers},
        {"model.num_attention_heads", (double)c->num_attention_heads,
         (double)hf->num_attention_heads},
        {"model.num_key_value_heads", (double)ckv, (double)hf->num_key_value_heads.value},
        {"model.max_position_embeddings", (double)c->max_position_embeddings,
         (double)hf->max_position_embeddings},
        {"model.rope_theta", c->rope_theta, hf->rope_theta},
        {"model.rms_norm_eps", c->rms_norm_eps, hf->rms_norm_eps},
        {"model.tie_word_embeddings", c->tie_word_embeddings, hf->tie_word_embeddings},
        {"model.qk_norm", c->qk_norm, hf->qk_norm},
        {"model.num_experts", (double)c->num_experts, (double)hf->num_experts},
        {"model.num_experts_per_tok", (double)c->num_experts_per_tok,
         (double)hf->num_experts_per_tok},
        {"model.moe_intermediate_size", (double)c->moe_intermediate_size,
         (double)hf->moe_intermediate_size},
        {"model.norm_topk_prob", c->norm_topk_prob, hf->norm_topk_prob},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        int idx = mt_cfg_key_index(k[i].key);
        if (idx < 0 || cfg->key_origin[idx].kind == MT_ORIGIN_DEFAULT || k[i].mine == k[i].theirs)
            continue;
        char loc[MT_PATH_MAX + 300];
        mt_diag_location(cfg, &cfg->key_origin[idx], loc, sizeof loc);
        mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s%s is %.17g, but %s says %.17g%s", loc,
                     k[i].key, k[i].mine, json_name, k[i].theirs,
                     strcmp(k[i].key, "model.qk_norm") == 0
                         ? " (qk_norm is true for Qwen3ForCausalLM, false for LlamaForCausalLM)"
                         : "");
        mt_error_hint("import takes the model section from config.json: remove the model keys "
                      "from the config, or make them agree");
        return MT_ERR_CONFIG;
    }
    return MT_OK;
}

/* The resolved config to store: the model from config.json, the rest from
 * config_path (or the defaults), validated as meshtrain-dense would
 * (meshtrain-moe for a Qwen3-MoE). */
static mt_status_t build_config(const char *hf_dir, const char *config_path, mt_config_t *cfg,
                                FILE *note)
{
    char name[MT_CKPT_PATH_CAP];
    MT_TRY(mt_ckpt_join(name, hf_dir, "config.json"));
    mt_config_init(cfg);
    if (config_path)
        MT_TRY(mt_config_load_file(cfg, config_path));
    json_t *j;
    MT_TRY(mt_hf_json_load(name, MAX_JSON_BYTES, &j));
    mt_model_config_t hf = cfg->model;
    mt_status_t s = mt_hf_config_to_model(j, name, &hf, note);
    json_decref(j);
    MT_TRY(s);
    if (config_path)
        MT_TRY(compare_model(cfg, &hf, name));
    cfg->model = hf;
    /* the smallest world the config's explicit sizes allow */
    const mt_distributed_config_t *d = &cfg->distributed;
    int64_t world = (d->dp_size.set ? d->dp_size.value : 1) * d->tp_size * d->pp_size * d->cp_size;
    MT_TRY(mt_config_validate(cfg, hf.num_experts > 0 ? MT_APP_MOE : MT_APP_DENSE, world, NULL,
                              NULL));
    return MT_OK;
}

/* ------------------------------------------------------------ the safetensors files */

static mt_status_t add_file(source_t *src, const char *path)
{
    mt_st_file_t *f = realloc(src->f, sizeof *f * (size_t)(src->nf + 1));
    if (!f)
        MT_FAIL(MT_ERR_NOMEM, "safetensors file list");
    src->f = f;
    MT_TRY(mt_st_read_header(path, &src->f[src->nf]));
    src->nf++;
    return MT_OK;
}

static const mt_st_entry_t *find(const source_t *src, const char *name, int *file)
{
    for (int i = 0; i < src->nf; i++)
        for (int k = 0; k < src->f[i].n; k++)
            if (strcmp(src->f[i].e[k].name, name) == 0) {
                if (file)
                    *file = i;
                return &src->f[i].e[k];
            }
    return NULL;
}

/* One weight_map member: the shard it names is opened (once) and its
 * header has the tensor. */
static mt_status_t map_entry(source_t *src, const char *hf_dir, const char *index,
                             const char *tensor, const json_t *v)
{
    const char *file = json_string_value(v);
    if (!file || !file[0] || strchr(file, '/') || file[0] == '.')
        MT_FAIL(MT_ERR_IO, "%s: weight_map \"%s\" must name a file in the same directory", index,
                tensor);
    int known = 0;
    for (int k = 0; k < src->nf && !known; k++) {
        const char *base = strrchr(src->f[k].path, '/');
        known = strcmp(base ? base + 1 : src->f[k].path, file) == 0;
    }
    if (!known) {
        char path[MT_CKPT_PATH_CAP];
        MT_TRY(mt_ckpt_join(path, hf_dir, file));
        MT_TRY(add_file(src, path));
    }
    int at;
    if (!find(src, tensor, &at) || strcmp(strrchr(src->f[at].path, '/') + 1, file) != 0)
        MT_FAIL(MT_ERR_IO, "%s maps %s to %s, whose header does not have it", index, tensor, file);
    return MT_OK;
}

/* The index's weight_map and the shards' headers must agree exactly. */
static mt_status_t open_index(source_t *src, const char *hf_dir, const char *index)
{
    json_t *j;
    MT_TRY(mt_hf_json_load(index, MAX_JSON_BYTES, &j));
    json_t *wm = json_object_get(j, "weight_map");
    mt_status_t s = MT_OK;
    if (!json_is_object(wm))
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: no \"weight_map\" object", index);
    const char *tensor;
    json_t *v;
    json_object_foreach(wm, tensor, v) /* none unless an object */
        if ((s = map_entry(src, hf_dir, index, tensor, v)) != MT_OK)
            break;
    for (int k = 0; k < src->nf && s == MT_OK; k++)
        for (int e = 0; e < src->f[k].n && s == MT_OK; e++)
            if (!json_object_get(wm, src->f[k].e[e].name))
                s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s has tensor %s, which %s "
                                 "does not list", src->f[k].path, src->f[k].e[e].name, index);
    json_decref(j);
    return s;
}

static mt_status_t open_source(source_t *src, const char *hf_dir)
{
    char single[MT_CKPT_PATH_CAP], index[MT_CKPT_PATH_CAP];
    MT_TRY(mt_ckpt_join(single, hf_dir, MT_HF_SINGLE));
    MT_TRY(mt_ckpt_join(index, hf_dir, MT_HF_INDEX));
    if (exists(single))
        return add_file(src, single);
    if (exists(index))
        return open_index(src, hf_dir, index);
    MT_FAIL(MT_ERR_IO, "%s: no " MT_HF_SINGLE " and no " MT_HF_INDEX ": import reads "
            "safetensors weights (convert .bin or .pth weights with transformers first)", hf_dir);
}

/* Every expected tensor present with its shape and a dtype we read; any
 * other tensor refused, except what transformers itself ignores. */
static mt_status_t check_tensors(const source_t *src, const mt_hf_tensor_t *t, int n,
                                 const mt_model_config_t *m, const char *hf_dir, FILE *note)
{
    const char *arch = m->num_experts > 0 ? "Qwen3MoeForCausalLM"
                       : m->qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
    for (int i = 0; i < n; i++) {
        int fi;
        const mt_st_entry_t *e = find(src, t[i].name, &fi);
        if (!e) {
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: tensor %s is missing: config.json "
                         "describes a %s with %lld layers%s, which has it", hf_dir, t[i].name,
                         arch, (long long)m->num_hidden_layers,
                         m->tie_word_embeddings ? "" : " and an untied lm_head");
            return MT_ERR_IO;
        }
        int same = e->ndim == t[i].ndim;
        for (int d = 0; same && d < e->ndim; d++)
            same = e->shape[d] == t[i].shape[d];
        if (!same) {
            char have[128] = "[";
            for (int d = 0; d < e->ndim; d++)
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "",
                         (long long)e->shape[d]);
            strcat(have, "]");
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: tensor %s has shape %s, expected "
                         "[%lld%s%lld] from config.json", src->f[fi].path, t[i].name, have,
                         (long long)t[i].shape[0], t[i].ndim > 1 ? ", " : "",
                         t[i].ndim > 1 ? (long long)t[i].shape[1] : 0LL);
            return MT_ERR_IO;
        }
        if (e->dtype == MT_ST_OTHER)
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s; import reads F32, BF16 and "
                    "F16", src->f[fi].path, t[i].name, e->dtype_text);
    }
    for (int k = 0; k < src->nf; k++)
        for (int x = 0; x < src->f[k].n; x++) {
            const char *name = src->f[k].e[x].name;
            int expected = 0;
            for (int i = 0; i < n && !expected; i++)
                expected = strcmp(t[i].name, name) == 0;
            if (expected)
                continue;
            size_t len = strlen(name);
            int inv_freq = len > 20 && strcmp(name + len - 20, ".rotary_emb.inv_freq") == 0;
            if (inv_freq || (m->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0)) {
                if (note)
                    fprintf(note, "note: ignoring %s in %s: %s\n", name, src->f[k].path,
                            inv_freq ? "RoPE frequencies are computed, not loaded"
                                     : "tie_word_embeddings is true, so lm_head is the embedding");
                continue;
            }
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: tensor %s is not part of the %s "
                         "config.json describes", src->f[k].path, name, arch);
            mt_error_hint("a different model's weights, or an architecture variant meshtrain "
                          "does not support (biases, MoE ...)");
            return MT_ERR_IO;
        }
    return MT_OK;
}

/* Rows [lo, lo + count) of tensor e, converted to float32 into dst. */
static mt_status_t read_rows(const mt_st_file_t *f, const mt_st_entry_t *e, int64_t cols,
                             int64_t lo, int64_t count, float *dst)
{
    size_t es = mt_st_dtype_size(e->dtype), n = (size_t)(count * cols);
    if (n == 0)
        return MT_OK;
    unsigned char *b = malloc(n * es);
    if (!b)
        MT_FAIL(MT_ERR_NOMEM, "%s: %lld rows of %s", f->path, (long long)count, e->name);
    int fd = open(f->path, O_RDONLY);
    uint64_t at = f->data_start + e->begin + (uint64_t)lo * (uint64_t)cols * es, done = 0;
    while (fd >= 0 && done < n * es) {
        ssize_t r = pread(fd, b + done, n * es - done, (off_t)(at + done));
        if (r <= 0)
            break;
        done += (uint64_t)r;
    }
    int err = errno;
    if (fd >= 0)
        close(fd);
    if (done != n * es) {
        free(b);
        MT_FAIL(MT_ERR_IO, "%s: reading rows [%lld, %lld) of %s failed: %s", f->path,
                (long long)lo, (long long)(lo + count), e->name,
                done ? "the file is shorter than its header says" : strerror(err));
    }
    mt_st_decode(b, n, e->dtype, dst);
    free(b);
    return MT_OK;
}

/* ------------------------------------------------------------ import */

static mt_status_t check_target(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? MT_OK : mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                                                      "%s: %s", dir, strerror(errno));
    struct dirent *x;
    int used = 0;
    while ((x = readdir(d)) && !used)
        used = strcmp(x->d_name, ".") && strcmp(x->d_name, "..");
    closedir(d);
    if (used) {
        mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s is not empty: import writes a new "
                     "checkpoint_dir and never mixes one into existing checkpoints", dir);
        mt_error_hint("give a new directory");
        return MT_ERR_IO;
    }
    return MT_OK;
}

mt_status_t mt_hf_import(MPI_Comm comm, const char *hf_dir, const char *checkpoint_dir,
                         const char *config_path, FILE *out)
{
    int rank, size;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    FILE *note = rank == 0 ? out : NULL;
    mt_config_t *cfg = calloc(1, sizeof *cfg);
    source_t src = {0};
    mt_hf_tensor_t *t = NULL;
    mt_ckpt_tensor_t *ct = NULL;
    float *zeros = NULL;
    char *yaml = NULL;
    int n = 0;
    mt_status_t s = cfg ? MT_OK : mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "config");
    if (s == MT_OK)
        s = build_config(hf_dir, config_path, cfg, note);
    if (s == MT_OK)
        s = mt_hf_expected_tensors(&cfg->model, &t, &n);
    if (s == MT_OK)
        s = open_source(&src, hf_dir);
    if (s == MT_OK)
        s = check_tensors(&src, t, n, &cfg->model, hf_dir, note);
    if (s == MT_OK && rank == 0)
        s = check_target(checkpoint_dir);
    s = mt_agree(comm, s);

    /* This rank's rows of every tensor; the optimizer state is zeros. */
    int64_t most = 1;
    if (s == MT_OK && !(ct = calloc((size_t)(3 * n), sizeof *ct)))
        s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "%d checkpoint tensors", 3 * n);
    for (int i = 0; i < n && s == MT_OK; i++) {
        int64_t rows = t[i].shape[0], cols = t[i].ndim > 1 ? t[i].shape[1] : 1;
        int64_t lo = rows * rank / size, count = rows * (rank + 1) / size - lo;
        int fi;
        const mt_st_entry_t *e = find(&src, t[i].name, &fi);
        mt_ckpt_tensor_t *x = &ct[i];
        snprintf(x->path, sizeof x->path, "/model/%s", t[i].name);
        x->ndim = t[i].ndim;
        x->shape[0] = rows;
        x->shape[1] = t[i].shape[1];
        x->row_offset = lo;
        x->row_count = count;
        most = count * cols > most ? count * cols : most;
        if (count && !(x->data = malloc(sizeof(float) * (size_t)(count * cols))))
            s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "%s: %lld rows", t[i].name,
                             (long long)count);
        if (s == MT_OK)
            s = read_rows(&src.f[fi], e, cols, lo, count, x->data);
        for (int k = 1; k <= 2; k++) {
            ct[k * n + i] = *x;
            snprintf(ct[k * n + i].path, sizeof x->path, "/optim/%s/%s", t[i].name,
                     k == 1 ? "exp_avg" : "exp_avg_sq");
        }
    }
    if (s == MT_OK && !(zeros = calloc((size_t)most, sizeof(float))))
        s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "%lld floats of zeros",
                         (long long)most);
    for (int i = n; i < 3 * n && s == MT_OK; i++)
        ct[i].data = ct[i].row_count ? zeros : NULL;
    if (s == MT_OK) {
        size_t need = mt_config_to_yaml(cfg, NULL, 0) + 1;
        if (!(yaml = malloc(need)))
            s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "config text");
        else
            mt_config_to_yaml(cfg, yaml, need);
    }
    s = mt_agree(comm, s);
    if (s == MT_OK) {
        char mesh[MT_CKPT_PATH_CAP + 80];
        snprintf(mesh, sizeof mesh, "world %d: imported from Hugging Face %s", size, hf_dir);
        mt_train_state_t st = {0, 0, 0, cfg->rng.seed, 0};
        s = mt_ckpt_save(comm, checkpoint_dir, ct, 3 * n, &st, yaml, mesh, 0);
    }
    if (s == MT_OK && rank == 0 && out) {
        int64_t params = 0;
        for (int i = 0; i < n; i++)
            params += t[i].shape[0] * (t[i].ndim > 1 ? t[i].shape[1] : 1);
        fprintf(out, "imported %s (%s, %d tensors, %lld parameters, from %d safetensors "
                "file%s) into %s/step_00000000\n", hf_dir,
                cfg->model.num_experts > 0 ? "Qwen3MoeForCausalLM"
                : cfg->model.qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM", n,
                (long long)params, src.nf, src.nf > 1 ? "s" : "", checkpoint_dir);
        fprintf(out, "fine-tune it with: %s --config CONFIG.yaml "
                "checkpoint.resume=%s/step_00000000\n",
                cfg->model.num_experts > 0 ? "meshtrain-moe" : "meshtrain-dense", checkpoint_dir);
    }
    for (int i = 0; ct && i < n; i++)
        free(ct[i].data);
    free(ct);
    free(zeros);
    free(yaml);
    free(t);
    source_free(&src);
    free(cfg);
    return s;
}
