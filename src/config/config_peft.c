/* config_peft.c: the peft: section's module matching and its rules.
 *
 * Matching follows AutoModel's ModuleMatcher (doc/lora.md): target_modules
 * patterns against a linear's full Hugging Face module name, where * (or
 * .*) matches any characters and . any one character, as its regex
 * rewrite makes them; a pattern without wildcards also matches the
 * module's own name (q_proj), as Hugging Face PEFT reads it.  With
 * exclude_modules instead, every linear but the excluded ones.  The
 * linears are the decoder's seven projections and lm_head. */
#include "config_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const proj[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                   "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                   "mlp.down_proj"};
#define NPROJ ((int)(sizeof proj / sizeof proj[0]))

/* pattern [p, pe) against the whole of s */
static bool glob(const char *p, const char *pe, const char *s)
{
    while (p < pe) {
        if (*p == '*' || (*p == '.' && p + 1 < pe && p[1] == '*')) {
            p += *p == '*' ? 1 : 2;
            for (const char *t = s;; t++) {
                if (glob(p, pe, t))
                    return true;
                if (!*t)
                    return false;
            }
        }
        if (!*s || (*p != '.' && *p != *s))
            return false;
        p++, s++;
    }
    return *s == '\0';
}

static bool one_matches(const char *p, const char *pe, const char *full)
{
    if (glob(p, pe, full))
        return true;
    if (memchr(p, '*', (size_t)(pe - p)) || memchr(p, '.', (size_t)(pe - p)))
        return false;
    const char *leaf = strrchr(full, '.');
    leaf = leaf ? leaf + 1 : full;
    return strlen(leaf) == (size_t)(pe - p) && strncmp(leaf, p, (size_t)(pe - p)) == 0;
}

/* Whether any pattern of the comma-separated list matches full. */
static bool list_matches(const char *list, const char *full)
{
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        e = e ? e : p + strlen(p);
        if (e > p && one_matches(p, e, full))
            return true;
        p = *e ? e + 1 : e;
    }
    return false;
}

bool mt_peft_matches(const mt_peft_config_t *p, const char *full_name)
{
    if (!p->enabled)
        return false;
    if (p->match_all_linear)
        return true;
    if (p->target_modules[0])
        return list_matches(p->target_modules, full_name);
    if (p->exclude_modules[0])
        return !list_matches(p->exclude_modules, full_name);
    return list_matches("*_proj", full_name);
}

static void perr(mt_config_t *cfg, mt_diag_t *d, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void perr(mt_config_t *cfg, mt_diag_t *d, const char *path, const char *fmt, ...)
{
    char loc[MT_PATH_MAX + 300], msg[1024];
    mt_origin_t o = {MT_ORIGIN_DEFAULT, 0, 0, 0};
    int ki = mt_cfg_key_index(path), si = mt_cfg_section_index(path);
    if (ki >= 0)
        o = cfg->key_origin[ki];
    else if (si >= 0)
        o = cfg->section_origin[si];
    mt_diag_location(cfg, &o, loc, sizeof loc);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mt_diag_add(d, "%s%s: %s", loc, path, msg);
}

/* Each pattern of target_modules matches some linear of the model. */
static void check_targets(mt_config_t *cfg, mt_diag_t *d)
{
    const char *list = cfg->peft.target_modules;
    char full[128];
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        e = e ? e : p + strlen(p);
        bool hit = false;
        for (int64_t l = 0; !hit && l < cfg->model.num_hidden_layers; l++)
            for (int j = 0; !hit && j < NPROJ; j++) {
                snprintf(full, sizeof full, "model.layers.%lld.%s", (long long)l, proj[j]);
                hit = one_matches(p, e, full);
            }
        if (!hit && !one_matches(p, e, "lm_head"))
            perr(cfg, d, "peft.target_modules", "'%.*s' matches none of the model's linears "
                 "(model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,"
                 "down}_proj, lm_head; N below %lld)", (int)(e - p), p,
                 (long long)cfg->model.num_hidden_layers);
        p = *e ? e + 1 : e;
    }
}

