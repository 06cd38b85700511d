/* test_json: JSON as meshtrain reads it (src/hf/hf_json.c over jansson):
 * the flags that keep parsing strict (duplicate keys, text after the value,
 * nesting, UTF-8, NUL, NaN and Infinity), integers exact to int64, and every
 * kind of malformed text refused with NAME:LINE:COL and the reason
 * (meshtrain's wording for structural mistakes, jansson's for bad tokens).
 * Duplicate keys are found in linear time: 40,000 keys parse in well under
 * a second.  Also the safetensors dtype conversions (round to nearest even)
 * and header checks that hf_import relies on.  No MPI. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hf_internal.h"
#include "mt_test.h"

static json_t *parse(const char *text)
{
    json_t *v = NULL;
    mt_status_t s = mt_hf_json_parse(text, strlen(text), "t.json", &v);
    CHECK(s == MT_OK, "parse failed: %s\n%s", mt_error_message(), text);
    return v;
}

static void bad_n(const char *text, size_t len, const char *where, const char *why)
{
    json_t *v = NULL;
    mt_status_t s = mt_hf_json_parse(text, len, "t.json", &v);
    CHECK(s == MT_ERR_IO && v == NULL, "expected an error for: %.*s", (int)len, text);
    if (s != MT_OK) {
        CHECK_CONTAINS(mt_error_message(), where);
        CHECK_CONTAINS(mt_error_message(), why);
    }
    json_decref(v);
}

static void bad(const char *text, const char *where, const char *why)
{
    bad_n(text, strlen(text), where, why);
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int is_int(const json_t *v, int64_t x)
{
    return json_is_integer(v) && json_integer_value(v) == x;
}

static void test_values(void)
{
    json_t *v = parse(" {\"a\": 1, \"b\": [true, false, null], \"c\": \"x\",\n"
                      "  \"d\": {\"e\": -2.5e-3, \"f\": []}, \"g\": {}} ");
    if (!v)
        return;
    CHECK(json_is_object(v) && json_object_size(v) == 5, "root");
    const char *order = "abcdg", *key;
    json_t *x;
    int i = 0;
    json_object_foreach(v, key, x)
        CHECK(key[0] == order[i++] && key[1] == '\0', "keys in text order: %s at %d", key, i - 1);
    const json_t *a = json_object_get(v, "a"), *b = json_object_get(v, "b");
    const json_t *d = json_object_get(v, "d");
    CHECK(json_is_integer(a) && json_integer_value(a) == 1 && json_number_value(a) == 1.0,
          "integer");
    CHECK(json_is_array(b) && json_array_size(b) == 3 && json_is_true(json_array_get(b, 0)) &&
          json_is_false(json_array_get(b, 1)) && json_is_null(json_array_get(b, 2)),
          "true false null");
    const json_t *e = json_object_get(d, "e");
    CHECK(json_is_real(e) && json_number_value(e) == -2.5e-3, "float");
    const json_t *f = json_object_get(d, "f"), *g = json_object_get(v, "g");
    CHECK(json_is_array(f) && json_array_size(f) == 0, "empty array");
    CHECK(json_is_object(g) && json_object_size(g) == 0, "empty object");
    CHECK(!json_object_get(v, "zz") && !json_object_get(a, "a"), "absent, not an object");
    CHECK(strcmp(mt_hf_json_type(v), "object") == 0 && strcmp(mt_hf_json_type(a), "number") == 0 &&
          strcmp(mt_hf_json_type(e), "number") == 0 &&
          strcmp(mt_hf_json_type(json_array_get(b, 0)), "boolean") == 0 &&
          strcmp(mt_hf_json_type(json_array_get(b, 2)), "null") == 0, "type names");
    json_decref(v);

    /* integers: exact to int64 (safetensors offsets and shapes) */
    v = parse("[0, -0, 9223372036854775807, -9223372036854775808, 1E2, 2.0]");
    if (v) {
        CHECK(is_int(json_array_get(v, 0), 0) && is_int(json_array_get(v, 1), 0), "0 and -0");
        CHECK(is_int(json_array_get(v, 2), INT64_MAX), "int64 max");
        CHECK(is_int(json_array_get(v, 3), INT64_MIN), "int64 min");
        CHECK(json_is_real(json_array_get(v, 4)) && json_number_value(json_array_get(v, 4)) == 100,
              "an exponent is not an integer");
        CHECK(json_is_real(json_array_get(v, 5)), "2.0 is not an integer");
    }
    json_decref(v);
    /* beyond int64 (and beyond double) jansson refuses rather than round */
    bad("[9223372036854775808]", "t.json:1:20:", "too big integer (found '9223372036854775808')");
    bad("[-9223372036854775809]", "t.json:1:21:", "too big negative integer");
    bad("[1e400]", "t.json:1:6:", "real number overflow");

    /* a scalar document, whitespace around it: accepted, callers check the type */
    v = parse("\t\r\n 42 \n");
    CHECK(is_int(v, 42), "scalar root");
    json_decref(v);
}

