/* hf_peft.c: a LoRA checkpoint's adapters as a Hugging Face PEFT
 * directory (`meshtrain-ckpt export --adapter`, doc/lora.md):
 * adapter_config.json (peft_type LORA, r, lora_alpha, target_modules,
 * base_model_name_or_path) and adapter_model.safetensors with PEFT's
 * tensor names, base_model.model.<module>.lora_A.weight [r, in] and
 * .lora_B.weight [out, r].  The checkpoint stores them under
 * <module>.lora_{A,B}.weight; the writer is the model export's
 * (hf_export.c), with this plan. */
#include "hf_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_cli_internal.h"
#include "mt_comm.h"

#define PEFT_PREFIX "base_model.model."
#define PEFT_WEIGHTS "adapter_model.safetensors"

static const char *const proj[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                   "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                   "mlp.down_proj"};
#define NPROJ 7

/* [out, in] of projection j of the model */
static void proj_shape(const mt_model_config_t *m, int j, int64_t *out, int64_t *in)
{
    int64_t nh = m->num_attention_heads;
    int64_t nkv = m->num_key_value_heads.set ? m->num_key_value_heads.value : nh;
    int64_t hd = m->head_dim.set ? m->head_dim.value : m->hidden_size / nh;
    int64_t H = m->hidden_size, I = m->intermediate_size;
    const int64_t o[NPROJ] = {nh * hd, nkv * hd, nkv * hd, H, I, I, H};
    const int64_t i[NPROJ] = {H, H, H, nh * hd, H, H, I};
    *out = o[j], *in = i[j];
}

/* The adapters' plan (t: checkpoint names, e: PEFT names) and, into
 * *targets, PEFT's target_modules: the projections' own names when each
 * one chosen is on every layer, else a regex of the full module names. */
static mt_status_t adapter_plan(mt_hf_plan_t *p, const mt_config_t *cfg, mt_st_dtype_t dtype,
                                json_t **targets)
{
    const mt_model_config_t *m = &cfg->model;
    int64_t L = m->num_hidden_layers, r = cfg->peft.dim;
    memset(p, 0, sizeof *p);
    int cap = (int)(2 * NPROJ * (L > 0 ? L : 1));
    p->t = calloc((size_t)cap, sizeof *p->t);
    p->e = calloc((size_t)cap, sizeof *p->e);
    p->shard = calloc((size_t)cap, sizeof *p->shard);
    p->data_bytes = calloc(1, sizeof *p->data_bytes);
    *targets = NULL;
    if (!p->t || !p->e || !p->shard || !p->data_bytes)
        MT_FAIL(MT_ERR_NOMEM, "adapter plan");
    int count[NPROJ] = {0};
    char mod[MT_HF_NAME_MAX];
    for (int64_t l = 0; l < L; l++)
        for (int j = 0; j < NPROJ; j++) {
            snprintf(mod, sizeof mod, "model.layers.%lld.%s", (long long)l, proj[j]);
            if (!mt_peft_matches(&cfg->peft, mod))
                continue;
            count[j]++;
            int64_t out, in;
            proj_shape(m, j, &out, &in);
            for (int ab = 0; ab < 2; ab++) {
                mt_hf_tensor_t *t = &p->t[p->n];
                mt_st_entry_t *e = &p->e[p->n];
                snprintf(t->name, sizeof t->name, "%s.lora_%c.weight", mod, ab ? 'B' : 'A');
                snprintf(e->name, sizeof e->name, PEFT_PREFIX "%s", t->name);
                t->ndim = e->ndim = 2;
                t->shape[0] = e->shape[0] = ab ? out : r;
                t->shape[1] = e->shape[1] = ab ? r : in;
                e->dtype = dtype;
                uint64_t bytes = mt_st_dtype_size(dtype) * (uint64_t)(t->shape[0] * t->shape[1]);
                e->begin = p->total;
                e->end = p->total + bytes;
                p->total += bytes;
                p->n++;
            }
        }
    p->nshards = 1;
    p->data_bytes[0] = p->total;
    if (p->n == 0)
        MT_FAIL(MT_ERR_CONFIG, "the checkpoint's peft: section targets no linear");
    bool whole = true;
    for (int j = 0; j < NPROJ; j++)
        whole = whole && (count[j] == 0 || count[j] == L);
    if (whole) {
        *targets = json_array();
        for (int j = 0; j < NPROJ; j++)
            if (count[j])
                json_array_append_new(*targets, json_string(strchr(proj[j], '.') + 1));
        return MT_OK;
    }
    size_t len = 0, rcap = (size_t)p->n * 64 + 1;
    char *re = malloc(rcap);
    if (!re)
        MT_FAIL(MT_ERR_NOMEM, "target_modules");
    re[0] = '\0';
    for (int i = 0; i < p->n; i += 2) { /* each module once, dots escaped */
        const char *n = p->t[i].name;
        if (len)
            re[len++] = '|';
        for (const char *c = n; *c && c < n + strlen(n) - strlen(".lora_A.weight"); c++) {
            if (*c == '.')
                re[len++] = '\\';
            re[len++] = *c;
        }
        re[len] = '\0';
    }
    *targets = json_string(re);
    free(re);
    return MT_OK;
}

static mt_status_t adapter_config(const mt_config_t *cfg, json_t *targets, char **text)
{
    json_t *j = json_object();
    json_object_set_new(j, "peft_type", json_string("LORA"));
    json_object_set_new(j, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(j, "base_model_name_or_path",
                        json_string(cfg->model.pretrained_model_name_or_path));
    json_object_set_new(j, "revision", cfg->model.revision[0] ? json_string(cfg->model.revision)
                                                              : json_null());
    json_object_set_new(j, "r", json_integer(cfg->peft.dim));
    json_object_set_new(j, "lora_alpha", json_real(cfg->peft.alpha));
    json_object_set_new(j, "lora_dropout", json_real(cfg->peft.dropout));
    json_object_set(j, "target_modules", targets);
    json_object_set_new(j, "bias", json_string("none"));
    json_object_set_new(j, "fan_in_fan_out", json_false());
    json_object_set_new(j, "inference_mode", json_true());
    json_object_set_new(j, "init_lora_weights", json_true());
    json_object_set_new(j, "modules_to_save", json_null());
    json_object_set_new(j, "use_dora", json_false());
    json_object_set_new(j, "use_rslora", json_false());
    json_object_set_new(j, "rank_pattern", json_object());
    json_object_set_new(j, "alpha_pattern", json_object());
    *text = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(j);
    if (!*text)
        MT_FAIL(MT_ERR_NOMEM, "adapter_config.json");
    return MT_OK;
}

/* The checkpoint's stored config on every rank, parsed and checked to be
 * a LoRA run's. */
static mt_status_t read_config(MPI_Comm comm, const char *step_dir, const char *file,
                               mt_config_t *cfg)
{
    int rank;
    char *yaml = NULL;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    mt_status_t s = rank == 0 ? mt_ckpt_verify(step_dir) : MT_OK;
    if (s == MT_OK && rank == 0)
        s = mt_ckpt_read_config(step_dir, &yaml);
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = mt_agree(comm, mt_hf_bcast_text(comm, &yaml));
    if (s == MT_OK) {
        char name[MT_CKPT_PATH_CAP + 32];
        snprintf(name, sizeof name, "%s /meta config", file);
        mt_config_init(cfg);
        s = mt_config_load_string(cfg, yaml, name);
    }
    free(yaml);
    if (s != MT_OK)
        return s;
    /* a stored config has peft: only when it is on (config_emit.c) */
    if (!cfg->peft.enabled)
        MT_FAIL(MT_ERR_CONFIG, "%s: not a LoRA checkpoint (its config has no peft: section): "
                "export the model without --adapter", file);
    return MT_OK;
}

mt_status_t mt_hf_export_adapter(MPI_Comm comm, const char *step_dir, const char *dir, bool bf16,
                                 FILE *out)
{
    int rank;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    mt_st_dtype_t dtype = bf16 ? MT_ST_BF16 : MT_ST_F32;
    char file[MT_CKPT_PATH_CAP], *json = NULL;
    MT_TRY(mt_ckpt_join(file, step_dir, MT_CKPT_FILE));
    mt_config_t *cfg = calloc(1, sizeof *cfg);
    if (!cfg)
        MT_FAIL(MT_ERR_NOMEM, "config");
    mt_hf_plan_t p = {0};
    json_t *targets = NULL;
    mt_status_t s = read_config(comm, step_dir, file, cfg);
    if (s == MT_OK)
        s = adapter_plan(&p, cfg, dtype, &targets);
    if (s == MT_OK)
        s = adapter_config(cfg, targets, &json);
    if (s == MT_OK && rank == 0)
        s = mt_hf_mkdir_p(dir);
    char dst[MT_CKPT_PATH_CAP + 64];
    snprintf(dst, sizeof dst, "%s/" PEFT_WEIGHTS, dir);
    if (s == MT_OK && rank == 0 && access(dst, F_OK) == 0)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s exists: export into a new "
                         "directory", dst);
    s = mt_agree(comm, s);
    mt_hf_h5_rows_t src = {{mt_hf_h5_get}, NULL, NULL, 0};
    if (s == MT_OK)
        s = mt_ckpt_h5_open(comm, file, &src.rd);
    if (s == MT_OK)
        s = mt_hf_write_weights(comm, dir, &p, &src.base, out);
    if (src.rd)
        s = mt_ckpt_h5_close(src.rd, s);
    free(src.buf);
    /* the writer names a single file model.safetensors; PEFT's is adapter_model */
    char from[MT_CKPT_PATH_CAP + 64];
    snprintf(from, sizeof from, "%s/" MT_HF_SINGLE, dir);
    if (s == MT_OK && rank == 0 && rename(from, dst) != 0)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "rename %s to %s failed", from, dst);
    if (s == MT_OK && rank == 0) /* the config last: without it the directory is no adapter */
        s = mt_hf_write_text(dir, "adapter_config.json", json);
    s = mt_agree(comm, s);
    if (s == MT_OK && rank == 0 && out)
        fprintf(out, "exported the LoRA adapter of %s to %s: %d tensors (r %lld, alpha %g), "
                "%llu bytes of %s, base %s\n", step_dir, dir, p.n, (long long)cfg->peft.dim,
                cfg->peft.alpha, (unsigned long long)p.total, bf16 ? "bfloat16" : "float32",
                cfg->model.pretrained_model_name_or_path);
    json_decref(targets);
    mt_hf_plan_free(&p);
    free(json);
    free(cfg);
    return s;
}

