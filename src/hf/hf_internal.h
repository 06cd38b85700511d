/* hf_internal.h: what the Hugging Face interchange files share:
 * hf_json.c (JSON through jansson), safetensors.c (the file format, dtype
 * conversion), hf_config.c (config.json -> the model section),
 * hf_config_out.c (the tensor list, the model section -> config.json),
 * hf_source.c (a directory's safetensors: open, check, read blocks),
 * hf_resolve.c (a model by name), hf_export.c and hf_import.c (the
 * collective export and import), hf_consolidate.c (a training run's
 * consolidated save, through hf_export.c's writer), hf_load.c (weights at
 * start), hf_cli.c (their command line).  Not installed: callers use
 * mt_hf.h. */
#ifndef MT_HF_INTERNAL_H
#define MT_HF_INTERNAL_H

#include <jansson.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_bf16.h"
#include "mt_config.h"
#include "mt_hf.h"
#include "mt_status.h"

#define MT_HF_NAME_MAX 200    /* tensor names (the checkpoint's paths hold 256) */
#define MT_ST_MAX_DIMS 8
/* config.json bounds: layer, head and expert counts; every other size */
#define MT_HF_COUNT_MAX (INT64_C(1) << 16)
#define MT_HF_SIZE_MAX (INT64_C(1) << 32)
#define MT_ST_MAX_HEADER (100u << 20) /* as the safetensors reference reader */
#define MT_HF_INDEX "model.safetensors.index.json"
#define MT_HF_SINGLE "model.safetensors"

/* ------------------------------------------------------------ JSON */

#define MT_HF_JSON_MAX_DEPTH 256 /* nesting levels (a plain literal: messages stringify it) */

/* Parse text[0, len) as one JSON document of any type: duplicate keys,
 * text after the value, nesting beyond MT_HF_JSON_MAX_DEPTH and what
 * jansson refuses are MT_ERR_IO errors "NAME:LINE:COL: what (found TOKEN)".
 * Integers that fit long long are JSON integers, exactly; larger ones are
 * refused.  Release *out with json_decref. */
mt_status_t mt_hf_json_parse(const char *text, size_t len, const char *name, json_t **out);

/* Read a whole file (over max_bytes is refused) and parse it. */
mt_status_t mt_hf_json_load(const char *path, size_t max_bytes, json_t **out);

/* "null", "boolean", "number", "string", "array" or "object", for messages. */
const char *mt_hf_json_type(const json_t *v);

/* ------------------------------------------------------------ dtypes */

typedef enum { MT_ST_F32, MT_ST_BF16, MT_ST_F16, MT_ST_OTHER } mt_st_dtype_t;

size_t mt_st_dtype_size(mt_st_dtype_t d);     /* 0 for MT_ST_OTHER */
const char *mt_st_dtype_name(mt_st_dtype_t d); /* "F32", "BF16", "F16" */

/* bf16 conversions: mt_bf16.h (mt_f32_to_bf16, mt_bf16_to_f32) */
float mt_f16_to_f32(uint16_t h);

/* n values to/from little-endian bytes of dtype d (F32, BF16 or F16;
 * encoding writes F32 or BF16 only). */
void mt_st_encode(const float *src, size_t n, mt_st_dtype_t d, unsigned char *dst);
void mt_st_decode(const unsigned char *src, size_t n, mt_st_dtype_t d, float *dst);

/* ------------------------------------------------------------ safetensors files */

typedef struct {
    char name[MT_HF_NAME_MAX];
    mt_st_dtype_t dtype;
    char dtype_text[16];         /* as written, for messages about MT_ST_OTHER */
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    uint64_t begin, end;         /* data_offsets: relative to the data start */
} mt_st_entry_t;

typedef struct {
    char path[4096];
    uint64_t data_start;         /* 8 + header length */
    uint64_t file_size;
    mt_st_entry_t *e;
    int n;
} mt_st_file_t;

/* Read and check a safetensors header: 8-byte little-endian length, a JSON
 * object of tensors (and an optional "__metadata__" of strings), shapes and
 * offsets consistent with the dtypes, inside the file, not overlapping. */
mt_status_t mt_st_read_header(const char *path, mt_st_file_t *f);
void mt_st_file_free(mt_st_file_t *f);

