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
 * than F32, BF16 and F16.  The safetensors reading is hf_source.c's,
 * shared with loading by name at start (hf_load.c).  Nothing is
 * downloaded: hf_dir is a directory or a hub id in the local cache. */
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
    /* the stored config names where the weights came from */
    if (strlen(hf_dir) >= sizeof cfg->model.pretrained_model_name_or_path)
        MT_FAIL(MT_ERR_RANGE, "%s: the path is too long", hf_dir);
    snprintf(cfg->model.pretrained_model_name_or_path,
             sizeof cfg->model.pretrained_model_name_or_path, "%s", hf_dir);
    cfg->model.hf_config[0] = '\0';
    /* the smallest world the config's explicit sizes allow */
    const mt_distributed_config_t *d = &cfg->distributed;
    int64_t world = (d->dp_size.set ? d->dp_size.value : 1) * d->tp_size * d->pp_size * d->cp_size;
    MT_TRY(mt_config_validate(cfg, hf.num_experts > 0 ? MT_APP_MOE : MT_APP_DENSE, world, NULL,
                              NULL));
    return MT_OK;
}


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

mt_status_t mt_hf_import(MPI_Comm comm, const char *name, const char *checkpoint_dir,
                         const char *config_path, FILE *out)
{
    char hf_dir[MT_PATH_MAX];
    int rank, size;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    FILE *note = rank == 0 ? out : NULL;
    mt_config_t *cfg = calloc(1, sizeof *cfg);
    mt_hf_source_t src = {0};
    mt_hf_tensor_t *t = NULL;
    mt_ckpt_tensor_t *ct = NULL;
    float *zeros = NULL;
    char *yaml = NULL;
    int n = 0;
    mt_status_t s = cfg ? MT_OK : mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "config");
    if (s == MT_OK)
        s = mt_hf_resolve_name(name, NULL, "import", hf_dir, sizeof hf_dir);
    if (s == MT_OK)
        s = build_config(hf_dir, config_path, cfg, note);
    if (s == MT_OK)
        s = mt_hf_expected_tensors(&cfg->model, &t, &n);
    if (s == MT_OK)
        s = mt_hf_source_open(&src, hf_dir);
    if (s == MT_OK)
        s = mt_hf_source_check(&src, t, n, &cfg->model, hf_dir, note);
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
        const mt_st_entry_t *e = mt_hf_source_find(&src, t[i].name, &fi);
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
            s = mt_hf_read_block(&src.f[fi], e, lo, count, 0, 0, x->data);
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
    mt_hf_source_free(&src);
    free(cfg);
    return s;
}
