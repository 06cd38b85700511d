/* tokenizer.c: the tokenizer handle: the byte-level tokenizer, and the
 * Hugging Face one (tokenizer_hf_*.c) behind the same calls. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_hf.h"

mt_status_t hf_attach(const char *spec, mt_tokenizer_t *t); /* tokenizer_hf_config.c */

/* The byte-level tokenizer's ids: bytes, then end-of-document and pad.
 * They match mt_data.h's MT_TOKEN_EOD and MT_TOKEN_PAD, which the token
 * files written before tokenizers existed use. */
enum { BYTE_EOD = 256, BYTE_PAD = 257, BYTE_VOCAB = 258 };

mt_status_t mt_tokenizer_load(const char *spec, mt_tokenizer_t **out)
{
    *out = NULL;
    if (!spec || !*spec)
        MT_FAIL(MT_ERR_CONFIG, "tokenizer: no tokenizer given (\"byte\", or a tokenizer.json)");
    mt_tokenizer_t *t = calloc(1, sizeof *t);
    if (!t)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    if (strcmp(spec, "byte") == 0) {
        t->kind = MT_TOK_BYTE;
        t->path = strdup("");
        t->vocab_size = BYTE_VOCAB;
        t->bos_id = -1;
        t->eos_id = BYTE_EOD;
        if (!t->path) {
            free(t);
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        }
        *out = t;
        return MT_OK;
    }
    mt_status_t st = hf_attach(spec, t);
    if (st != MT_OK) {
        mt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MT_OK;
}

void mt_tokenizer_free(mt_tokenizer_t *t)
{
    if (!t)
        return;
    hf_free(t->hf);
    free(t->path);
    free(t->chat_template);
    free(t);
}

mt_status_t mt_tokenizer_encode(const mt_tokenizer_t *t, const char *text, size_t len,
                                bool add_special, mt_ids_t *ids)
{
    if (t->kind == MT_TOK_HF)
        return hf_encode(t->hf, text, len, add_special, ids);
    if (t->kind != MT_TOK_BYTE)
        MT_FAIL(MT_ERR_INTERNAL, "tokenizer: unknown kind %d", (int)t->kind);
    MT_TRY(mt_tok_grow((void **)&ids->v, &ids->cap, ids->n + len, sizeof *ids->v));
    for (size_t i = 0; i < len; i++)
        ids->v[ids->n++] = (unsigned char)text[i];
    return MT_OK;
}

mt_status_t mt_tokenizer_decode(const mt_tokenizer_t *t, const int32_t *ids, size_t n,
                                bool skip_special, mt_text_t *out)
{
    if (t->kind == MT_TOK_HF)
        return hf_decode(t->hf, ids, n, skip_special, out);
    if (t->kind != MT_TOK_BYTE)
        MT_FAIL(MT_ERR_INTERNAL, "tokenizer: unknown kind %d", (int)t->kind);
    MT_TRY(mt_tok_grow((void **)&out->s, &out->cap, out->n + n + 1, 1));
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= BYTE_VOCAB)
            MT_FAIL(MT_ERR_RANGE, "tokenizer: id %d at position %zu is outside the byte "
                           "vocabulary (0..%d)", ids[i], i, BYTE_VOCAB - 1);
        if (ids[i] < 256)
            out->s[out->n++] = (char)ids[i];
        else if (!skip_special) {
            const char *s = ids[i] == BYTE_EOD ? "<|eod|>" : "<|pad|>";
            MT_TRY(mt_text_append(out, s, strlen(s)));
            MT_TRY(mt_tok_grow((void **)&out->s, &out->cap, out->n + (n - i) + 1, 1));
        }
    }
    out->s[out->n] = '\0';
    return MT_OK;
}

int64_t mt_tokenizer_vocab_size(const mt_tokenizer_t *t)
{
    return t->vocab_size;
}

int32_t mt_tokenizer_token_to_id(const mt_tokenizer_t *t, const char *token)
{
    if (t->kind == MT_TOK_HF)
        return hf_token_to_id(t->hf, token);
    if (t->kind == MT_TOK_BYTE) {
        if (strcmp(token, "<|eod|>") == 0)
            return BYTE_EOD;
        if (strcmp(token, "<|pad|>") == 0)
            return BYTE_PAD;
        if (token[0] && !token[1])
            return (unsigned char)token[0];
    }
    return -1;
}

const char *mt_tokenizer_id_to_token(const mt_tokenizer_t *t, int32_t id)
{
    /* one static string per byte keeps the handle read-only */
    static const char bytes[256][2] = {
#define B1(i) {(char)(i), 0}
#define B4(i) B1(i), B1(i + 1), B1(i + 2), B1(i + 3)
#define B16(i) B4(i), B4(i + 4), B4(i + 8), B4(i + 12)
#define B64(i) B16(i), B16(i + 16), B16(i + 32), B16(i + 48)
        B64(0), B64(64), B64(128), B64(192)
#undef B64
#undef B16
#undef B4
#undef B1
    };
    if (t->kind == MT_TOK_HF)
        return id >= 0 && id < t->hf->ntok ? t->hf->tok[id] : NULL;
    if (t->kind != MT_TOK_BYTE || id < 0 || id >= BYTE_VOCAB)
        return NULL;
    if (id == BYTE_EOD)
        return "<|eod|>";
    if (id == BYTE_PAD)
        return "<|pad|>";
    return bytes[id];
}

int32_t mt_tokenizer_bos_id(const mt_tokenizer_t *t)
{
    return t->bos_id;
}

int32_t mt_tokenizer_eos_id(const mt_tokenizer_t *t)
{
    return t->eos_id;
}

const char *mt_tokenizer_kind(const mt_tokenizer_t *t)
{
    return t->kind == MT_TOK_BYTE ? "byte" : "tokenizer.json";
}

const char *mt_tokenizer_path(const mt_tokenizer_t *t)
{
    return t->path;
}

const char *mt_tokenizer_chat_template(const mt_tokenizer_t *t)
{
    return t->chat_template;
}