/* The header of n tensors as written: the 8-byte length, then the JSON
 * padded with spaces to a multiple of 8 (malloc'd into *bytes, *len). */
mt_status_t mt_st_header_bytes(const mt_st_entry_t *e, int n, unsigned char **bytes, size_t *len);

/* ------------------------------------------------------------ config.json */

/* The Hugging Face architectures meshtrain computes (hf_config.c), with
 * the transformers class defaults of what a config.json may leave out. */
typedef enum { MT_HF_DENSE, MT_HF_QWEN3_MOE, MT_HF_MIXTRAL, MT_HF_OLMOE } mt_hf_moe_t;
typedef struct {
    mt_arch_t arch;
    const char *cls, *type;  /* "LlamaForCausalLM", "llama" */
    int64_t max_pos;
    double eps, theta;
    mt_hf_moe_t moe;         /* which MoE fields it has */
    bool qk_norm;
} mt_hf_arch_t;
extern const mt_hf_arch_t mt_hf_archs[];
extern const int mt_hf_narchs;
const mt_hf_arch_t *mt_hf_arch(mt_arch_t a); /* NULL for MT_ARCH_AUTO */

/* One tensor of the model: Hugging Face name and PyTorch shape. */
typedef struct {
    char name[MT_HF_NAME_MAX];
    int ndim;
    int64_t shape[2];
} mt_hf_tensor_t;

/* The tensors meshtrain's dense model has for this model section, in the
 * trainer's order (embedding, layers, final norm, lm_head unless tied),
 * with the unpadded vocabulary, as checkpoints store them.  malloc'd. */
mt_status_t mt_hf_expected_tensors(const mt_model_config_t *m, mt_hf_tensor_t **out, int *n);

/* config.json (parsed) into the model section; refuses architectures and
 * features the dense model does not have, naming them.  Notes (ignored
 * keys) go to `note` if not NULL. */
mt_status_t mt_hf_config_to_model(const json_t *j, const char *name, mt_model_config_t *m,
                                  FILE *note);

/* config.json text for the model section (malloc'd). */
mt_status_t mt_hf_config_json(const mt_model_config_t *m, mt_st_dtype_t dtype, char **text);

/* ------------------------------------------------------------ a directory's weights */

/* The safetensors files of a Hugging Face directory, headers read. */
typedef struct {
    mt_st_file_t *f;
    int nf;
} mt_hf_source_t;

/* model.safetensors, or model.safetensors.index.json and every shard it
 * names (a shard it names that is missing is an error naming both); the
 * index and the shards' headers must list the same tensors. */
mt_status_t mt_hf_source_open(mt_hf_source_t *src, const char *hf_dir);
void mt_hf_source_free(mt_hf_source_t *src);

/* The tensor called name (and its file's index in *file), or NULL. */
const mt_st_entry_t *mt_hf_source_find(const mt_hf_source_t *src, const char *name, int *file);

/* Every tensor of t[0, n) present with its shape and a readable dtype, and
 * no other (but RoPE's inv_freq, and lm_head when tied: noted to `note`). */
mt_status_t mt_hf_source_check(const mt_hf_source_t *src, const mt_hf_tensor_t *t, int n,
                               const mt_model_config_t *m, const char *hf_dir, FILE *note);

/* Rows [row_lo, row_lo + rows) x columns [col_lo, col_lo + ncols) of e
 * (ncols 0: every column; dims past the first are the columns), as float32
 * into dst, row-major: pread in chunks, never the whole file. */
mt_status_t mt_hf_read_block(const mt_st_file_t *f, const mt_st_entry_t *e, int64_t row_lo,
                             int64_t rows, int64_t col_lo, int64_t ncols, float *dst);

/* "[128]", "[64, 128]"; a buffer of MT_HF_SHAPE_TEXT_CAP holds any
 * MT_ST_MAX_DIMS-dimensional shape, a smaller one ends "...]". */
#define MT_HF_SHAPE_TEXT_CAP (MT_ST_MAX_DIMS * 22 + 8)
void mt_hf_shape_text(int ndim, const int64_t *shape, char *buf, size_t cap);

/* MT_OK when tensor e of the file at path has shape[0, ndim); else the
 * MT_ERR_IO error "PATH: tensor NAME has shape [..], PRE [..]POST". */
mt_status_t mt_hf_check_shape(const char *path, const mt_st_entry_t *e, int ndim,
                              const int64_t *shape, const char *pre, const char *post);

