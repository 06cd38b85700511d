/* safetensors.c: the safetensors file format and its dtypes.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 * (an object: tensor name -> {"dtype", "shape", "data_offsets": [begin,
 * end]}, plus an optional "__metadata__" object of strings), then the raw
 * little-endian tensor data; offsets are relative to the first data byte.
 * Writers pad the JSON with spaces so the data starts 8-byte aligned.
 *
 * This file reads and checks headers and builds them; it reads no tensor
 * data (hf_import.c does, by rows) and knows nothing of MPI. */
#include "hf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ dtypes */

size_t mt_st_dtype_size(mt_st_dtype_t d)
{
    return d == MT_ST_F32 ? 4 : d == MT_ST_BF16 || d == MT_ST_F16 ? 2 : 0;
}

const char *mt_st_dtype_name(mt_st_dtype_t d)
{
    return d == MT_ST_F32 ? "F32" : d == MT_ST_BF16 ? "BF16" : d == MT_ST_F16 ? "F16" : "?";
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float mt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) /* inf or NaN */
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: man x 2^-24, exact in float32 */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

void mt_st_encode(const float *src, size_t n, mt_st_dtype_t d, unsigned char *dst)
{
    for (size_t i = 0; i < n; i++) {
        if (d == MT_ST_BF16) {
            uint16_t h = mt_f32_to_bf16(src[i]);
            dst[2 * i] = (unsigned char)h, dst[2 * i + 1] = (unsigned char)(h >> 8);
        } else {
            uint32_t u = f32_bits(src[i]);
            for (int b = 0; b < 4; b++)
                dst[4 * i + (size_t)b] = (unsigned char)(u >> (8 * b));
        }
    }
}

void mt_st_decode(const unsigned char *src, size_t n, mt_st_dtype_t d, float *dst)
{
    /* one loop per dtype: loading a model at start runs through here once
     * per element, so the branch stays out of the loop */
    if (d == MT_ST_F32) {
        for (size_t i = 0; i < n; i++) {
            const unsigned char *p = src + 4 * i;
            dst[i] = bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24);
        }
    } else if (d == MT_ST_BF16) {
        for (size_t i = 0; i < n; i++)
            dst[i] = mt_bf16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = mt_f16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
    }
}

/* ------------------------------------------------------------ reading a header */

void mt_st_file_free(mt_st_file_t *f)
{
    free(f->e);
    f->e = NULL;
    f->n = 0;
}

static int by_begin(const void *a, const void *b)
{
    const mt_st_entry_t *x = *(const mt_st_entry_t *const *)a, *y = *(const mt_st_entry_t *const *)b;
    if (x->begin != y->begin)
        return (x->begin > y->begin) - (x->begin < y->begin);
    return (x->end > y->end) - (x->end < y->end);
}

/* shape[d] and data_offsets[k]: exact non-negative integers */
static int count_at(const json_t *a, size_t i, int64_t *out)
{
    const json_t *x = json_array_get(a, i);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return 0;
    *out = json_integer_value(x);
    return 1;
}