/* ------------------------------------------------------------ --merge */

/* The merged model's rows: the base's, read from its safetensors, plus
 * (alpha / r) B A for an adapted linear, B's rows and all of A read from
 * the checkpoint (every rank reads the same tensors in the same order: the
 * HDF5 reads may be collective). */
typedef struct {
    mt_hf_rows_t base; /* first: the callback's argument is this */
    mt_ckpt_h5_reader_t *rd;
    const mt_config_t *cfg;
    mt_hf_source_t src;
    float *buf, *a, *b;
    size_t cap, acap, bcap; /* floats */
} merge_rows_t;

static mt_status_t grow(float **p, size_t *cap, size_t need, const char *what)
{
    if (need <= *cap)
        return MT_OK;
    float *n = realloc(*p, sizeof(float) * need);
    if (!n)
        MT_FAIL(MT_ERR_NOMEM, "%s: %zu floats", what, need);
    *p = n, *cap = need;
    return MT_OK;
}

static mt_status_t lora_rows(mt_ckpt_h5_reader_t *rd, const char *mod, char ab, int64_t rows,
                             int64_t cols, int64_t lo, int64_t count, float *dst)
{
    mt_ckpt_tensor_t ct = {.ndim = 2, .row_offset = lo, .row_count = count, .data = dst};
    snprintf(ct.path, sizeof ct.path, "/model/%s.lora_%c.weight", mod, ab);
    ct.shape[0] = rows, ct.shape[1] = cols;
    return mt_ckpt_h5_read_rows(rd, &ct);
}

