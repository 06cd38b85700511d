/* mt_data.h: token datasets and the sampling contract.
 *
 * Two memory-mapped, validated formats:
 *  - llm.c token files: a header of 256 int32 (magic 20240520, version 1,
 *    token count at header[2]) then uint16 tokens; the file size must equal
 *    header + tokens exactly;
 *  - Megatron-LM indexed datasets: PREFIX.idx (magic "MMIDIDX\0\0",
 *    version 1, a dtype code, sequence sizes and pointers, document index)
 *    plus PREFIX.bin.
 * Every token is checked against the vocabulary at open, and again in
 * every window handed out for training (mt_dataset_check): the file is a
 * shared mapping, so a file rewritten or truncated under a running job
 * must not reach the embedding (ids past the table) or fault (SIGBUS).
 * A bad file is an MT_ERR_IO error naming the file and what is wrong.
 *
 * Sampling is fixed by contract so runs compare across meshes and tools
 * (doc/data.md): sample i is tokens[i*S .. i*S+S] (inputs the first S,
 * targets the last S, S = seq_len); with shuffle off, step t uses samples
 * t*G .. t*G+G-1 in order (G = global batch); DP rank d takes the d-th
 * contiguous block of G/dp; its micro-steps take consecutive local-batch
 * slices of that block.  With shuffle on, sample indices go through a
 * permutation fixed by (seed, epoch).  Epochs roll over. */
#ifndef MT_DATA_H
#define MT_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "mt_config.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Special tokens of the byte-level tokenizer (meshtrain-data): ids 0..255
 * are bytes. */
#define MT_TOKEN_EOD 256   /* end of document */
#define MT_TOKEN_PAD 257
#define MT_TOKENIZER_VOCAB 258
#define MT_IGNORE_INDEX (-100)

typedef struct mt_dataset {
    char path[MT_PATH_MAX];   /* as given (llm.c file or Megatron prefix) */
    mt_data_format_t format;  /* resolved: MT_DATA_LLMC or MT_DATA_MEGATRON */
    int64_t n_tokens;
    int token_bytes;          /* 2 or 4 */
    const void *tokens;       /* into the mapping */
    /* Document starts as token offsets: doc_start[0] = 0, ...,
     * doc_start[n_docs] = n_tokens.  llm.c files: split at MT_TOKEN_EOD
     * (the EOD token ends its document). */
    int64_t n_docs;
    int64_t *doc_start;       /* owned */
    /* mappings (owned) */
    void *map[2];
    size_t map_len[2];
    /* ---- the per-batch checks (mt_dataset_check) ---- */
    int64_t vocab_size;       /* as opened: every token handed out is below it */
    int tok_fd;               /* the token file, kept open for fstat; -1 none */
    size_t tok_len;           /* its size when mapped */
    size_t tok_off;           /* byte offset of token 0 in it (the llm.c header) */
    char tok_file[MT_PATH_MAX + 8]; /* its name (PREFIX.bin for Megatron) */
    /* ---- loss masks and concatenations (data_mask.c) ---- */
    const unsigned char *mask; /* n_tokens bytes, 0 or 1, into mask_map; NULL: none */
    void *mask_map;
    size_t mask_len;
    char mask_path[MT_PATH_MAX + 16];
    /* a concatenation (mt_dataset_concat): the parts, owned, in order;
     * tokens and mask are then NULL and reads go to the parts */
    int n_parts;
    struct mt_dataset *parts;
    int64_t *part_start;      /* [n_parts + 1]: first token of each part */
} mt_dataset_t;

/* Open, map and validate.  fmt MT_DATA_AUTO detects by magic: a file with
 * the llm.c magic, or PREFIX.idx/.bin (PATH may be the prefix, PREFIX.bin
 * or PREFIX.idx).  Every token must be < vocab_size. */
mt_status_t mt_dataset_open(mt_dataset_t *ds, const char *path, mt_data_format_t fmt,
                            int64_t vocab_size);
void mt_dataset_close(mt_dataset_t *ds);

/* Copy tokens [start, start+n) as int32. */
void mt_dataset_read(const mt_dataset_t *ds, int64_t start, int64_t n, int32_t *out);

/* The checks before tokens [start, start+n) are handed out: the token
 * file still holds the window (fstat against the mapped size, so a shrunk
 * file is an error, not SIGBUS on the read) and every id in it is in
 * [0, vocab_size).  Errors name the file and the byte offset.  A
 * concatenation checks the parts the window covers. */
mt_status_t mt_dataset_check(const mt_dataset_t *ds, int64_t start, int64_t n);