/* What LoRA does not run with yet, by name. */
static void check_mesh(mt_config_t *cfg, mt_diag_t *d)
{
    const mt_distributed_config_t *ds = &cfg->distributed;
    static const char nyi[] = "is not supported yet";
    if (ds->pp_size > 1 && (ds->pipeline.pp_schedule == MT_PP_ZERO_BUBBLE ||
                            ds->pipeline.pp_schedule == MT_PP_V_SCHEDULE))
        perr(cfg, d, "distributed.pipeline.pp_schedule", "peft: LoRA with a split backward "
             "(zero_bubble, v_schedule) %s", nyi);
    if (ds->ep_size > 1 || cfg->model.num_experts > 0)
        perr(cfg, d, "model.num_experts", "peft: LoRA on MoE models (and expert parallelism) "
             "%s", nyi);
    if (ds->strategy == MT_STRATEGY_MEGATRON_FSDP)
        perr(cfg, d, "distributed.strategy", "peft: LoRA with megatron_fsdp %s (use fsdp2 or "
             "ddp)", nyi);
    if (ds->tp_size > 1 && ds->sequence_parallel)
        perr(cfg, d, "distributed.sequence_parallel", "peft: LoRA with sequence parallelism "
             "%s", nyi);
    if (cfg->checkpoint.save_consolidated != MT_CONSOLIDATE_NEVER)
        perr(cfg, d, "checkpoint.save_consolidated", "peft: a consolidated Hugging Face "
             "directory of a LoRA run %s; export the adapter with meshtrain-ckpt export "
             "--adapter", nyi);
}

void mt_peft_validate(mt_config_t *cfg, mt_diag_t *d)
{
    mt_peft_config_t *p = &cfg->peft;
    int si = mt_cfg_section_index("peft");
    p->enabled = si >= 0 && cfg->section_origin[si].kind != MT_ORIGIN_DEFAULT;
    for (int i = 0; i < mt_cfg_nkeys && !p->enabled; i++)
        p->enabled = strncmp(mt_cfg_keys[i].path, "peft.", 5) == 0 &&
                     cfg->key_origin[i].kind != MT_ORIGIN_DEFAULT;
    if (!p->enabled)
        return;
    if (!cfg->model.pretrained_model_name_or_path[0])
        perr(cfg, d, "peft", "LoRA trains adapters on a pretrained base: set "
             "model.pretrained_model_name_or_path (the base is loaded from it, also on resume)");
    if (p->dim < 1)
        perr(cfg, d, "peft.dim", "the LoRA rank must be at least 1, got %lld", (long long)p->dim);
    if (p->use_dora)
        perr(cfg, d, "peft.use_dora", "DoRA is not supported; set use_dora: false");
    if (p->dropout != 0.0)
        perr(cfg, d, "peft.dropout", "LoRA dropout %g is not supported yet; set 0", p->dropout);
    if (p->lora_dtype[0] && strcmp(p->lora_dtype, "float32") != 0 &&
        strcmp(p->lora_dtype, "torch.float32") != 0)
        perr(cfg, d, "peft.lora_dtype", "adapters train in float32; got '%s'", p->lora_dtype);
    bool tgt = p->target_modules[0] != '\0', exc = p->exclude_modules[0] != '\0';
    if (tgt && exc)
        perr(cfg, d, "peft.exclude_modules", "target_modules and exclude_modules are mutually "
             "exclusive (AutoModel's rule): give one of them");
    if (p->match_all_linear)
        perr(cfg, d, "peft.match_all_linear", "matches lm_head too, and LoRA on lm_head is not "
             "supported; use target_modules: '*_proj'");
    else if (tgt && mt_peft_matches(p, "lm_head"))
        perr(cfg, d, "peft.target_modules", "matches lm_head: LoRA on lm_head is not supported");
    else if (!tgt && exc && mt_peft_matches(p, "lm_head"))
        perr(cfg, d, "peft.exclude_modules", "every linear not excluded gets an adapter, "
             "lm_head too, and LoRA on lm_head is not supported: add lm_head to "
             "exclude_modules");
    if (tgt)
        check_targets(cfg, d);
    check_mesh(cfg, d);
}