static mt_status_t merge_get(mt_hf_rows_t *base, MPI_Comm comm, const mt_hf_plan_t *p, int i,
                             int64_t blk[4], const float **v)
{
    merge_rows_t *r = (merge_rows_t *)base;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const mt_hf_tensor_t *t = &p->t[i];
    int64_t cols = t->ndim > 1 ? t->shape[1] : 1, R = t->shape[0];
    int64_t lo = R * rank / size, count = R * (rank + 1) / size - lo, rk = r->cfg->peft.dim;
    char mod[MT_HF_NAME_MAX];
    size_t n = strlen(t->name);
    bool linear = t->ndim == 2 && n > 7 && strcmp(t->name + n - 7, ".weight") == 0;
    snprintf(mod, sizeof mod, "%.*s", (int)(n - 7), t->name);
    bool adapted = linear && strncmp(mod, "model.layers.", 13) == 0 &&
                   mt_peft_matches(&r->cfg->peft, mod);
    mt_status_t s = grow(&r->buf, &r->cap, (size_t)(count * cols > 0 ? count * cols : 1), t->name);
    if (s == MT_OK && adapted)
        s = grow(&r->a, &r->acap, (size_t)(rk * cols), t->name);
    if (s == MT_OK && adapted)
        s = grow(&r->b, &r->bcap, (size_t)(count * rk > 0 ? count * rk : 1), t->name);
    int fi;
    const mt_st_entry_t *e = mt_hf_source_find(&r->src, t->name, &fi);
    if (s == MT_OK && !e)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "the base model has no tensor %s",
                         t->name);
    if (s == MT_OK && count > 0)
        s = mt_hf_read_block(&r->src.f[fi], e, lo, count, 0, 0, r->buf);
    MT_TRY(mt_agree(comm, s));
    if (adapted) {
        MT_TRY(lora_rows(r->rd, mod, 'A', rk, cols, 0, rk, r->a));
        MT_TRY(lora_rows(r->rd, mod, 'B', R, rk, lo, count, r->b));
        double sc = r->cfg->peft.alpha / (double)rk;
        for (int64_t j = 0; j < count; j++)
            for (int64_t c = 0; c < cols; c++) {
                double acc = 0;
                for (int64_t k = 0; k < rk; k++)
                    acc += (double)r->b[j * rk + k] * (double)r->a[k * cols + c];
                r->buf[j * cols + c] = (float)((double)r->buf[j * cols + c] + sc * acc);
            }
    }
    blk[0] = lo, blk[1] = count, blk[2] = 0, blk[3] = cols;
    *v = r->buf;
    return MT_OK;
}

