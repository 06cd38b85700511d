/* test_st_hostile: Hugging Face inputs a hostile file could carry.  A
 * Qwen3-MoE config.json with a huge num_hidden_layers or sizes whose
 * products overflow int64 is refused naming the key, at once (it looped
 * over the layers before anything bounded them).  An
 * overlap hidden behind a zero-length tensor is refused naming both
 * tensors; an 8-dimensional shape of int64 extremes formats in full into
 * a MT_HF_SHAPE_TEXT_CAP buffer and marks a cut in a smaller one, never
 * writing past either (canaries checked).  No MPI. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hf_internal.h"
#include "mt_test.h"
#include "mt_config.h"

/* Write the header JSON `json` plus `data` zero bytes to a temp file and
 * read its header back: the status, with the error in mt_error_message. */
static mt_status_t read_json_header(const char *json, size_t data)
{
    char path[] = "/tmp/test_st_hostile_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    CHECK(f != NULL, "temp file");
    if (!f)
        return MT_ERR_IO;
    uint64_t n = strlen(json);
    unsigned char len8[8];
    for (int k = 0; k < 8; k++)
        len8[k] = (unsigned char)(n >> (8 * k));
    fwrite(len8, 1, 8, f);
    fwrite(json, 1, n, f);
    for (size_t i = 0; i < data; i++)
        fputc(0, f);
    fclose(f);
    mt_st_file_t st;
    mt_status_t s = mt_st_read_header(path, &st);
    if (s == MT_OK)
        mt_st_file_free(&st);
    remove(path);
    return s;
}

static void test_overlap(void)
{
    /* a [0,400) and b [200,240) overlap; z [100,100) sorts between them */
    mt_status_t s = read_json_header(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]},"
        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[100,100]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[10],\"data_offsets\":[200,240]}}",
        400);
    CHECK(s == MT_ERR_IO, "overlap behind a zero-length tensor refused");
    CHECK_CONTAINS(mt_error_message(), "tensors a and b overlap (data_offsets)");
    /* a long tensor covering two later ones, the overlap two entries on */
    s = read_json_header(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]},"
        "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[300,304]}}",
        400);
    CHECK(s == MT_ERR_IO, "overlap with a tensor two back refused");
    CHECK_CONTAINS(mt_error_message(), "overlap (data_offsets)");
    /* adjacent tensors and zero-length ones anywhere are fine */
    s = read_json_header(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[50],\"data_offsets\":[0,200]},"
        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[100,100]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[50],\"data_offsets\":[200,400]}}",
        400);
    CHECK(s == MT_OK, "adjacent tensors accepted: %s", mt_error_message());
}

static void test_shape_text(void)
{
    int64_t shape[MT_ST_MAX_DIMS];
    for (int d = 0; d < MT_ST_MAX_DIMS; d++)
        shape[d] = d == 3 ? 0 : INT64_MAX;
    char buf[MT_HF_SHAPE_TEXT_CAP + 16];
    memset(buf, 'Z', sizeof buf);
    mt_hf_shape_text(MT_ST_MAX_DIMS, shape, buf, MT_HF_SHAPE_TEXT_CAP);
    CHECK(strncmp(buf, "[9223372036854775807, 9223372036854775807, 9223372036854775807, 0, ", 67)
              == 0 && strlen(buf) < MT_HF_SHAPE_TEXT_CAP && buf[strlen(buf) - 1] == ']' &&
              !strstr(buf, "..."),
          "full 8-dim shape: %s", buf);
    for (size_t i = MT_HF_SHAPE_TEXT_CAP; i < sizeof buf; i++)
        CHECK(buf[i] == 'Z', "canary %zu intact", i);
    /* a 40-byte buffer: cut, marked, terminated, nothing past it */
    char small[40 + 16];
    memset(small, 'Z', sizeof small);
    mt_hf_shape_text(MT_ST_MAX_DIMS, shape, small, 40);
    CHECK(strlen(small) < 40 && strcmp(small + strlen(small) - 4, "...]") == 0, "cut shape: %s",
          small);
    for (size_t i = 40; i < sizeof small; i++)
        CHECK(small[i] == 'Z', "small canary %zu intact", i);
    /* the check's message, with an 8-dim shape holding a 0 */
    mt_st_entry_t e = {.name = "w", .dtype = MT_ST_F32, .ndim = MT_ST_MAX_DIMS};
    memcpy(e.shape, shape, sizeof shape);
    int64_t want[2] = {4, 4};
    CHECK(mt_hf_check_shape("m.safetensors", &e, 2, want, "expected", "") == MT_ERR_IO,
          "shape mismatch refused");
    CHECK_CONTAINS(mt_error_message(), "tensor w has shape [9223372036854775807, ");
    CHECK_CONTAINS(mt_error_message(), "expected [4, 4]");
    CHECK(read_json_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2,2,2,2,2,2,0],"
                           "\"data_offsets\":[0,0]}}", 0) == MT_OK,
          "8-dim shape with a 0 reads: %s", mt_error_message());
}

/* A Qwen3-MoE config.json with one integer field replaced by `value`. */
static mt_status_t moe_config(const char *key, const char *value)
{
    char text[2048];
    snprintf(text, sizeof text,
             "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", "
             "\"vocab_size\": %s, \"hidden_size\": %s, \"intermediate_size\": 128, "
             "\"num_hidden_layers\": %s, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 2, \"head_dim\": 16, \"num_experts\": 4, "
             "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
             "\"mlp_only_layers\": [0], \"decoder_sparse_step\": 1}",
             strcmp(key, "vocab_size") == 0 ? value : "256",
             strcmp(key, "hidden_size") == 0 ? value : "64",
             strcmp(key, "num_hidden_layers") == 0 ? value : "2");
    json_t *j = NULL;
    mt_status_t s = mt_hf_json_parse(text, strlen(text), "config.json", &j);
    CHECK(s == MT_OK, "parse: %s", s == MT_OK ? "" : mt_error_message());
    if (s != MT_OK)
        return s;
    mt_config_t cfg;
    mt_config_init(&cfg);
    s = mt_hf_config_to_model(j, "config.json", &cfg.model, NULL);
    json_decref(j);
    return s;
}

static void test_config_bounds(void)
{
    mt_status_t s = moe_config("", "");
    CHECK(s == MT_OK, "plain MoE config: %s", s == MT_OK ? "" : mt_error_message());
    s = moe_config("num_hidden_layers", "4611686018427387904");
    CHECK(s == MT_ERR_IO, "2^62 layers refused (and no hang)");
    CHECK_CONTAINS(mt_error_message(),
                   "config.json: \"num_hidden_layers\": 4611686018427387904 is more than "
                   "meshtrain accepts (at most 65536)");
    s = moe_config("vocab_size", "4611686018427387904");
    CHECK(s == MT_ERR_IO, "vocab_size 2^62 refused");
    CHECK_CONTAINS(mt_error_message(), "\"vocab_size\": 4611686018427387904 is more than");
    s = moe_config("hidden_size", "4611686018427387904");
    CHECK(s == MT_ERR_IO, "hidden_size 2^62 refused");
    CHECK_CONTAINS(mt_error_message(), "\"hidden_size\"");
}

int main(void)
{
    test_config_bounds();
    test_overlap();
    test_shape_text();
    return mt_test_exit("test_st_hostile");
}
