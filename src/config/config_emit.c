/* config_emit.c: the resolved config as YAML, and the config reference.
 *
 * The YAML is what apps print at start and checkpoints store; it reads back
 * into the same struct (tests/config/test_config_parse checks the round trip).
 * The reference is doc/config-reference.md, generated from the schema so
 * the documentation cannot drift from the parser (tests compare them). */
#include "config_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Shortest %g that reads back to the same double. */
static void fmt_double(double v, char *buf, size_t cap)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    /* Keep it visibly a number with a fraction or exponent for YAML readers. */
    if (!strpbrk(buf, ".eEn")) {
        size_t n = strlen(buf);
        if (n + 2 < cap)
            strcat(buf, ".0");
    }
}

/* A YAML double-quoted scalar.  Control characters are escaped: raw in
 * quotes, a newline folds into a space on reading and \x01 is refused,
 * so the value would not read back as written. */
static void write_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", out);
        else if (c == '\t')
            fputs("\\t", out);
        else if (c == '\r')
            fputs("\\r", out);
        else if (c < 0x20 || c == 0x7f)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

static void write_value(FILE *out, const mt_config_t *cfg, const mt_cfg_key_t *k)
{
    const char *base = (const char *)cfg;
    char buf[64];
    switch (k->type) {
    case MT_T_INT:
        fprintf(out, "%lld", (long long)*(const int64_t *)(base + k->offset));
        break;
    case MT_T_OPT_INT: {
        const mt_opt_int_t *o = (const mt_opt_int_t *)(base + k->offset);
        if (o->set)
            fprintf(out, "%lld", (long long)o->value);
        else
            fputs("null", out);
        break;
    }
    case MT_T_FLOAT:
        fmt_double(*(const double *)(base + k->offset), buf, sizeof buf);
        fputs(buf, out);
        break;
    case MT_T_BOOL:
        fputs(*(const bool *)(base + k->offset) ? "true" : "false", out);
        break;
    case MT_T_STRING:
        write_string(out, base + k->offset);
        break;
    case MT_T_ENUM:
        fputs(mt_cfg_enum_canonical(k->enums, *(const int *)(base + k->offset)), out);
        break;
    case MT_T_FLOAT_LIST: {
        const double *v = (const double *)(base + k->offset);
        int n = *(const int *)(base + k->count_offset);
        fputc('[', out);
        for (int i = 0; i < n; i++) {
            fmt_double(v[i], buf, sizeof buf);
            fprintf(out, "%s%s", i ? ", " : "", buf);
        }
        fputc(']', out);
        break;
    }
    case MT_T_STRING_LIST: {
        const char (*v)[MT_PATH_MAX] = (const char (*)[MT_PATH_MAX])(base + k->offset);
        int n = *(const int *)(base + k->count_offset);
        fputc('[', out);
        for (int i = 0; i < n; i++) {
            fputs(i ? ", " : "", out);
            write_string(out, v[i]);
        }
        fputc(']', out);
        break;
    }
    }
}

/* Keys that AutoModel does not have (or spells elsewhere, or takes only
 * under another strategy) go to the `meshtrain:` section, by their full
 * path, so that AutoModel reads the file back and so does meshtrain. */