static void test_strings(void)
{
    json_t *v = parse("[\"q\\\"b\\\\s\\/n\\n\\t\\b\\f\\r\", \"\\u00e9\\u20AC\", "
                      "\"\\ud83d\\ude00\", \"a\\u0000b\", \"h\xc3\xa9 \xe2\x82\xac "
                      "\xf0\x9f\x98\x80\"]");
    if (!v)
        return;
    const json_t *nul = json_array_get(v, 3);
    CHECK(strcmp(json_string_value(json_array_get(v, 0)), "q\"b\\s/n\n\t\b\f\r") == 0,
          "simple escapes");
    CHECK(strcmp(json_string_value(json_array_get(v, 1)), "\xc3\xa9\xe2\x82\xac") == 0,
          "\\u escapes to UTF-8");
    CHECK(strcmp(json_string_value(json_array_get(v, 2)), "\xf0\x9f\x98\x80") == 0,
          "surrogate pair");
    CHECK(json_string_length(nul) == 3 && memcmp(json_string_value(nul), "a\0b", 3) == 0,
          "\\u0000 in a value");
    CHECK(strcmp(json_string_value(json_array_get(v, 4)), "h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80")
          == 0, "raw UTF-8");
    json_decref(v);
    bad("{\"a\\u0000b\": 1}", "t.json:1:11:", "NUL byte in object key");
}

/* n levels: `open` (empty, or an object's opening) then arrays, all closed */
static void nest(char *buf, const char *open, int n)
{
    size_t k = strlen(open), arrays = (size_t)n - (k ? 1 : 0);
    memcpy(buf, open, k);
    memset(buf + k, '[', arrays);
    memset(buf + k + arrays, ']', arrays);
    strcpy(buf + k + 2 * arrays, k ? "}" : "");
}

static void test_errors(void)
{
    bad("", "t.json:1:1:", "expected a value (object, array, string, number, true, false or "
        "null) (found the end of the text)");
    bad("   ", "t.json:1:3:", "expected a value");
    bad("{\"a\": 1,}", "t.json:1:9:", "expected a member name (a string): trailing commas are "
        "not allowed (found '}')");
    bad("[1, 2,]", "t.json:1:7:", "expected a value (object, array, string, number, true, false "
        "or null) (found ']')");
    bad("[1 2]", "t.json:1:4:", "expected ',' or ']' after an array element (found '2')");
    bad("{\"a\" 1}", "t.json:1:6:", "expected ':' after a member name (found '1')");
    bad("{\"a\": 1 \"b\": 2}", "t.json:1:11:", "expected ',' or '}' after an object member");
    bad("{a: 1}", "t.json:1:2:", "expected a member name (a string) or '}' (found 'a')");
    bad("{'a': 1}", "t.json:1:2:", "expected a member name (a string) or '}'");
    bad("{\"a\": 1, \"a\": 2}", "t.json:1:12:", "duplicate key \"a\"");
    /* named as written, however long, escapes and all */
    bad("{\"model.layers.0.mlp.up_proj.weight\": 1, \"b\\\\\": 2,\n"
        " \"model.layers.0.mlp.up_proj.weight\": 3}", "t.json:2:36:",
        "duplicate key \"model.layers.0.mlp.up_proj.weight\"");
    bad("{\"q\\\"\\\\\": 1, \"q\\\"\\\\\": 2}", "t.json:1:20:", "duplicate key \"q\\\"\\\\\"");
    bad("[01]", "t.json:1:2:", "invalid token (found '0')");
    bad("[1.]", "t.json:1:3:", "invalid token (found '1.')");
    bad("[.5]", "t.json:1:2:", "invalid token");
    bad("[-]", "t.json:1:2:", "invalid token");
    bad("[+1]", "t.json:1:2:", "invalid token");
    bad("[1e]", "t.json:1:3:", "invalid token");
    bad("[NaN]", "t.json:1:4:", "invalid token (found 'NaN')");
    bad("[Infinity]", "t.json:1:9:", "invalid token (found 'Infinity')");
    bad("[-Infinity]", "t.json:1:2:", "invalid token");
    bad("[tru]", "t.json:1:4:", "invalid token");
    bad("{} // comment", "t.json:1:4:", "expected the end of the text after the value (found '/')");
    bad("{}\n{}", "t.json:2:1:", "expected the end of the text");
    bad("[\"abc", "t.json:1:5:", "premature end of input");
    bad("[\"a\tb\"]", "t.json:1:3:", "control character 0x9");
    bad("[\"a\\xb\"]", "t.json:1:5:", "invalid escape");
    bad("[\"\\u12G4\"]", "t.json:1:7:", "invalid escape");
    bad("[\"\\ud83d\"]", "t.json:1:9:", "invalid Unicode '\\uD83D'");
    bad("[\"\\ude00\"]", "t.json:1:9:", "invalid Unicode '\\uDE00'");
    bad("[\"\xff\"]", "t.json:1:2:", "invalid UTF-8: unable to decode byte 0xff");
    bad("[\"\xc0\x80\"]", "t.json:1:2:", "invalid UTF-8");     /* overlong */
    bad("[\"\xed\xa0\x80\"]", "t.json:1:2:", "invalid UTF-8"); /* encoded surrogate */
    bad("[1, \xff]", "t.json:1:4:", "invalid UTF-8");          /* outside a string too */
    bad("{\n  \"a\": [1,\n        x]}", "t.json:3:9:", "invalid token (found 'x')");
    /* nesting: 256 levels parse, 257 do not, in arrays and objects alike;
     * past jansson's own limit the message is the same */
    static char deep[4200];
    nest(deep, "", 256);
    json_decref(parse(deep));
    nest(deep, "", 257);
    bad(deep, "t.json: ", "nesting deeper than 256 levels");
    nest(deep, "{\"k\":", 257);
    bad(deep, "t.json: ", "nesting deeper than 256 levels");
    nest(deep, "", 2049);
    bad(deep, "t.json:1:2049:", "nesting deeper than 256 levels (found '[')");
    /* an embedded NUL outside a string is not whitespace */
    bad_n("{}\0", 3, "t.json:1:3:", "expected the end of the text");
    json_t *w = NULL;
    CHECK(mt_hf_json_load("/nonexistent/x.json", 1024, &w) == MT_ERR_IO && !w, "missing file");
    CHECK_CONTAINS(mt_error_message(), "/nonexistent/x.json: No such file or directory");
}

