/* test_config_parse: YAML and override parsing, before validation.
 * Defaults, strict types, unknown and duplicate keys with suggestions,
 * malformed YAML, locations in messages, overrides, and the round trip of
 * the resolved config through YAML.  No MPI. */
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "mt_config.h"
#include "mt_test.h"

static mt_config_t cfg;

static mt_status_t load(const char *yaml)
{
    mt_config_init(&cfg);
    return mt_config_load_string(&cfg, yaml, "t.yaml");
}

static void expect_load_error(const char *yaml, const char *n1, const char *n2)
{
    mt_status_t s = load(yaml);
    CHECK(s == MT_ERR_CONFIG, "expected a config error for:\n%s", yaml);
    if (s != MT_OK) {
        CHECK_CONTAINS(mt_error_message(), n1);
        if (n2)
            CHECK_CONTAINS(mt_error_message(), n2);
    }
}

static void expect_override_error(const char *ov, const char *n1, const char *n2)
{
    mt_config_init(&cfg);
    mt_status_t s = mt_config_override(&cfg, ov);
    CHECK(s == MT_ERR_CONFIG, "expected an override error for %s", ov);
    if (s != MT_OK) {
        CHECK_CONTAINS(mt_error_message(), n1);
        if (n2)
            CHECK_CONTAINS(mt_error_message(), n2);
    }
}

static void test_defaults(void)
{
    /* Every schema default must parse through the same code as a file. */
    for (int i = 0; i < mt_cfg_nkeys; i++) {
        mt_config_t c;
        memset(&c, 0, sizeof c);
        mt_status_t s = mt_cfg_set_default(&c, &mt_cfg_keys[i]);
        CHECK(s == MT_OK, "default of %s does not parse: %s", mt_cfg_keys[i].path,
              mt_error_message());
    }
    CHECK(load("") == MT_OK, "empty file: %s", mt_error_message());
    CHECK(cfg.distributed.strategy == MT_STRATEGY_FSDP2, "default strategy");
    CHECK(!cfg.distributed.dp_size.set, "dp_size defaults to none");
    CHECK(cfg.distributed.tp_size == 1 && cfg.distributed.pp_size == 1, "default sizes");
    CHECK(cfg.optimizer.nbetas == 2 && cfg.optimizer.betas[0] == 0.9 &&
              cfg.optimizer.betas[1] == 0.95, "default betas");
    CHECK(cfg.distributed.pipeline.pp_schedule == MT_PP_1F1B, "default schedule");
    CHECK(strcmp(cfg.checkpoint.resume, "auto") == 0, "default resume");
    CHECK(cfg.dataset.path[0] == '\0', "default dataset path is empty");
    CHECK(cfg.distributed.defer_fsdp_grad_sync, "defer_fsdp_grad_sync defaults to true");
}