static bool meshtrain_only(const mt_config_t *cfg, const char *p)
{
    static const char *const own[] = {
        "dataset.", "logging.", "training.", "checkpoint.resume", "checkpoint.keep_last_n",
        "checkpoint.save_initial", "distributed.timeout_s", "distributed.device",
        "distributed.collectives", "distributed.pipeline.balanced_split",
        "optimizer.decay_every_parameter", "optimizer.max_grad_norm", "model.architecture"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (strncmp(p, own[i], strlen(own[i])) == 0)
            return true;
    mt_strategy_t st = cfg->distributed.strategy;
    if (strcmp(p, "distributed.ddp_bucket_cap_mb") == 0)
        return true; /* AutoModel's bucket_cap_mb, written for ddp below */
    if (st != MT_STRATEGY_MEGATRON_FSDP &&
        (strcmp(p, "distributed.zero_dp_strategy") == 0 ||
         strcmp(p, "distributed.overlap_grad_reduce") == 0 ||
         strcmp(p, "distributed.overlap_param_gather") == 0))
        return true;
    if (st != MT_STRATEGY_FSDP2 && (strcmp(p, "distributed.defer_fsdp_grad_sync") == 0 ||
                                    strcmp(p, "distributed.reshard_after_forward") == 0))
        return true;
    return false;
}

/* torch's schedule class names, which AutoModel passes to torch */
static const char *torch_schedule(mt_pp_schedule_t s)
{
    switch (s) {
    case MT_PP_1F1B: return "1F1B";
    case MT_PP_GPIPE: return "GPipe";
    case MT_PP_INTERLEAVED_1F1B: return "Interleaved1F1B";
    case MT_PP_LOOPED_BFS: return "LoopedBFS";
    case MT_PP_V_SCHEDULE: return "ZBVZeroBubble";
    default: return NULL; /* dfs, zero_bubble: meshtrain's names */
    }
}

static void write_key(FILE *out, const mt_config_t *cfg, const mt_cfg_key_t *k, const char *name,
                      int indent)
{
    fprintf(out, "%*s%s: ", indent, "", name);
    const char *ts = strcmp(k->path, "distributed.pipeline.pp_schedule") == 0
                         ? torch_schedule(cfg->distributed.pipeline.pp_schedule)
                         : NULL;
    if (ts)
        fputs(ts, out);
    else if (strcmp(k->path, "step_scheduler.max_steps") == 0 && cfg->automodel.max_steps_null)
        fputs("null", out);
    else if (strcmp(k->path, "distributed.pipeline.round_virtual_stages_to_pp_multiple") == 0 &&
             cfg->distributed.pipeline.round_virtual_stages == 0)
        fputs("null", out);
    else
        write_value(out, cfg, k);
    fputc('\n', out);
}

static const char *optimizer_target(const mt_config_t *cfg)
{
    switch (cfg->automodel.optimizer) {
    case MT_AM_OPT_ADAM: return "torch.optim.Adam";
    case MT_AM_OPT_FUSED_ADAM: return "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam";
    default: return "torch.optim.AdamW";
    }
}

/* Keys directly in section `sec`, then its subsections, indented. */
static void write_section(FILE *out, const mt_config_t *cfg, const char *sec, int indent)
{
    size_t sl = strlen(sec);
    const char *leaf = strrchr(sec, '.');
    fprintf(out, "%*s%s:\n", indent, "", leaf ? leaf + 1 : sec);
    if (strcmp(sec, "optimizer") == 0)
        fprintf(out, "%*s_target_: %s\n", indent + 2, "", optimizer_target(cfg));
    if (strcmp(sec, "step_scheduler") == 0 && cfg->automodel.num_epochs > 0)
        fprintf(out, "%*snum_epochs: %lld\n", indent + 2, "",
                (long long)cfg->automodel.num_epochs);
    if (strcmp(sec, "distributed") == 0 && cfg->distributed.strategy == MT_STRATEGY_DDP) {
        char buf[64];
        fmt_double(cfg->distributed.ddp_bucket_cap_mb, buf, sizeof buf);
        fprintf(out, "%*sbucket_cap_mb: %s\n", indent + 2, "", buf);
    }
    for (int i = 0; i < mt_cfg_nkeys; i++) {
        const char *p = mt_cfg_keys[i].path;
        if (strncmp(p, sec, sl) != 0 || p[sl] != '.' || strchr(p + sl + 1, '.') ||
            meshtrain_only(cfg, p))
            continue;
        write_key(out, cfg, &mt_cfg_keys[i], p + sl + 1, indent + 2);
    }
    for (int i = 0; i < mt_cfg_nsections; i++) {
        const char *p = mt_cfg_sections[i].path;
        if (strncmp(p, sec, sl) == 0 && p[sl] == '.' && !strchr(p + sl + 1, '.'))
            write_section(out, cfg, p, indent + 2);
    }
}

static bool section_empty(const mt_config_t *cfg, const char *sec)
{
    size_t sl = strlen(sec);
    for (int i = 0; i < mt_cfg_nkeys; i++)
        if (strncmp(mt_cfg_keys[i].path, sec, sl) == 0 && mt_cfg_keys[i].path[sl] == '.' &&
            !meshtrain_only(cfg, mt_cfg_keys[i].path))
            return false;
    return true;
}

void mt_config_write_yaml(const mt_config_t *cfg, FILE *out)
{
    if (cfg->automodel.recipe) /* AutoModel's defaults on reading back, as on reading */
        fputs("recipe: TrainFinetuneRecipeForNextTokenPrediction\n", out);
    for (int i = 0; i < mt_cfg_nsections; i++) /* peft: only where it is on (present means on) */
        if (!strchr(mt_cfg_sections[i].path, '.') && !section_empty(cfg, mt_cfg_sections[i].path) &&
            (strcmp(mt_cfg_sections[i].path, "peft") != 0 || cfg->peft.enabled))
            write_section(out, cfg, mt_cfg_sections[i].path, 0);
    char buf[64];
    fmt_double((double)cfg->distributed.timeout_s / 60.0, buf, sizeof buf);
    fprintf(out, "dist_env:\n  timeout_minutes: %s\n", buf);
    fmt_double(cfg->optimizer.max_grad_norm, buf, sizeof buf);
    fprintf(out, "clip_grad_norm:\n  max_norm: %s\n", buf);
    fputs("meshtrain:\n", out);
    for (int i = 0; i < mt_cfg_nkeys; i++) {
        const char *p = mt_cfg_keys[i].path;
        /* written above in AutoModel's spelling */
        if (strcmp(p, "distributed.timeout_s") == 0 || strcmp(p, "optimizer.max_grad_norm") == 0 ||
            (strcmp(p, "distributed.ddp_bucket_cap_mb") == 0 &&
             cfg->distributed.strategy == MT_STRATEGY_DDP))
            continue;
        if (meshtrain_only(cfg, p))
            write_key(out, cfg, &mt_cfg_keys[i], p, 2);
    }
    if (cfg->validated) {
        const mt_derived_t *d = &cfg->derived;
        fprintf(out,
                "# derived: world_size=%lld dp_size=%lld dp_replicate=%lld dp_shard=%lld "
                "ep_shard=%lld grad_accum_steps=%lld\n"
                "# derived: seq_len=%lld padded_vocab=%lld head_dim=%lld stages=%lld "
                "stages_per_rank=%lld microbatches=%lld nodes=%lld\n",
                (long long)d->world_size, (long long)d->dp_size, (long long)d->dp_replicate,
                (long long)d->dp_shard, (long long)d->ep_shard, (long long)d->grad_accum_steps,
                (long long)d->seq_len, (long long)d->padded_vocab, (long long)d->head_dim,
                (long long)d->num_stages, (long long)d->stages_per_rank,
                (long long)d->num_microbatches, (long long)d->num_nodes);
    }
}

size_t mt_config_to_yaml(const mt_config_t *cfg, char *buf, size_t cap)
{
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    if (!f)
        return 0;
    mt_config_write_yaml(cfg, f);
    fclose(f);
    if (buf && cap > 0) {
        size_t n = len < cap - 1 ? len : cap - 1;
        memcpy(buf, mem, n);
        buf[n] = '\0';
    }
    free(mem);
    return len;
}

static void write_md_cell(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputc('\\', out);
        fputc(*s, out);
    }
}

