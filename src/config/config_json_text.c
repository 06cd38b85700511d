/* config_json_text.c: JSON text written into a fixed buffer, for the
 * model.config block the YAML parser hands to the hf layer as text (the
 * config layer links no JSON library). */
#include "config_internal.h"

#include <stdio.h>
#include <string.h>

void mt_jout_put(mt_jout_t *o, const char *s, size_t n)
{
    if (o->full || o->len + n >= o->cap) {
        o->full = true;
        return;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
}

void mt_jout_puts(mt_jout_t *o, const char *s) { mt_jout_put(o, s, strlen(s)); }

void mt_jout_string(mt_jout_t *o, const char *s)
{
    mt_jout_puts(o, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        char esc[8];
        if (ch == '"' || ch == '\\') {
            esc[0] = '\\', esc[1] = (char)ch, esc[2] = '\0';
            mt_jout_puts(o, esc);
        } else if (ch < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", ch);
            mt_jout_puts(o, esc);
        } else {
            mt_jout_put(o, s, 1);
        }
    }
    mt_jout_puts(o, "\"");
}