/* Parse "5GB", "500MB", "10KiB", "123" (bytes) into *bytes. */
mt_status_t mt_hf_parse_size(const char *s, int64_t *bytes);

/* ------------------------------------------------------------ writing a model directory (hf_export.c) */

/* The files of a model directory and where each tensor's bytes go: the
 * tensors in the trainer's order, shards by size as transformers makes
 * them.  Every rank computes the same plan from the same inputs. */
typedef struct {
    mt_hf_tensor_t *t; /* in the trainer's order */
    int n;
    mt_st_entry_t *e;  /* the same tensors as safetensors entries (dtype per tensor) */
    int *shard;        /* shard of each tensor */
    int nshards;
    uint64_t *data_bytes; /* per shard */
    uint64_t total;
} mt_hf_plan_t;

/* The plan of the model section's tensors: tensor i in dtypes[i] (NULL:
 * all in dtype, F32, BF16 or F16); a new shard starts when the next tensor
 * would take one over max_shard data bytes. */
mt_status_t mt_hf_plan(mt_hf_plan_t *p, const mt_model_config_t *m, const mt_st_dtype_t *dtypes,
                       mt_st_dtype_t dtype, int64_t max_shard);
void mt_hf_plan_free(mt_hf_plan_t *p);

/* MT_ERR_UNSUPPORTED naming `what` when the model section cannot be
 * written as its Hugging Face architecture (a Qwen3-MoE without q/k norms,
 * experts that drop tokens, and whatever mt_hf_config_json refuses). */
mt_status_t mt_hf_check_writable(const mt_model_config_t *m, const char *what);

/* The model's Hugging Face architecture ("LlamaForCausalLM", ...), AUTO
 * resolved: for progress lines. */
const char *mt_hf_arch_name(const mt_model_config_t *m);

/* Where a rank's values of each tensor come from.  get is called on every
 * rank for every tensor of the plan, in order (it may be collective):
 * *b = {first row, rows, first column, columns} of this rank's block of
 * tensor i (rows 0: nothing), *v its values as row-major host floats,
 * valid until the next call.  Every rank's blocks together must cover
 * each tensor exactly once. */
typedef struct mt_hf_rows mt_hf_rows_t;
struct mt_hf_rows {
    mt_status_t (*get)(mt_hf_rows_t *r, MPI_Comm comm, const mt_hf_plan_t *p, int i, int64_t b[4],
                       const float **v);
};

/* Collective.  The shards of p in dir (an existing directory): rank 0
 * creates each file at its full size with its header, then every rank
 * writes the bytes of its blocks at their offsets (pwrite) and syncs;
 * then rank 0 writes model.safetensors.index.json when there are several
 * shards.  config.json is the caller's.  Agreed. */
mt_status_t mt_hf_write_weights(MPI_Comm comm, const char *dir, const mt_hf_plan_t *p,
                                mt_hf_rows_t *src, FILE *out);

/* A checkpoint's /model tensors as such a source (hf_export.c): tensor i
 * of the plan is /model/<t[i].name> of the open model.h5, each rank
 * reading an even share of its rows.  mt_hf_h5_get is its get. */
typedef struct mt_ckpt_h5_reader mt_ckpt_h5_reader_t;
typedef struct {
    mt_hf_rows_t base; /* first: the callback's argument is this */
    mt_ckpt_h5_reader_t *rd;
    float *buf;
    size_t cap; /* floats */
} mt_hf_h5_rows_t;
mt_status_t mt_hf_h5_get(mt_hf_rows_t *base, MPI_Comm comm, const mt_hf_plan_t *p, int i,
                         int64_t b[4], const float **v);

/* float32 to IEEE half, rounded to nearest even: overflow to infinity,
 * underflow through the subnormals to zero, NaN kept NaN (quiet) with
 * the top of its payload.  The writer's F16 encoding. */
uint16_t mt_f32_to_f16(float f);

/* dir/name holds text, synced (not collective). */
mt_status_t mt_hf_write_text(const char *dir, const char *name, const char *text);

/* mkdir -p (not collective). */
mt_status_t mt_hf_mkdir_p(const char *dir);

/* Rank 0's *text (malloc'd) on every rank. */
mt_status_t mt_hf_bcast_text(MPI_Comm comm, char **text);

#endif