void mt_config_write_reference(FILE *out)
{
    mt_config_t defaults;
    mt_config_init(&defaults);
    fputs("# Configuration reference\n\n"
          "<!-- Generated by `meshtrain-plan --config-reference` from src/config/config_schema.c; "
          "`make check` fails when this file differs. -->\n\n"
          "A config is one YAML document with the sections below. Field names follow NeMo "
          "AutoModel recipes and Hugging Face `config.json`. Unknown keys, duplicate keys and "
          "wrongly typed values are errors that name the file, line, column and full key path. "
          "`_target_` keys (AutoModel's class selectors) are accepted anywhere and ignored. "
          "Nullable integers accept `none`, `null` or `~`. Any key can be overridden on the "
          "command line after `--config FILE` as `section.key=value`, e.g. "
          "`distributed.tp_size=2` or `optimizer.betas=[0.9,0.95]`.\n\n"
          "Cross-key rules (divisibility, strategy limits, topology) are listed with the keys "
          "they concern; see doc/validation.md for the full list and doc/mesh.md for the mesh "
          "layout.\n",
          out);
    for (int s = 0; s < mt_cfg_nsections; s++) {
        const char *sec = mt_cfg_sections[s].path;
        size_t sl = strlen(sec);
        fprintf(out, "\n## `%s`\n\n%s\n\n| key | type | default | meaning and rule |\n"
                     "|---|---|---|---|\n", sec, mt_cfg_sections[s].doc);
        for (int i = 0; i < mt_cfg_nkeys; i++) {
            const mt_cfg_key_t *k = &mt_cfg_keys[i];
            if (strncmp(k->path, sec, sl) != 0 || k->path[sl] != '.' || strchr(k->path + sl + 1, '.'))
                continue;
            fprintf(out, "| `%s` | ", k->path + sl + 1);
            if (k->type == MT_T_ENUM) {
                fputs("one of ", out);
                int first = 1;
                for (const mt_cfg_enum_t *e = k->enums; e->name; e++) {
                    if (e->alias)
                        continue;
                    fprintf(out, "%s`%s`", first ? "" : ", ", e->name);
                    first = 0;
                }
            } else {
                bool integer = k->type == MT_T_INT || k->type == MT_T_OPT_INT;
                fputs(integer ? "integer" : mt_cfg_type_name(k), out);
                if (integer && k->max != INT64_MAX)
                    fprintf(out, " in [%lld, %lld]", (long long)k->min, (long long)k->max);
                else if (integer)
                    fprintf(out, " >= %lld", (long long)k->min);
                if (k->type == MT_T_OPT_INT)
                    fputs(", or none", out);
            }
            fputs(" | `", out);
            write_value(out, &defaults, k);
            fputs("` | ", out);
            write_md_cell(out, k->doc);
            fputs(" |\n", out);
        }
    }
}
