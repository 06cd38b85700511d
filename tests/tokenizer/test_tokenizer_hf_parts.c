/* test_tokenizer_hf_parts.c: the pieces of the Hugging Face pipeline on
 * their own: each normalizer, the five split behaviours (the Rust
 * library's documented "the-final--countdown" example), each
 * pre-tokenizer, and the repair of invalid UTF-8 (one U+FFFD per maximal
 * invalid subsequence, as the WHATWG TextDecoder). */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer_hf.h"
#include "mt_test.h"

static json_t *js(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fprintf(stderr, "bad test JSON: %s: %s\n", text, e.text);
    return j;
}

/* Normalize in with the normalizer given as JSON; compare with want. */
static void norm(const char *spec, const char *in, const char *want)
{
    json_t *j = js(spec);
    hf_norm *n = NULL;
    hf_scratch sc = {0};
    hf_buf out = {0};
    CHECK(j && hf_norm_parse(j, "t.json", &n) == MT_OK, "%s: %s", spec, mt_error_message());
    if (n) {
        CHECK(hf_norm_apply(n, in, strlen(in), &sc, &out) == MT_OK, "apply %s", spec);
        CHECK(out.s && strcmp(out.s, want) == 0, "%s on \"%s\": \"%s\", want \"%s\"", spec, in,
              out.s ? out.s : "(null)", want);
    }
    hf_norm_free(n);
    hf_buf_free(&out);
    hf_scratch_free(&sc);
    json_decref(j);
}

/* Pre-tokenize in; want is the pieces joined by '|'. */
static void pretok(const char *spec, const char *in, bool first, const char *want)
{
    json_t *j = js(spec);
    hf_pretok *p = NULL;
    hf_scratch sc = {0};
    CHECK(j && hf_pretok_parse(j, "t.json", &p) == MT_OK, "%s: %s", spec, mt_error_message());
    if (p) {
        hf_pieces *ps = &sc.a;
        CHECK(hf_pieces_add(ps, in, strlen(in), first) == MT_OK, "add");
        CHECK(hf_pretok_apply(p, &ps, &sc) == MT_OK, "apply %s", spec);
        hf_buf got = {0};
        for (size_t k = 0; k < ps->np; k++) {
            if (k)
                hf_buf_add(&got, "|", 1);
            hf_buf_add(&got, ps->buf.s + ps->p[k].off, ps->p[k].len);
        }
        hf_buf_add(&got, "", 0);
        CHECK(strcmp(got.s, want) == 0, "%s on \"%s\": \"%s\", want \"%s\"", spec, in, got.s,
              want);
        hf_buf_free(&got);
    }
    hf_pretok_free(p);
    hf_scratch_free(&sc);
    json_decref(j);
}

static void split(const char *behavior, bool invert, const char *want)
{
    char spec[256];
    snprintf(spec, sizeof spec,
             "{\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\", "
             "\"invert\": %s}", behavior, invert ? "true" : "false");
    pretok(spec, "the-final--countdown", true, want);
}

static void sanitize(const char *in, size_t n, const char *want)
{
    hf_buf out = {0};
    CHECK(hf_utf8_sanitize(in, n, &out) == MT_OK, "sanitize");
    CHECK(strcmp(out.s, want) == 0, "sanitized to \"%s\", want \"%s\"", out.s, want);
    CHECK(hf_utf8_valid(out.s, out.n), "the result is valid");
    hf_buf_free(&out);
}

#define FFFD "\xEF\xBF\xBD"