/* A model.safetensors.index.json's weight_map of n tensors, the last one
 * listed twice when dup: "{"weight_map": {"model.layers.0...": "...", ...}}". */
static char *index_text(int n, int dup, size_t *len)
{
    size_t cap = 96 * (size_t)(n + 2), at = 0;
    char *t = malloc(cap);
    if (!t)
        return NULL;
    at += (size_t)snprintf(t, cap, "{\"weight_map\": {");
    for (int i = 0; i <= n - (dup ? 0 : 1); i++) {
        int k = i < n ? i : n - 1;
        at += (size_t)snprintf(t + at, cap - at, "%s\n\"model.layers.%d.self_attn.q_proj.weight\": "
                               "\"model-%05d-of-00099.safetensors\"", i ? "," : "", k, k % 99 + 1);
    }
    at += (size_t)snprintf(t + at, cap - at, "}}\n");
    *len = at;
    return t;
}

static void test_many_keys(void)
{
    enum { N = 40000 };
    size_t len;
    char *t = index_text(N, 0, &len);
    CHECK(t != NULL, "index text");
    if (!t)
        return;
    json_t *v = NULL;
    double t0 = seconds();
    mt_status_t s = mt_hf_json_parse(t, len, "index.json", &v);
    double took = seconds() - t0;
    CHECK(s == MT_OK && json_object_size(json_object_get(v, "weight_map")) == N,
          "%d keys: %s", N, s == MT_OK ? "" : mt_error_message());
    CHECK(took < 2.0, "%d distinct keys took %.3f s: duplicate detection is not linear", N, took);
    json_decref(v);
    free(t);

    t = index_text(N, 1, &len);
    if (!t)
        return;
    t0 = seconds();
    s = mt_hf_json_parse(t, len, "index.json", &v);
    took = seconds() - t0;
    CHECK(s == MT_ERR_IO && !v, "the repeated last key is refused");
    if (s != MT_OK) {
        CHECK_CONTAINS(mt_error_message(), "index.json:40002:");
        CHECK_CONTAINS(mt_error_message(),
                       "duplicate key \"model.layers.39999.self_attn.q_proj.weight\"");
    }
    CHECK(took < 2.0, "%d keys and a duplicate took %.3f s", N, took);
    json_decref(v);
    free(t);
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
    test_many_keys();
    test_safetensors();
    return mt_test_exit("test_json");
}
