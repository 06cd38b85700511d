/* tokenizer_internal.h: the handle behind mt_tokenizer_t, shared by the
 * files of src/tokenizer. */
#ifndef MT_TOKENIZER_INTERNAL_H
#define MT_TOKENIZER_INTERNAL_H

#include "mt_tokenizer.h"

typedef enum { MT_TOK_BYTE = 0, MT_TOK_HF } mt_tok_kind_t;

struct mt_hftok; /* a parsed tokenizer.json (tokenizer_hf*.c) */

struct mt_tokenizer {
    mt_tok_kind_t kind;
    char *path;            /* the tokenizer.json read; "" for byte */
    int64_t vocab_size;
    int32_t bos_id, eos_id; /* -1 where there is none */
    char *chat_template;   /* tokenizer_config.json's, or NULL */
    struct mt_hftok *hf;   /* MT_TOK_HF only */
};

/* Grow *p (of *cap elements of elem bytes) to hold need (tokenizer_buf.c). */
mt_status_t mt_tok_grow(void **p, size_t *cap, size_t need, size_t elem);

#endif