/* Samples of length seq_len: floor((n_tokens - 1) / seq_len). */
int64_t mt_dataset_num_samples(const mt_dataset_t *ds, int64_t seq_len);

typedef struct {
    int64_t num_samples;
    int64_t seq_len;
    bool shuffle;
    uint64_t seed;
} mt_sampler_t;

/* Dataset sample index of the c-th sample drawn since the start of
 * training (c counts across epochs). */
int64_t mt_sampler_index(const mt_sampler_t *s, int64_t c);

/* The draw count c of the first sample of a micro-batch: samples of a
 * step are drawn in global-batch order, DP rank d taking the d-th block of
 * global/dp_size and each micro-step the next `local` of them. */
int64_t mt_batch_first(int64_t step, int64_t global, int64_t dp_rank, int64_t dp_size,
                       int64_t micro, int64_t local);

/* Fill one micro-batch: `local` samples for DP rank dp_rank of dp_size at
 * optimizer step `step` (0-based), micro-step `micro`, with global batch
 * `global`.  inputs and targets are [local, seq_len]. */
mt_status_t mt_data_fill_batch(const mt_dataset_t *ds, const mt_sampler_t *s, int64_t step,
                               int64_t global, int64_t dp_rank, int64_t dp_size,
                               int64_t micro, int64_t local, int32_t *inputs,
                               int32_t *targets);

/* Sample i of length S: inputs tokens[i*S, i*S+S), targets one token on,
 * MT_IGNORE_INDEX where the loss mask is 0; its window mt_dataset_check'ed
 * first (the batch fillers return its error). */
mt_status_t mt_data_fill_sample(const mt_dataset_t *ds, int64_t i, int64_t S, int32_t *inputs,
                                int32_t *targets);

/* ---- loss masks and concatenations (data_mask.c) ----
 *
 * The loss mask of the token file at PATH is PATH.lossmask (a Megatron
 * prefix P: P.lossmask): the magic "MTLMASK1", a little-endian uint64
 * token count equal to the dataset's, then one byte per token, 0 or 1; the
 * file is exactly 16 + n_tokens bytes.  mask[j] 0 leaves token j out of
 * the loss where it is a target (the target becomes MT_IGNORE_INDEX). */

/* The mask path of a dataset opened from path (into out, cap bytes). */
void mt_dataset_mask_path(const mt_dataset_t *ds, char *out, size_t cap);

/* Open and validate ds's mask by mode: AUTO when the file exists (*found
 * tells), REQUIRED always (a missing file is an error), OFF never. */
mt_status_t mt_dataset_open_mask(mt_dataset_t *ds, mt_loss_mask_t mode, bool *found);

/* Masks of tokens [start, start+n): 1 where there is no mask. */
void mt_dataset_read_mask(const mt_dataset_t *ds, int64_t start, int64_t n, unsigned char *out);
/* For readers of a concatenation: read(part, at, k, out) for each part
 * covering tokens [start, start+n), out advanced by elem bytes a token. */
void mt_dataset_each_part(const mt_dataset_t *ds, int64_t start, int64_t n, void *out,
                          size_t elem,
                          void (*read)(const mt_dataset_t *, int64_t, int64_t, void *));

/* ds: the n parts (opened; moved into ds, which owns and frees them)
 * concatenated in order.  A part boundary is a document boundary.  Every
 * part must have the same token width (mixing them mixes tokenizers). */
mt_status_t mt_dataset_concat(mt_dataset_t *ds, mt_dataset_t *parts, int n);

/* Parts holding a mask, of n_parts (1 for a plain dataset). */
int mt_dataset_masked_parts(const mt_dataset_t *ds);

/* ---- writing (meshtrain-data, tests) ---- */

/* Byte-level tokenization: bytes are ids 0..255. Returns tokens written. */
int64_t mt_tokenize_bytes(const unsigned char *text, int64_t len, int32_t *out);

/* Write an llm.c token file (uint16) or a Megatron prefix (.bin/.idx,
 * uint16 tokens, one sequence per document).  doc_start as above. */
mt_status_t mt_write_llmc(const char *path, const int32_t *tokens, int64_t n);
mt_status_t mt_write_megatron(const char *prefix, const int32_t *tokens, int64_t n,
                              const int64_t *doc_start, int64_t n_docs);

/* meshtrain-data --inspect: a token file's format, counts, token range
 * and first 64 tokens, every token checked against vocab.  Returns the
 * exit code (0 ok, 1 error, printed to err). */
int mt_data_inspect(const char *path, int64_t vocab, FILE *out, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
