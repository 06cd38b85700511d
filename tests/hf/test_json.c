/* test_json: the strict JSON reader (src/hf/json.c).  Every value type,
 * escapes and UTF-8, integers kept exact, positions of values, lookups,
 * and every kind of malformed text refused with LINE:COL and the reason.
 * Also the safetensors dtype conversions (round to nearest even) and
 * header checks that hf_import relies on.  No MPI. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hf_internal.h"
#include "mt_json.h"
#include "mt_test.h"

static mt_json_t *parse(const char *text)
{
    mt_json_t *v = NULL;
    mt_status_t s = mt_json_parse(text, strlen(text), "t.json", &v);
    CHECK(s == MT_OK, "parse failed: %s\n%s", mt_error_message(), text);
    return v;
}

static void bad(const char *text, const char *where, const char *why)
{
    mt_json_t *v = NULL;
    mt_status_t s = mt_json_parse(text, strlen(text), "t.json", &v);
    CHECK(s == MT_ERR_IO && v == NULL, "expected an error for: %s", text);
    if (s != MT_OK) {
        CHECK_CONTAINS(mt_error_message(), where);
        CHECK_CONTAINS(mt_error_message(), why);
    }
    mt_json_free(v);
}

static void test_values(void)
{
    mt_json_t *v = parse(" {\"a\": 1, \"b\": [true, false, null], \"c\": \"x\",\n"
                         "  \"d\": {\"e\": -2.5e-3, \"f\": []}, \"g\": {}} ");
    if (!v)
        return;
    CHECK(v->type == MT_JSON_OBJECT && v->count == 5, "root");
    CHECK(strcmp(v->keys[0], "a") == 0 && strcmp(v->keys[4], "g") == 0, "keys in text order");
    const mt_json_t *a = mt_json_get(v, "a"), *b = mt_json_get(v, "b"), *d = mt_json_get(v, "d");
    CHECK(a && a->type == MT_JSON_NUMBER && a->is_int && a->integer == 1 && a->number == 1.0,
          "integer");
    CHECK(b && b->type == MT_JSON_ARRAY && b->count == 3, "array");
    if (b && b->count == 3)
        CHECK(b->items[0].type == MT_JSON_BOOL && b->items[0].boolean &&
              b->items[1].type == MT_JSON_BOOL && !b->items[1].boolean &&
              b->items[2].type == MT_JSON_NULL, "true false null");
    const mt_json_t *e = mt_json_get(d, "e");
    CHECK(e && e->type == MT_JSON_NUMBER && !e->is_int && e->number == -2.5e-3, "float");
    CHECK(e && e->line == 2 && e->column == 14, "position of d.e: %d:%d", e ? e->line : 0,
          e ? e->column : 0);
    const mt_json_t *f = mt_json_get(d, "f"), *g = mt_json_get(v, "g");
    CHECK(f && f->type == MT_JSON_ARRAY && f->count == 0, "empty array");
    CHECK(g && g->type == MT_JSON_OBJECT && g->count == 0, "empty object");
    CHECK(mt_json_get(v, "zz") == NULL && mt_json_get(a, "a") == NULL, "absent, not an object");
    CHECK(strcmp(mt_json_type_name(MT_JSON_OBJECT), "object") == 0, "type name");
    mt_json_free(v);

    /* integers: exact to int64, beyond that still a number */
    v = parse("[0, -0, 9223372036854775807, -9223372036854775808, 9223372036854775808, 1E2]");
    if (v) {
        CHECK(v->items[0].is_int && v->items[0].integer == 0, "0");
        CHECK(v->items[2].is_int && v->items[2].integer == INT64_MAX, "int64 max");
        CHECK(v->items[3].is_int && v->items[3].integer == INT64_MIN, "int64 min");
        CHECK(!v->items[4].is_int && v->items[4].number == 9223372036854775808.0, "beyond int64");
        CHECK(!v->items[5].is_int && v->items[5].number == 100.0, "exponent is not an integer");
    }
    mt_json_free(v);

    /* a scalar document, whitespace around it */
    v = parse("\t\r\n 42 \n");
    CHECK(v && v->is_int && v->integer == 42 && v->line == 2, "scalar root");
    mt_json_free(v);
}