mt_status_t mt_hf_export_merged(MPI_Comm comm, const char *step_dir, const char *dir,
                                const mt_hf_export_opts_t *opts, FILE *out)
{
    int rank;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    mt_st_dtype_t dtype = opts->bf16 ? MT_ST_BF16 : MT_ST_F32;
    char file[MT_CKPT_PATH_CAP], *json = NULL, basedir[MT_PATH_MAX + 512] = "";
    MT_TRY(mt_ckpt_join(file, step_dir, MT_CKPT_FILE));
    mt_config_t *cfg = calloc(1, sizeof *cfg);
    if (!cfg)
        MT_FAIL(MT_ERR_NOMEM, "config");
    mt_hf_plan_t p = {0};
    merge_rows_t src = {{merge_get}, NULL, cfg, {0}, NULL, NULL, NULL, 0, 0, 0};
    mt_status_t s = read_config(comm, step_dir, file, cfg);
    /* rank 0 names the base's directory, so every rank reads the same snapshot */
    if (s == MT_OK)
        s = mt_agree(comm, rank == 0 ? mt_hf_resolve(&cfg->model, basedir, sizeof basedir)
                                     : MT_OK);
    if (s == MT_OK)
        MPI_Bcast(basedir, (int)sizeof basedir, MPI_CHAR, 0, comm);
    if (s == MT_OK)
        s = mt_hf_check_writable(&cfg->model, file);
    if (s == MT_OK)
        s = mt_hf_plan(&p, &cfg->model, NULL, dtype, opts->max_shard_bytes);
    if (s == MT_OK)
        s = mt_hf_config_json(&cfg->model, dtype, &json);
    if (s == MT_OK)
        s = mt_hf_source_open(&src.src, basedir);
    s = mt_agree(comm, s);
    if (s == MT_OK && rank == 0)
        s = mt_hf_mkdir_p(dir);
    char cj[MT_CKPT_PATH_CAP + 64];
    snprintf(cj, sizeof cj, "%s/config.json", dir);
    if (s == MT_OK && rank == 0 && access(cj, F_OK) == 0)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s exists: export into a new "
                         "directory", cj);
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = mt_ckpt_h5_open(comm, file, &src.rd);
    if (s == MT_OK)
        s = mt_hf_write_weights(comm, dir, &p, &src.base, out);
    if (src.rd)
        s = mt_ckpt_h5_close(src.rd, s);
    if (s == MT_OK && rank == 0) /* config.json last: a directory without it is no model */
        s = mt_hf_write_text(dir, "config.json", json);
    s = mt_agree(comm, s);
    if (s == MT_OK && rank == 0 && out)
        fprintf(out, "exported %s merged into its base %s to %s: %d tensors, W + %g/%lld B A "
                "on the adapted linears, %s\n", step_dir, basedir, dir, p.n, cfg->peft.alpha,
                (long long)cfg->peft.dim, opts->bf16 ? "bfloat16" : "float32");
    mt_hf_source_free(&src.src);
    free(src.buf), free(src.a), free(src.b);
    mt_hf_plan_free(&p);
    free(json);
    free(cfg);
    return s;
}
