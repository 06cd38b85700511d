/* libFuzzer target: a Hugging Face config.json through the JSON reader and
 * the mapping into the model section. */
#include <stdint.h>
#include <stddef.h>
#include <jansson.h>
#include "hf_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j = NULL;
    if (mt_hf_json_parse((const char *)data, size, "config.json", &j) != MT_OK) return 0;
    mt_config_t cfg;
    mt_config_init(&cfg);
    (void)mt_hf_config_to_model(j, "config.json", &cfg.model, NULL);
    json_decref(j);
    return 0;
}