int main(void)
{
    norm("{\"type\": \"NFC\"}", "e\xCC\x81 A\xCC\x8A", "\xC3\xA9 \xC3\x85");
    norm("{\"type\": \"NFD\"}", "\xC3\xA9", "e\xCC\x81");
    norm("{\"type\": \"NFKC\"}", "\xEF\xAC\x81 \xE2\x91\xA0 \xEF\xBC\xA1", "fi 1 A");
    norm("{\"type\": \"NFKD\"}", "\xEF\xAC\x81\xC3\xA9", "fie\xCC\x81");
    norm("{\"type\": \"Lowercase\"}", "\xC3\x80" "BC \xC4\xB0 \xCE\xA3", "\xC3\xA0" "bc i\xCC\x87 \xCF\x83");
    norm("{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}",
         "a b  c", "a\xE2\x96\x81" "b\xE2\x96\x81\xE2\x96\x81" "c");
    norm("{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"content\": \" \"}",
         "a \t\n b\xE3\x80\x80" "c", "a b c");
    norm("{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"}", "ab", "\xE2\x96\x81" "ab");
    norm("{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"}", "", "");
    norm("{\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": true}",
         " \t a b \xE3\x80\x80", "a b");
    norm("{\"type\": \"Strip\", \"strip_left\": false, \"strip_right\": true}", "  a  ", "  a");
    norm("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}, {\"type\": "
         "\"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"xy\"}]}", "AbA", "xybxy");

    split("Removed", false, "the|final|countdown");
    split("Isolated", false, "the|-|final|-|-|countdown");
    split("MergedWithPrevious", false, "the-|final-|-|countdown");
    split("MergedWithNext", false, "the|-final|-|-countdown");
    split("Contiguous", false, "the|-|final|--|countdown");
    split("Removed", true, "-|-|-");
    pretok("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, \"behavior\": "
           "\"Isolated\", \"invert\": false}", "ab12345c", true, "ab|123|45|c");
    pretok("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?i:'s|'t)| ?\\\\p{L}+|\\\\s+(?!\\\\S)|\\\\s+\"},"
           " \"behavior\": \"Isolated\", \"invert\": false}", "IT'S  ok  ", true,
           "IT|'S| | ok|  ");

    pretok("{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true}",
           "Hi there\n", true, "\xC4\xA0Hi|\xC4\xA0there|\xC4\x8A");
    pretok("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}",
           "a b\xC3\xA9", true, "a\xC4\xA0" "b\xC3\x83\xC2\xA9");
    const char *ms = "{\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", "
                     "\"prepend_scheme\": \"%s\", \"split\": %s}";
    char spec[256];
    snprintf(spec, sizeof spec, ms, "always", "true");
    pretok(spec, "Hey  friend", true, "\xE2\x96\x81Hey|\xE2\x96\x81|\xE2\x96\x81" "friend");
    snprintf(spec, sizeof spec, ms, "first", "false");
    pretok(spec, "Hey friend", true, "\xE2\x96\x81Hey\xE2\x96\x81" "friend");
    pretok(spec, "Hey", false, "Hey"); /* not at the start of the input */
    snprintf(spec, sizeof spec, ms, "never", "true");
    pretok(spec, "Hey friend", true, "Hey|\xE2\x96\x81" "friend");
    /* Rust's char::is_numeric: every Unicode numeric, not only ASCII */
    pretok("{\"type\": \"Digits\", \"individual_digits\": true}", "a12\xD9\xA3x", true,
           "a|1|2|\xD9\xA3|x");
    pretok("{\"type\": \"Digits\", \"individual_digits\": false}", "a12\xD9\xA3x", true,
           "a|12\xD9\xA3|x");
    pretok("{\"type\": \"Punctuation\", \"behavior\": \"Isolated\"}", "a,b!!\xC2\xBF" "c", true,
           "a|,|b|!|!|\xC2\xBF|c");
    pretok("{\"type\": \"Whitespace\"}", "Hey man!! x_1", true, "Hey|man|!!|x_1");
    pretok("{\"type\": \"WhitespaceSplit\"}", " a  b\tc\xE3\x80\x80" "d ", true, "a|b|c|d");
    pretok("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"WhitespaceSplit\"}, "
           "{\"type\": \"Digits\", \"individual_digits\": true}]}", "ab12 c3", true,
           "ab|1|2|c|3");

    sanitize("ok", 2, "ok");
    sanitize("a\xFF" "b", 3, "a" FFFD "b");
    sanitize("\xE2\x82" "x", 3, FFFD "x");              /* truncated: one */
    sanitize("\xF0\x9F\x98", 3, FFFD);                  /* truncated at the end: one */
    sanitize("\xED\xA0\x80", 3, FFFD FFFD FFFD);        /* a surrogate: each byte */
    sanitize("\xC0\xAF", 2, FFFD FFFD);                 /* overlong */
    sanitize("\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD); /* beyond U+10FFFF */
    sanitize("\x80\xBF\xE2\x82\xAC", 5, FFFD FFFD "\xE2\x82\xAC");
    sanitize("a\0b", 3, "a");                           /* NUL is kept (strcmp stops) */

    /* the ByteLevel table: 256 characters, each mapping back */
    int back = 0;
    for (int b = 0; b < 256; b++)
        back += hf_bytelevel_byte(hf_bytelevel_char((unsigned char)b)) == b;
    CHECK(back == 256, "%d bytes map back", back);
    CHECK(hf_bytelevel_char(' ') == 0x120 && hf_bytelevel_char('\n') == 0x10A, "G-dot, C-dot");
    CHECK(hf_bytelevel_byte('A') == 'A' && hf_bytelevel_byte(0x2581) == -1, "outside the table");

    /* refusals name the file and the type */
    hf_pretok *p = NULL;
    json_t *j = js("{\"type\": \"BertPreTokenizer\"}");
    CHECK(hf_pretok_parse(j, "dir/tokenizer.json", &p) == MT_ERR_UNSUPPORTED && !p, "refused");
    CHECK_CONTAINS(mt_error_message(), "dir/tokenizer.json: pre_tokenizer \"BertPreTokenizer\"");
    json_decref(j);
    hf_norm *n = NULL;
    j = js("{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"\"}");
    CHECK(hf_norm_parse(j, "x.json", &n) == MT_ERR_UNSUPPORTED && !n, "refused");
    CHECK_CONTAINS(mt_error_message(), "x.json: normalizer \"Precompiled\"");
    json_decref(j);
    j = js("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}");
    CHECK(hf_pretok_parse(j, "y.json", &p) == MT_ERR_CONFIG && !p, "bad regex");
    CHECK_CONTAINS(mt_error_message(), "y.json: pre_tokenizer Split: regex /(a/ does not compile");
    json_decref(j);
    j = js("{\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"Sideways\"}");
    CHECK(hf_pretok_parse(j, "y.json", &p) == MT_ERR_CONFIG && !p, "bad behavior");
    CHECK_CONTAINS(mt_error_message(), "unknown behavior \"Sideways\"");
    json_decref(j);
    hf_dec *d = NULL;
    j = js("{\"type\": \"WordPiece\", \"prefix\": \"##\"}");
    CHECK(hf_dec_parse(j, "z.json", &d) == MT_ERR_UNSUPPORTED && !d, "refused");
    CHECK_CONTAINS(mt_error_message(), "z.json: decoder \"WordPiece\"");
    json_decref(j);
    return mt_test_exit("test_tokenizer_hf_parts");
}
