/* config_automodel_recipe.c: what an AutoModel recipe is as a whole: the
 * one reason it cannot run, its datasets, and the defaults that depend on
 * which sections it has.  The per-key table is config_automodel.c's. */
#include "config_yaml_internal.h"

#include <stdio.h>
#include <string.h>

#define CONVERT_DATA                                                                    \
    "convert the data with meshtrain-data (doc/data.md) and set dataset.path to the "  \
    "token file"

/* ---- datasets ---- */

static void data_refusal(mt_parse_ctx_t *c, const yaml_node_t *n, const char *fmt, const char *what)
{
    mt_automodel_t *am = &c->cfg->automodel;
    if (am->data_refusal[0])
        return; /* the first one is the reason */
    char loc[64] = "";
    if (n && c->origin.kind == MT_ORIGIN_FILE)
        snprintf(loc, sizeof loc, "line %d: ", (int)n->start_mark.line + 1);
    char msg[400];
    snprintf(msg, sizeof msg, fmt, what);
    snprintf(am->data_refusal, sizeof am->data_refusal, "%s%s: %s", loc, msg, CONVERT_DATA);
}

void mt_am_fn_dataset(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                       const char *arg)
{
    bool train = strcmp(arg, "dataset") == 0;
    if (mt_cfg_null_scalar(vn))
        return;
    const yaml_node_t *t = mt_cfg_map_get(c, vn, "_target_");
    if (!t) { /* meshtrain's own dataset keys */
        if (train) {
            mt_cfg_perr(c, vn, "internal: dataset without _target_ reached the AutoModel table");
            return;
        }
        mt_am_note_ignored(c->cfg, path);
        return;
    }
    const char *leaf = mt_am_class_leaf(mt_cfg_scalar(t));
    /* the sequence length sizes the plan even when the data cannot be read */
    static const char *lens[] = {"seq_length", "seq_len", "max_length", "packed_sequence_size"};
    for (int i = 0; i < 4 && train; i++) {
        const yaml_node_t *l = mt_cfg_map_get(c, vn, lens[i]);
        if (l && !mt_cfg_null_scalar(l) && l->type == YAML_SCALAR_NODE) {
            mt_cfg_set_node(c, mt_cfg_key_index("dataset.seq_length"), l);
            break;
        }
    }
    const yaml_node_t *file = NULL;
    const char *fmt = NULL;
    if (strcmp(leaf, "NanogptDataset") == 0)
        file = mt_cfg_map_get(c, vn, "file_pattern"), fmt = "llmc";
    else if (strcmp(leaf, "MegatronPretraining") == 0 && !mt_cfg_map_get(c, vn, "split"))
        file = mt_cfg_map_get(c, vn, "paths"), fmt = "megatron";
    const char *f = mt_cfg_scalar(file);
    if (fmt && f[0] && !strpbrk(f, "*?[")) { /* one local token file */
        mt_cfg_set_node(c, mt_cfg_key_index(train ? "dataset.path" : "dataset.validation_path"),
                        file);
        if (train)
            mt_am_set_key(c, "dataset.format", fmt, file);
        return;
    }
    char what[300];
    snprintf(what, sizeof what, "%s._target_ %s", path, leaf);
    if (train)
        data_refusal(c, t, "%s is built by Python code", what);
    else
        mt_am_note_ignored(c->cfg, "validation_dataset (Python-built: not evaluated)");
}

/* ---- after the walk ---- */

void mt_am_finish(mt_parse_ctx_t *c, const yaml_node_t *root)
{
    mt_config_t *cfg = c->cfg;
    mt_automodel_t *am = &cfg->automodel;
    const yaml_node_t *opt = mt_cfg_map_get(c, root, "optimizer");
    /* torch.optim.Adam and TE FusedAdam default to no weight decay */
    if ((am->optimizer == MT_AM_OPT_ADAM || am->optimizer == MT_AM_OPT_FUSED_ADAM) &&
        !mt_am_key_given(cfg, "optimizer.weight_decay"))
        cfg->optimizer.weight_decay = 0;
    bool l2 = am->optimizer == MT_AM_OPT_ADAM ||
              (am->optimizer == MT_AM_OPT_FUSED_ADAM && am->adam_l2);
    if (l2 && cfg->optimizer.weight_decay > 0)
        mt_cfg_perr(c, mt_cfg_map_get(c, opt, "weight_decay"),
                    "optimizer.weight_decay: %g with Adam is L2 regularisation (added to the "
                    "gradient), which meshtrain does not implement; use torch.optim.AdamW "
                    "(decoupled decay) or weight_decay 0", cfg->optimizer.weight_decay);
    /* the format of meshtrain's own checkpoint is always HDF5; AutoModel's
     * torch_save only names the format of its sharded checkpoint then */
    if (cfg->checkpoint.model_save_format == MT_SAVE_TORCH_SAVE &&
        (cfg->checkpoint.save_consolidated == MT_CONSOLIDATE_NEVER || !cfg->checkpoint.enabled)) {
        cfg->checkpoint.model_save_format = MT_SAVE_HDF5;
        mt_am_note_ignored(cfg, "checkpoint.model_save_format: torch_save (checkpoints are HDF5)");
    }
    /* no checkpoints, no consolidated copies: AutoModel does not object */
    if (!cfg->checkpoint.enabled && cfg->checkpoint.save_consolidated != MT_CONSOLIDATE_NEVER) {
        cfg->checkpoint.save_consolidated = MT_CONSOLIDATE_NEVER;
        mt_am_note_ignored(cfg, "checkpoint.save_consolidated (checkpoint.enabled is false)");
    }
    if (!am->recipe)
        return;
    /* no lr_scheduler section: AutoModel keeps the learning rate constant */
    if (!mt_cfg_map_get(c, root, "lr_scheduler")) {
        cfg->lr_scheduler.lr_decay_style = MT_LR_CONSTANT;
        cfg->lr_scheduler.lr_warmup_steps = 0;
    } else {
        am->lr_schedule = true; /* AutoModel's OptimizerParamScheduler (mt_lr_at) */
        if (!mt_am_key_given(cfg, "lr_scheduler.min_lr"))
            cfg->lr_scheduler.min_lr = 0.01 * cfg->optimizer.lr;
        if (!mt_am_key_given(cfg, "lr_scheduler.init_lr"))
            cfg->lr_scheduler.init_lr = 0.1 * cfg->optimizer.lr;
        if (!mt_am_key_given(cfg, "lr_scheduler.lr_warmup_steps") && !am->max_steps_null) {
            int64_t t = cfg->step_scheduler.max_steps / 10;
            cfg->lr_scheduler.lr_warmup_steps = t < 1000 ? t : 1000;
        }
    }
    /* num_epochs: the step count comes from the data (the trainer); with
     * max_steps too, the run stops at whichever is first */
    if (am->max_steps_null && am->num_epochs == 0)
        am->num_epochs = 10; /* AutoModel's default when both are null */
}