static void test_values(void)
{
    const char *y = "model:\n"
                    "  hidden_size: 256\n"
                    "  rms_norm_eps: 1.0e-5\n"
                    "  tie_word_embeddings: yes\n"
                    "  num_key_value_heads: ~\n"
                    "distributed:\n"
                    "  _target_: nemo_automodel.FSDP2Manager\n"
                    "  strategy: megatron_fsdp\n"
                    "  dp_size: none\n"
                    "  dp_replicate_size: 2\n"
                    "  pipeline:\n"
                    "    pp_schedule: interleaved1f1b\n"
                    "    layers_per_stage: null\n"
                    "  mp_policy:\n"
                    "    param_dtype: bf16\n"
                    "optimizer:\n"
                    "  betas: [0.8, 0.99]\n"
                    "dataset:\n"
                    "  path: \"/data/my tokens.bin\"\n"
                    "checkpoint:\n"
                    "  resume: null\n";
    CHECK(load(y) == MT_OK, "valid values: %s", mt_error_message());
    CHECK(cfg.model.hidden_size == 256, "int");
    CHECK(cfg.model.rms_norm_eps == 1.0e-5, "float");
    CHECK(cfg.model.tie_word_embeddings, "yes is true");
    CHECK(!cfg.model.num_key_value_heads.set, "~ is none");
    CHECK(cfg.distributed.strategy == MT_STRATEGY_MEGATRON_FSDP, "enum");
    CHECK(cfg.distributed.dp_replicate_size.set && cfg.distributed.dp_replicate_size.value == 2,
          "nullable int set");
    CHECK(cfg.distributed.pipeline.pp_schedule == MT_PP_INTERLEAVED_1F1B, "alias interleaved1f1b");
    CHECK(cfg.distributed.mp_policy.param_dtype == MT_DTYPE_BFLOAT16, "dtype alias bf16");
    CHECK(cfg.optimizer.betas[0] == 0.8 && cfg.optimizer.betas[1] == 0.99, "list");
    CHECK(strcmp(cfg.dataset.path, "/data/my tokens.bin") == 0, "quoted string");
    CHECK(cfg.checkpoint.resume[0] == '\0', "null string is empty");
    /* Locations are recorded for keys set in the file. */
    int ki = mt_cfg_key_index("model.hidden_size");
    CHECK(cfg.key_origin[ki].kind == MT_ORIGIN_FILE && cfg.key_origin[ki].line == 2 &&
              cfg.key_origin[ki].column == 16, "origin of model.hidden_size: %d:%d",
          cfg.key_origin[ki].line, cfg.key_origin[ki].column);
    int si = mt_cfg_section_index("distributed.pipeline");
    CHECK(cfg.section_origin[si].kind == MT_ORIGIN_FILE, "pipeline block present");
    si = mt_cfg_section_index("distributed.moe");
    CHECK(cfg.section_origin[si].kind == MT_ORIGIN_DEFAULT, "moe block absent");
    CHECK(load("distributed:\n  pipeline: null\n") == MT_OK, "null block");
    si = mt_cfg_section_index("distributed.pipeline");
    CHECK(cfg.section_origin[si].kind == MT_ORIGIN_DEFAULT, "a null block is absent");
}

static void test_unknown_and_duplicate(void)
{
    expect_load_error("distributed:\n  tp_sze: 2\n", "t.yaml:2:3: distributed.tp_sze: unknown key",
                      "did you mean tp_size?");
    expect_load_error("modle:\n  hidden_size: 8\n", "t.yaml:1:1: modle: unknown key",
                      "did you mean model?");
    expect_load_error("model:\n  tp_size: 2\n", "model.tp_size: unknown key",
                      "did you mean distributed.tp_size?");
    expect_load_error("distributed:\n  pipeline:\n    pp_schedul: gpipe\n",
                      "t.yaml:3:5: distributed.pipeline.pp_schedul: unknown key",
                      "did you mean pp_schedule?");
    expect_load_error("model:\n  completely_unrelated_name: 1\n",
                      "model.completely_unrelated_name: unknown key in section 'model'", NULL);
    expect_load_error("distributed:\n  tp_size: 2\n  pp_size: 1\n  tp_size: 4\n",
                      "t.yaml:4:3: distributed.tp_size: duplicate key", "first defined at line 2");
    expect_load_error("model:\n  hidden_size: 8\nmodel:\n  hidden_size: 16\n",
                      "t.yaml:3:1: model: duplicate key", "line 1");
}

