/* mt_data_write.h: turning text into token datasets (meshtrain-data's
 * library side), in parallel over a communicator.
 *
 * Inputs are text files (split into documents), JSON Lines (plain or
 * zstd-compressed .zst) with one or more text keys, or supervised
 * fine-tuning records (prompt/completion pairs or chat messages rendered
 * with the Llama 3 or ChatML template).  Outputs are Megatron-LM indexed
 * datasets (PREFIX.bin + PREFIX.idx, one document per record, the
 * tokenizer's EOS appended), llm.c token files for byte-level text, and for
 * SFT the per-token loss mask PREFIX.lossmask (doc/data.md, "Loss masks").
 *
 * Every rank reads the whole input but tokenizes only its records: record
 * g belongs to rank (g / MT_DW_CHUNK) % size.  The chunk size is fixed, so
 * the files do not depend on the rank count.  Each rank writes its part
 * at offsets known from all ranks' counts; files are written under .tmp
 * names and renamed only when every rank succeeded.  Not here: the command
 * line (src/app/data_cli.c) and resolving model names (src/hf). */
#ifndef MT_DATA_WRITE_H
#define MT_DATA_WRITE_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_status.h"
#include "mt_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_DW_CHUNK 64     /* records per ownership chunk */
#define MT_DW_MAX_KEYS 16  /* --json-keys */

/* Megatron-LM's rule (DType.optimal_dtype): uint16 when the vocabulary
 * size is below 65500, int32 otherwise. */
#define MT_DW_UINT16_VOCAB_LIMIT 65500

typedef enum { MT_DW_TEXT, MT_DW_JSONL, MT_DW_SFT } mt_dw_input_t;
typedef enum { MT_DW_PARAGRAPHS, MT_DW_LINES, MT_DW_FILE } mt_dw_docs_t;
typedef enum { MT_CHAT_AUTO, MT_CHAT_LLAMA3, MT_CHAT_CHATML } mt_chat_t;

typedef struct {
    const char *const *inputs;
    int n_inputs;
    mt_dw_input_t kind;
    mt_dw_docs_t docs;                   /* MT_DW_TEXT */
    const char *keys[MT_DW_MAX_KEYS];    /* MT_DW_JSONL: one output per key */
    int n_keys;
    const char *prompt_key, *completion_key, *messages_key; /* MT_DW_SFT */
    mt_chat_t chat;                      /* MT_DW_SFT with messages */
    bool utf8_replace;     /* invalid UTF-8 becomes U+FFFD instead of an error */
    int64_t seq_length;    /* > 0: a longer document is an error */
    int64_t vocab_size;    /* > 0: the declared id space (dtype rule) */
    bool megatron;         /* else llm.c (byte-level text only) */
    double val_fraction;   /* (0, 1): the last documents go to .val outputs */
    const char *output;    /* the prefix (or llm.c file) */
    bool progress;         /* progress lines on rank 0's err */
} mt_dw_opts_t;

/* Collective over comm: read, tokenize, write, rename.  Lines naming what
 * was written go to out on rank 0; progress to err on rank 0.  On failure
 * every rank returns the same status and message (that of the first bad
 * record in input order where a record is at fault) and no output file
 * exists under its final name. */
mt_status_t mt_data_build(MPI_Comm comm, const mt_tokenizer_t *tok, const mt_dw_opts_t *o,
                          FILE *out, FILE *err);

/* The dtype of a Megatron dataset for a vocabulary of n ids: 2 or 4 bytes. */
int mt_dw_token_bytes(int64_t vocab_size);

/* UTF-8 check (Unicode's well-formed sequences, table 3-7).  Returns the
 * offset of the first ill-formed byte, or -1 when s is valid. */
int64_t mt_utf8_invalid_at(const char *s, size_t n);
/* s with each maximal ill-formed subpart replaced by U+FFFD (as Python's
 * bytes.decode('utf-8', 'replace') does), appended to out. */
mt_status_t mt_utf8_replace(const char *s, size_t n, mt_text_t *out);

/* ---- SFT records (data_sft.c) ---- */

/* The template to render messages with: `want` when not MT_CHAT_AUTO,
 * else detected from the tokenizer's chat template; other templates are
 * refused by name. */
mt_status_t mt_chat_resolve(const mt_tokenizer_t *tok, mt_chat_t want, mt_chat_t *out);
const char *mt_chat_name(mt_chat_t c);

/* Tokenize one JSON record (a parsed json_t *, passed as void * to keep
 * jansson out of this header) into ids and a 0/1 mask, appended.  where
 * ("FILE:LINE") prefixes errors. */
mt_status_t mt_sft_record(const mt_tokenizer_t *tok, const mt_dw_opts_t *o, const void *record,
                          const char *where, mt_ids_t *ids, mt_text_t *mask);

#ifdef __cplusplus
}
#endif
#endif
