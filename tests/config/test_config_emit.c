/* test_config_emit: the resolved-config YAML reads back identical when a
 * string holds control characters (newline, tab, CR, \x01, \x1f, DEL),
 * quotes and backslashes: each value is written, read back with
 * mt_config_load_string and compared byte for byte.  No MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_config.h"
#include "mt_test.h"

static void round_trip(const char *value)
{
    mt_config_t cfg, back;
    mt_config_init(&cfg);
    snprintf(cfg.dataset.path, sizeof cfg.dataset.path, "%s", value);
    snprintf(cfg.checkpoint.checkpoint_dir, sizeof cfg.checkpoint.checkpoint_dir, "ck%s", value);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL, "memstream");
    if (!f)
        return;
    mt_config_write_yaml(&cfg, f);
    fclose(f);
    mt_config_init(&back);
    mt_status_t s = mt_config_load_string(&back, text, "emitted.yaml");
    CHECK(s == MT_OK, "read back: %s", s == MT_OK ? "" : mt_error_message());
    if (s == MT_OK) {
        CHECK(strcmp(back.dataset.path, value) == 0, "dataset.path reads back identical "
              "(got %zu bytes, want %zu)", strlen(back.dataset.path), strlen(value));
        CHECK(strcmp(back.checkpoint.checkpoint_dir, cfg.checkpoint.checkpoint_dir) == 0,
              "checkpoint_dir reads back identical");
    }
    /* no raw control character inside the emitted text but newlines */
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)text[i] < 0x20 && text[i] != '\n') {
            CHECK(0, "raw control byte 0x%02x at offset %zu", (unsigned char)text[i], i);
            break;
        }
    free(text);
}

int main(void)
{
    round_trip("data/with\nnewline.bin");
    round_trip("a\x01" "b");
    round_trip("tab\there\rcr\x1f" "unit\x7f" "del");
    round_trip("quote\" back\\slash \\n not a newline");
    round_trip("  leading and trailing spaces  ");
    round_trip("caf\xc3\xa9 UTF-8");
    return mt_test_exit("test_config_emit");
}