static void test_types(void)
{
    expect_load_error("distributed:\n  tp_size: two\n",
                      "t.yaml:2:12: distributed.tp_size: expected an integer, got 'two'", NULL);
    expect_load_error("distributed:\n  tp_size: \"4\"\n",
                      "distributed.tp_size: expected an integer", "the quoted string \"4\"");
    expect_load_error("distributed:\n  tp_size: 2.5\n", "expected an integer, got '2.5'", NULL);
    /* AutoModel's null for a size is its default; elsewhere null is no integer */
    CHECK(load("distributed:\n  tp_size:\n") == MT_OK && cfg.distributed.tp_size == 1,
          "tp_size: null is the default: %s", mt_error_message());
    expect_load_error("step_scheduler:\n  global_batch_size:\n",
                      "step_scheduler.global_batch_size: expected an integer", "got null");
    expect_load_error("distributed:\n  dp_size: many\n", "expected an integer or none", NULL);
    expect_load_error("distributed:\n  sequence_parallel: maybe\n",
                      "distributed.sequence_parallel: expected true or false, got 'maybe'", NULL);
    expect_load_error("optimizer:\n  lr: fast\n", "optimizer.lr: expected a number, got 'fast'",
                      NULL);
    expect_load_error("optimizer:\n  lr: 0x10\n", "optimizer.lr: expected a number", NULL);
    expect_load_error("optimizer:\n  betas: [0.9]\n",
                      "optimizer.betas: expected a list of 2 numbers, got 1", NULL);
    expect_load_error("optimizer:\n  betas: 0.9\n", "optimizer.betas: expected a list of 2 numbers",
                      NULL);
    expect_load_error("optimizer:\n  betas: [0.9, x]\n", "optimizer.betas[1]: expected a number",
                      NULL);
    expect_load_error("distributed: 4\n", "distributed: expected a mapping (a section), got '4'",
                      NULL);
    expect_load_error("model:\n  hidden_size: [1, 2]\n",
                      "model.hidden_size: expected an integer, got a list", NULL);
    expect_load_error("distributed:\n  strategy: fsdp\n", "distributed.strategy: expected one of",
                      "did you mean fsdp2?");
    expect_load_error("dataset:\n  path: {a: 1}\n", "dataset.path: expected a string, got a mapping",
                      NULL);
    expect_load_error("- a\n- b\n", "the top level must be a mapping", NULL);
}

static void test_malformed(void)
{
    expect_load_error("model:\n  hidden_size: 8\n   bad_indent: 1\n", "t.yaml:3:", "malformed YAML");
    expect_load_error("model: [1, 2\n", "malformed YAML", NULL);
    expect_load_error("model:\n  hidden_size: 8\n---\nmodel:\n  hidden_size: 9\n",
                      "a second YAML document", NULL);
    /* All problems of a file are reported together. */
    mt_status_t s = load("distributed:\n  tp_size: x\n  pp_sze: 1\nmodel:\n  hidden_size: y\n");
    CHECK(s == MT_ERR_CONFIG, "several errors");
    CHECK_CONTAINS(mt_error_message(), "distributed.tp_size");
    CHECK_CONTAINS(mt_error_message(), "distributed.pp_sze");
    CHECK_CONTAINS(mt_error_message(), "model.hidden_size");
    mt_config_init(&cfg);
    s = mt_config_load_file(&cfg, "/nonexistent/meshtrain.yaml");
    CHECK(s == MT_ERR_CONFIG, "missing file");
    CHECK_CONTAINS(mt_error_message(), "/nonexistent/meshtrain.yaml: cannot open the config file");
}

static void test_overrides(void)
{
    mt_config_init(&cfg);
    CHECK(mt_config_override(&cfg, "distributed.tp_size=2") == MT_OK, "%s", mt_error_message());
    CHECK(cfg.distributed.tp_size == 2, "int override");
    CHECK(mt_config_override(&cfg, "optimizer.betas=[0.5,0.6]") == MT_OK, "%s", mt_error_message());
    CHECK(cfg.optimizer.betas[0] == 0.5 && cfg.optimizer.betas[1] == 0.6, "list override");
    CHECK(mt_config_override(&cfg, "distributed.dp_size=none") == MT_OK, "%s", mt_error_message());
    CHECK(!cfg.distributed.dp_size.set, "none override");
    CHECK(mt_config_override(&cfg, "dataset.path=/x/y.bin") == MT_OK, "%s", mt_error_message());
    CHECK(strcmp(cfg.dataset.path, "/x/y.bin") == 0, "string override");
    CHECK(mt_config_override(&cfg, "distributed.pipeline.pp_schedule=gpipe") == MT_OK, "%s",
          mt_error_message());
    int si = mt_cfg_section_index("distributed.pipeline");
    CHECK(cfg.section_origin[si].kind == MT_ORIGIN_OVERRIDE, "override makes the block present");
    int ki = mt_cfg_key_index("distributed.tp_size");
    CHECK(cfg.key_origin[ki].kind == MT_ORIGIN_OVERRIDE, "override origin");

    expect_override_error("distributed.tp_sze=2", "distributed.tp_sze: unknown key",
                          "did you mean tp_size?");
    expect_override_error("distributd.tp_size=2", "unknown section 'distributd'",
                          "did you mean distributed?");
    expect_override_error("distributed.tp_size=abc", "override 'distributed.tp_size=abc'",
                          "expected an integer, got 'abc'");
    expect_override_error("distributed=4", "distributed is a section", NULL);
    expect_override_error("tp_size", "expected section.key=value", NULL);
    expect_override_error("=3", "expected section.key=value", NULL);
    expect_override_error("distributed.sequence_parallel=[1", "cannot parse the value", NULL);
}