static mt_status_t read_entry(const mt_st_file_t *f, const char *key, const json_t *v,
                              mt_st_entry_t *e)
{
    const char *fn = f->path;
    if (strlen(key) >= sizeof e->name)
        MT_FAIL(MT_ERR_IO, "%s: tensor name \"%.60s...\" is longer than %d bytes", fn, key,
                MT_HF_NAME_MAX - 1);
    snprintf(e->name, sizeof e->name, "%s", key);
    if (!json_is_object(v))
        MT_FAIL(MT_ERR_IO, "%s: header entry \"%s\" is a JSON %s, expected an object with dtype, "
                "shape and data_offsets", fn, key, mt_hf_json_type(v));
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    const json_t *sh = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
    if (!dt || !json_is_array(sh) || !json_is_array(off))
        MT_FAIL(MT_ERR_IO, "%s: tensor %s: the header needs \"dtype\" (a string), \"shape\" and "
                "\"data_offsets\" (arrays)", fn, key);
    snprintf(e->dtype_text, sizeof e->dtype_text, "%s", dt);
    e->dtype = !strcmp(dt, "F32") ? MT_ST_F32 : !strcmp(dt, "BF16") ? MT_ST_BF16
             : !strcmp(dt, "F16") ? MT_ST_F16 : MT_ST_OTHER;
    if (json_array_size(sh) > MT_ST_MAX_DIMS)
        MT_FAIL(MT_ERR_IO, "%s: tensor %s has %zu dimensions; at most %d are supported", fn, key,
                json_array_size(sh), MT_ST_MAX_DIMS);
    e->ndim = (int)json_array_size(sh);
    uint64_t nelem = 1;
    for (int d = 0; d < e->ndim; d++) {
        if (!count_at(sh, (size_t)d, &e->shape[d]))
            MT_FAIL(MT_ERR_IO, "%s: tensor %s: shape[%d] is not a non-negative integer", fn, key,
                    d);
        uint64_t x = (uint64_t)e->shape[d];
        if (x && nelem > UINT64_MAX / 16 / x)
            MT_FAIL(MT_ERR_IO, "%s: tensor %s: the shape is too large", fn, key);
        nelem *= x;
    }
    int64_t begin, end;
    if (json_array_size(off) != 2 || !count_at(off, 0, &begin) || !count_at(off, 1, &end) ||
        end < begin)
        MT_FAIL(MT_ERR_IO, "%s: tensor %s: data_offsets must be [begin, end] with 0 <= begin <= "
                "end", fn, key);
    e->begin = (uint64_t)begin;
    e->end = (uint64_t)end;
    size_t es = mt_st_dtype_size(e->dtype);
    if (es && e->end - e->begin != nelem * es)
        MT_FAIL(MT_ERR_IO, "%s: tensor %s: data_offsets [%llu, %llu] span %llu bytes, but %llu "
                "elements of %s take %llu", fn, key, (unsigned long long)e->begin,
                (unsigned long long)e->end, (unsigned long long)(e->end - e->begin),
                (unsigned long long)nelem, e->dtype_text, (unsigned long long)(nelem * es));
    if (e->end > f->file_size - f->data_start)
        MT_FAIL(MT_ERR_IO, "%s: tensor %s: data_offsets end %llu is past the end of the data "
                "(%llu bytes): the file is truncated", fn, key, (unsigned long long)e->end,
                (unsigned long long)(f->file_size - f->data_start));
    return MT_OK;
}

static mt_status_t check_metadata(const mt_st_file_t *f, json_t *m)
{
    const char *key;
    json_t *v;
    if (!json_is_object(m))
        MT_FAIL(MT_ERR_IO, "%s: __metadata__ must be an object of strings", f->path);
    json_object_foreach(m, key, v)
        if (!json_is_string(v))
            MT_FAIL(MT_ERR_IO, "%s: __metadata__ \"%s\" is a %s; the format allows strings only",
                    f->path, key, mt_hf_json_type(v));
    return MT_OK;
}

static mt_status_t parse_header(mt_st_file_t *f, json_t *j)
{
    if (!json_is_object(j))
        MT_FAIL(MT_ERR_IO, "%s: the header is a JSON %s, expected an object", f->path,
                mt_hf_json_type(j));
    size_t count = json_object_size(j);
    if (!(f->e = calloc(count ? count : 1, sizeof *f->e)))
        MT_FAIL(MT_ERR_NOMEM, "%s: %zu header entries", f->path, count);
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) { /* in the header's order */
        if (strcmp(key, "__metadata__") == 0) {
            MT_TRY(check_metadata(f, v));
            continue;
        }
        MT_TRY(read_entry(f, key, v, &f->e[f->n]));
        f->n++;
    }
    /* Tensors must not share bytes. */
    mt_st_entry_t **order = malloc(sizeof *order * (size_t)(f->n ? f->n : 1));
    if (!order)
        MT_FAIL(MT_ERR_NOMEM, "%s: sorting %d entries", f->path, f->n);
    for (int i = 0; i < f->n; i++)
        order[i] = &f->e[i];
    qsort(order, (size_t)f->n, sizeof *order, by_begin);
    /* Sorted by start, a tensor overlaps an earlier one exactly when it
     * starts before the furthest end so far; comparing with the
     * predecessor alone misses an overlap behind a zero-length tensor. */
    mt_status_t s = MT_OK;
    const mt_st_entry_t *reach = NULL; /* the non-empty tensor ending last */
    for (int i = 0; i < f->n && s == MT_OK; i++) {
        const mt_st_entry_t *e = order[i];
        if (e->begin == e->end)
            continue;
        if (reach && e->begin < reach->end)
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: tensors %s and %s overlap "
                             "(data_offsets)", f->path, reach->name, e->name);
        if (!reach || e->end > reach->end)
            reach = e;
    }
    free(order);
    return s;
}

