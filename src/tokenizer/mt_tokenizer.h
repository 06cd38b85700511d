/* mt_tokenizer.h: text to token ids and back.
 *
 * One handle type serves every tokenizer meshtrain knows:
 *  - "byte": the byte-level tokenizer (ids 0..255 are bytes, 256 ends a
 *    document, 257 pads; vocabulary 258), needing no file;
 *  - a Hugging Face tokenizer.json (the file, or a directory holding it,
 *    whose tokenizer_config.json names the BOS and EOS tokens and the chat
 *    template), applied exactly as the Rust `tokenizers` library applies it
 *    (doc/tokenizer.md).
 * Resolving a model name to a directory is the hf layer's job; this layer
 * takes paths only.
 *
 * A loaded tokenizer is read-only: encode and decode may run on it from
 * several threads at once, each with its own output buffers. */
#ifndef MT_TOKENIZER_H
#define MT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_tokenizer mt_tokenizer_t;

/* A growable array of ids: encode appends to it.  Zero-initialise it;
 * free with mt_ids_free. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} mt_ids_t;

/* A growable byte string: decode appends to it (always NUL-terminated
 * after a successful call).  Zero-initialise it; free with mt_text_free. */
typedef struct {
    char *s;
    size_t n, cap;
} mt_text_t;

void mt_ids_free(mt_ids_t *ids);
void mt_text_free(mt_text_t *t);
mt_status_t mt_ids_push(mt_ids_t *ids, int32_t id);
mt_status_t mt_text_append(mt_text_t *t, const char *s, size_t n);

/* "byte", a tokenizer.json path, or a directory with a tokenizer.json.
 * Errors name the file and what in it is wrong or unsupported. */
mt_status_t mt_tokenizer_load(const char *spec, mt_tokenizer_t **out);
void mt_tokenizer_free(mt_tokenizer_t *t);

/* Encode len bytes of text, appending ids.  add_special applies the
 * post-processor (BOS/EOS as the tokenizer's template says). */
mt_status_t mt_tokenizer_encode(const mt_tokenizer_t *t, const char *text, size_t len,
                                bool add_special, mt_ids_t *ids);
/* Decode n ids, appending text.  skip_special drops special tokens.  An id
 * outside the vocabulary is an error naming it. */
mt_status_t mt_tokenizer_decode(const mt_tokenizer_t *t, const int32_t *ids, size_t n,
                                bool skip_special, mt_text_t *out);

/* The number of ids: every id is in [0, vocab_size). */
int64_t mt_tokenizer_vocab_size(const mt_tokenizer_t *t);
/* The id of a token's exact string (added tokens included), or -1. */
int32_t mt_tokenizer_token_to_id(const mt_tokenizer_t *t, const char *token);
/* The string of an id (NULL outside the vocabulary). */
const char *mt_tokenizer_id_to_token(const mt_tokenizer_t *t, int32_t id);
/* BOS and EOS ids, or -1 where the tokenizer has none.  EOS is what
 * meshtrain-data appends to each document and where generation stops. */
int32_t mt_tokenizer_bos_id(const mt_tokenizer_t *t);
int32_t mt_tokenizer_eos_id(const mt_tokenizer_t *t);
/* "byte" or "tokenizer.json"; and the file it came from ("" for byte). */
const char *mt_tokenizer_kind(const mt_tokenizer_t *t);
const char *mt_tokenizer_path(const mt_tokenizer_t *t);
/* The chat template string of tokenizer_config.json, or NULL. */
const char *mt_tokenizer_chat_template(const mt_tokenizer_t *t);

#ifdef __cplusplus
}
#endif
#endif