static void test_strings(void)
{
    mt_json_t *v = parse("[\"q\\\"b\\\\s\\/n\\n\\t\\b\\f\\r\", \"\\u00e9\\u20AC\", "
                         "\"\\ud83d\\ude00\", \"a\\u0000b\", \"h\xc3\xa9 \xe2\x82\xac "
                         "\xf0\x9f\x98\x80\"]");
    if (!v)
        return;
    CHECK(strcmp(v->items[0].string, "q\"b\\s/n\n\t\b\f\r") == 0, "simple escapes");
    CHECK(strcmp(v->items[1].string, "\xc3\xa9\xe2\x82\xac") == 0, "\\u escapes to UTF-8");
    CHECK(strcmp(v->items[2].string, "\xf0\x9f\x98\x80") == 0, "surrogate pair");
    CHECK(v->items[3].length == 3 && memcmp(v->items[3].string, "a\0b", 3) == 0, "\\u0000");
    CHECK(strcmp(v->items[4].string, "h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == 0, "raw UTF-8");
    mt_json_free(v);
}

static void test_errors(void)
{
    bad("", "t.json:1:1:", "expected a value");
    bad("   ", "t.json:1:4:", "expected a value");
    bad("{\"a\": 1,}", "t.json:1:9:", "trailing commas are not allowed");
    bad("[1, 2,]", "t.json:1:7:", "trailing commas are not allowed");
    bad("[1 2]", "t.json:1:4:", "expected ',' or ']'");
    bad("{\"a\" 1}", "t.json:1:6:", "expected ':'");
    bad("{\"a\": 1 \"b\": 2}", "t.json:1:9:", "expected ',' or '}'");
    bad("{a: 1}", "t.json:1:2:", "expected a member name");
    bad("{'a': 1}", "t.json:1:2:", "expected a member name");
    bad("{\"a\": 1, \"a\": 2}", "t.json:1:10:", "duplicate key \"a\"");
    bad("[01]", "t.json:1:2:", "leading zeros");
    bad("[1.]", "t.json:1:4:", "after the decimal point");
    bad("[.5]", "t.json:1:2:", "expected a value");
    bad("[-]", "t.json:1:3:", "expected a digit");
    bad("[+1]", "t.json:1:2:", "expected a value");
    bad("[1e]", "t.json:1:4:", "in the exponent");
    bad("[NaN]", "t.json:1:2:", "expected a value");
    bad("[Infinity]", "t.json:1:2:", "expected a value");
    bad("[tru]", "t.json:1:2:", "expected a value");
    bad("{} // comment", "t.json:1:4:", "expected the end of the text");
    bad("{}\n{}", "t.json:2:1:", "expected the end of the text");
    bad("[\"abc", "t.json:1:2:", "unterminated string");
    bad("[\"a\tb\"]", "t.json:1:4:", "control character");
    bad("[\"a\\xb\"]", "t.json:1:4:", "invalid escape");
    bad("[\"\\u12G4\"]", "t.json:1:3:", "invalid escape");
    bad("[\"\\ud83d\"]", "t.json:1:3:", "unpaired UTF-16 surrogate");
    bad("[\"\\ude00\"]", "t.json:1:3:", "unpaired UTF-16 surrogate");
    bad("[\"\xff\"]", "t.json:1:3:", "invalid UTF-8");
    bad("[\"\xc0\x80\"]", "t.json:1:3:", "invalid UTF-8");         /* overlong */
    bad("[\"\xed\xa0\x80\"]", "t.json:1:3:", "invalid UTF-8");     /* encoded surrogate */
    bad("{\n  \"a\": [1,\n        x]}", "t.json:3:9:", "expected a value");
    /* nesting: 256 levels parse, 257 do not */
    char deep[600];
    memset(deep, '[', 256);
    memset(deep + 256, ']', 256);
    deep[512] = '\0';
    mt_json_t *v = parse(deep);
    mt_json_free(v);
    memset(deep, '[', 257);
    memset(deep + 257, ']', 257);
    deep[514] = '\0';
    bad(deep, "t.json:1:257:", "nesting deeper than");
    /* an embedded NUL outside a string is not whitespace */
    mt_json_t *w = NULL;
    CHECK(mt_json_parse("{}\0", 3, "t.json", &w) == MT_ERR_IO && !w, "NUL after the value");
    CHECK(mt_json_parse_file("/nonexistent/x.json", 1024, &w) == MT_ERR_IO, "missing file");
    CHECK_CONTAINS(mt_error_message(), "/nonexistent/x.json: No such file or directory");
}

/* The conversions and header checks hf_import and hf_export rely on. */
static void test_safetensors(void)
{
    CHECK(mt_f32_to_bf16(1.0f) == 0x3f80, "bf16 of 1");
    CHECK(mt_f32_to_bf16(-2.0f) == 0xc000, "bf16 of -2");
    /* 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even (1) */
    CHECK(mt_f32_to_bf16(1.00390625f) == 0x3f80, "tie rounds to even, down");
    /* 1 + 3 x 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (up) */
    CHECK(mt_f32_to_bf16(1.01171875f) == 0x3f82, "tie rounds to even, up");
    CHECK(mt_f32_to_bf16(1.0040f) == 0x3f81, "above the tie rounds up");
    CHECK(mt_f32_to_bf16(INFINITY) == 0x7f80, "inf");
    CHECK(mt_f32_to_bf16(3.4028235e38f) == 0x7f80, "max float rounds to inf");
    uint16_t nan = mt_f32_to_bf16(NAN);
    CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x7f), "NaN stays NaN: %04x", nan);
    CHECK(mt_bf16_to_f32(0x3f81) == 1.0078125f, "bf16 to f32");
    CHECK(mt_f16_to_f32(0x3c00) == 1.0f && mt_f16_to_f32(0xc000) == -2.0f, "f16 normal");
    CHECK(mt_f16_to_f32(0x0001) == 5.9604644775390625e-08f, "f16 smallest subnormal");
    CHECK(mt_f16_to_f32(0x7bff) == 65504.0f, "f16 max");
    CHECK(isinf(mt_f16_to_f32(0xfc00)) && mt_f16_to_f32(0xfc00) < 0, "f16 -inf");
    CHECK(isnan(mt_f16_to_f32(0x7e00)), "f16 NaN");
    float x[3] = {1.5f, -0.25f, 3.0e-3f}, y[3];
    unsigned char b[12];
    mt_st_encode(x, 3, MT_ST_F32, b);
    CHECK(b[0] == 0x00 && b[1] == 0x00 && b[2] == 0xc0 && b[3] == 0x3f, "F32 little-endian");
    mt_st_decode(b, 3, MT_ST_F32, y);
    CHECK(memcmp(x, y, sizeof x) == 0, "F32 round trip");
    mt_st_encode(x, 3, MT_ST_BF16, b);
    mt_st_decode(b, 3, MT_ST_BF16, y);
    CHECK(y[0] == 1.5f && y[1] == -0.25f && y[2] == mt_bf16_to_f32(mt_f32_to_bf16(3.0e-3f)),
          "BF16 round trip");

    /* A header as written: length, JSON padded to 8 bytes with spaces. */
    mt_st_entry_t e[2] = {{.name = "w", .dtype = MT_ST_F32, .ndim = 2, .shape = {2, 3},
                           .begin = 0, .end = 24},
                          {.name = "n", .dtype = MT_ST_BF16, .ndim = 1, .shape = {4},
                           .begin = 24, .end = 32}};
    unsigned char *h = NULL;
    size_t hl = 0;
    CHECK(mt_st_header_bytes(e, 2, &h, &hl) == MT_OK && hl % 8 == 0, "header length %zu", hl);
    if (!h)
        return;
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--)
        n = n << 8 | h[k];
    CHECK(n == hl - 8 && (h[hl - 1] == ' ' || h[hl - 1] == '}'), "length field");
    CHECK(memcmp(h + 8, "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\"", 49) == 0,
          "header text: %.60s", (const char *)h + 8);
    char path[] = "/tmp/test_json_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    unsigned char data[32] = {0};
    if (f) {
        fwrite(h, 1, hl, f);
        fwrite(data, 1, sizeof data, f);
        fclose(f);
        mt_st_file_t st;
        CHECK(mt_st_read_header(path, &st) == MT_OK, "read back: %s", mt_error_message());
        CHECK(st.n == 2 && st.data_start == hl && st.e[1].dtype == MT_ST_BF16 &&
              st.e[1].shape[0] == 4 && st.e[1].begin == 24, "entries read back");
        mt_st_file_free(&st);
        /* truncated: the last tensor's bytes are not all there */
        CHECK(truncate(path, (off_t)(hl + 30)) == 0, "truncate");
        CHECK(mt_st_read_header(path, &st) == MT_ERR_IO, "truncated file refused");
        CHECK_CONTAINS(mt_error_message(), "past the end of the data");
        remove(path);
    }
    free(h);

    int64_t bytes = 0;
    CHECK(mt_hf_parse_size("5GB", &bytes) == MT_OK && bytes == 5000000000LL, "5GB");
    CHECK(mt_hf_parse_size("2MiB", &bytes) == MT_OK && bytes == 2097152, "2MiB");
    CHECK(mt_hf_parse_size("100kb", &bytes) == MT_OK && bytes == 100000, "100kb");
    CHECK(mt_hf_parse_size("4096", &bytes) == MT_OK && bytes == 4096, "bytes");
    CHECK(mt_hf_parse_size("5 parsecs", &bytes) == MT_ERR_CONFIG, "bad unit");
    CHECK(mt_hf_parse_size("-1GB", &bytes) == MT_ERR_CONFIG, "negative");
}

int main(void)
{
    test_values();
    test_strings();
    test_errors();
    test_safetensors();
    return mt_test_exit("test_json");
}
