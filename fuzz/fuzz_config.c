/* libFuzzer target: YAML config text through the parser and validation,
 * the path every user-supplied --config takes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "mt_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the loader takes NUL-terminated text */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    static mt_config_t cfg;
    mt_config_init(&cfg);
    if (mt_config_load_string(&cfg, text, "fuzz.yaml") == MT_OK)
        (void)mt_config_validate(&cfg, MT_APP_ANY, 8, NULL, NULL);
    free(text);
    return 0;
}