mt_status_t mt_st_read_header(const char *path, mt_st_file_t *f)
{
    memset(f, 0, sizeof *f);
    if (strlen(path) >= sizeof f->path)
        MT_FAIL(MT_ERR_RANGE, "safetensors path too long: %.80s...", path);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        MT_FAIL(MT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    unsigned char len8[8];
    char *hdr = NULL;
    mt_status_t s = MT_OK;
    uint64_t n = 0;
    if (fstat(fd, &st) != 0 || pread(fd, len8, 8, 0) != 8) {
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: not a safetensors file: shorter "
                         "than its 8-byte header length", path);
    } else {
        for (int b = 7; b >= 0; b--)
            n = n << 8 | len8[b];
        f->file_size = (uint64_t)st.st_size;
        f->data_start = 8 + n;
        if (n > MT_ST_MAX_HEADER || n > f->file_size - 8)
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: not a safetensors file: header "
                             "length %llu (file of %llu bytes, limit %u)", path,
                             (unsigned long long)n, (unsigned long long)f->file_size,
                             MT_ST_MAX_HEADER);
        else if (!(hdr = malloc(n + 1)))
            s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "%s: header of %llu bytes", path,
                             (unsigned long long)n);
        else if (pread(fd, hdr, n, 8) != (ssize_t)n)
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: cannot read the header: %s",
                             path, strerror(errno));
    }
    close(fd);
    json_t *j = NULL;
    if (s == MT_OK && (n == 0 || hdr[0] != '{'))
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: not a safetensors file: the header "
                         "does not start with '{'", path);
    if (s == MT_OK)
        s = mt_hf_json_parse(hdr, n, path, &j);
    if (s == MT_OK)
        s = parse_header(f, j);
    json_decref(j);
    free(hdr);
    if (s != MT_OK)
        mt_st_file_free(f);
    return s;
}

/* ------------------------------------------------------------ writing a header */

mt_status_t mt_st_header_bytes(const mt_st_entry_t *e, int n, unsigned char **bytes, size_t *len)
{
    char *text = NULL;
    size_t tlen = 0;
    FILE *o = open_memstream(&text, &tlen);
    if (!o)
        MT_FAIL(MT_ERR_NOMEM, "safetensors header of %d tensors", n);
    fputs("{\"__metadata__\":{\"format\":\"pt\"}", o);
    for (int i = 0; i < n; i++) {
        /* names are Hugging Face parameter names: no quotes or backslashes */
        fprintf(o, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e[i].name, mt_st_dtype_name(e[i].dtype));
        for (int d = 0; d < e[i].ndim; d++)
            fprintf(o, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        fprintf(o, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)e[i].begin,
                (unsigned long long)e[i].end);
    }
    fputc('}', o);
    if (fclose(o) != 0 || !text) {
        free(text);
        MT_FAIL(MT_ERR_NOMEM, "safetensors header of %d tensors", n);
    }
    size_t padded = (tlen + 7) / 8 * 8;
    unsigned char *b = malloc(8 + padded);
    if (!b) {
        free(text);
        MT_FAIL(MT_ERR_NOMEM, "safetensors header of %zu bytes", padded);
    }
    for (int k = 0; k < 8; k++)
        b[k] = (unsigned char)((uint64_t)padded >> (8 * k));
    memcpy(b + 8, text, tlen);
    memset(b + 8 + tlen, ' ', padded - tlen);
    free(text);
    *bytes = b;
    *len = 8 + padded;
    return MT_OK;
}