static void test_round_trip(void)
{
    const char *path = getenv("abs_top_srcdir");
    char file[4096];
    snprintf(file, sizeof file, "%s/share/configs/llama3-70b-tp8-pp4.yaml", path ? path : ".");
    mt_config_t a, b;
    mt_config_init(&a);
    CHECK(mt_config_load_file(&a, file) == MT_OK, "%s", mt_error_message());
    CHECK(mt_config_override(&a, "optimizer.lr=1.2345678901234e-4") == MT_OK, "%s", mt_error_message());
    CHECK(mt_config_override(&a, "dataset.path=a \"quoted\" \\ path") == MT_OK, "%s", mt_error_message());
    CHECK(mt_config_validate(&a, MT_APP_DENSE, 64, NULL, NULL) == MT_OK, "%s", mt_error_message());
    char *text = malloc(1 << 16);
    mt_config_to_yaml(&a, text, 1 << 16);
    mt_config_init(&b);
    CHECK(mt_config_load_string(&b, text, "resolved") == MT_OK, "resolved config reads back: %s\n%s",
          mt_error_message(), text);
    CHECK(mt_config_validate(&b, MT_APP_DENSE, 64, NULL, NULL) == MT_OK, "%s", mt_error_message());
#define SAME(section) CHECK(memcmp(&a.section, &b.section, sizeof a.section) == 0, #section " differs after round trip")
    SAME(model);
    SAME(dataset);
    SAME(packed_sequence);
    SAME(step_scheduler);
    SAME(distributed);
    SAME(optimizer);
    SAME(lr_scheduler);
    SAME(checkpoint);
    SAME(logging);
    SAME(rng);
    SAME(derived);
#undef SAME
    CHECK(strstr(text, "# derived: world_size=64 dp_size=2") != NULL, "derived comment:\n%s", text);
    free(text);
}

static void test_edit_distance(void)
{
    CHECK(mt_edit_distance("tp_size", "tp_size") == 0, "same");
    CHECK(mt_edit_distance("tp_sze", "tp_size") == 1, "deletion");
    CHECK(mt_edit_distance("kitten", "sitting") == 3, "classic");
    const char *names[] = {"pp_size", "tp_size", "cp_size"};
    CHECK(mt_closest_name("zzzzzzzz", names, 3) == NULL, "no far-fetched suggestion");
}

/* The schedule layer names its schedules; the config layer parses names:
 * each canonical name must parse back to its schedule. */
static void test_schedule_names(void)
{
    for (int s = 0; s < MT_PP_NUM_SCHEDULES; s++) {
        char yaml[200];
        snprintf(yaml, sizeof yaml, "distributed:\n  pipeline:\n    pp_schedule: %s\n",
                 mt_pp_schedule_name((mt_pp_schedule_t)s));
        CHECK(load(yaml) == MT_OK && cfg.distributed.pipeline.pp_schedule == (mt_pp_schedule_t)s,
              "schedule %d's name %s parses back", s, mt_pp_schedule_name((mt_pp_schedule_t)s));
    }
}

int main(void)
{
    test_defaults();
    test_values();
    test_unknown_and_duplicate();
    test_types();
    test_malformed();
    test_overrides();
    test_round_trip();
    test_edit_distance();
    test_schedule_names();
    return mt_test_exit("test_config_parse");
}
