/* tokenizer_hf.h: the parsed form of a Hugging Face tokenizer.json and the
 * pieces of its pipeline (tokenizer_hf_*.c).  Everything here is built by
 * the loader and read-only afterwards; the scratch state an encode needs
 * (regex match data, piece lists) lives in the caller's hf_scratch. */
#ifndef MT_TOKENIZER_HF_H
#define MT_TOKENIZER_HF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer_internal.h"

typedef struct hf_regex hf_regex;

/* JSON helpers (tokenizer_hf_util.c); json arguments are jansson's json_t,
 * kept out of this header.  what names the place in the file. */
mt_status_t hf_json_type(const void *json, const char *file, const char *what,
                         const char **type);
const char *hf_json_str(const void *json, const char *key); /* NULL unless a string */
bool hf_json_bool(const void *json, const char *key, bool dflt);
/* A {"String": s} or {"Regex": r} pattern. */
mt_status_t hf_json_pattern(const void *json, const char *key, const char *file, const char *what,
                            hf_regex **out, char **literal);

/* ---- strings, pieces, maps (tokenizer_hf_util.c) ---- */
typedef struct {
    char *s;
    size_t n, cap;
} hf_buf;

mt_status_t hf_buf_add(hf_buf *b, const char *s, size_t n);
void hf_buf_free(hf_buf *b);

/* A list of pieces of text, each a byte range of buf.  first: the piece
 * starts at the start of the original input (Metaspace's "first"). */
typedef struct {
    size_t off, len;
    bool first;
} hf_piece;

typedef struct {
    hf_buf buf;
    hf_piece *p;
    size_t np, cap;
} hf_pieces;

/* Append a piece (empty ones are dropped, as the Rust library drops them). */
mt_status_t hf_pieces_add(hf_pieces *ps, const char *s, size_t n, bool first);
void hf_pieces_reset(hf_pieces *ps);
void hf_pieces_free(hf_pieces *ps);

/* Decode one UTF-8 character of valid text; returns its length. */
int hf_utf8_next(const char *s, size_t n, int32_t *cp);
int hf_utf8_put(int32_t cp, char *out); /* returns 1..4 */
/* Replace each maximal invalid subsequence by U+FFFD, as the WHATWG
 * TextDecoder (and Rust's from_utf8_lossy) do. */
mt_status_t hf_utf8_sanitize(const char *s, size_t n, hf_buf *out);
bool hf_utf8_valid(const char *s, size_t n);

bool hf_is_whitespace(int32_t cp); /* Rust's char::is_whitespace */
bool hf_is_numeric(int32_t cp);    /* Rust's char::is_numeric (N*) */
bool hf_is_punct(int32_t cp);      /* ASCII punctuation or P* */
bool hf_is_alnum(int32_t cp);

/* A string -> int32 map with open addressing; the keys are copied. */
typedef struct {
    char **key;
    size_t *klen;
    int32_t *val;
    size_t mask, n;
} hf_strmap;

mt_status_t hf_strmap_put(hf_strmap *m, const char *k, size_t n, int32_t v);
int32_t hf_strmap_get(const hf_strmap *m, const char *k, size_t n); /* -1 if absent */
void hf_strmap_free(hf_strmap *m);

/* A compiled regex (PCRE2, UTF + UCP), or a literal string pattern. */
mt_status_t hf_regex_compile(const char *pattern, bool literal, const char *file,
                             const char *what, hf_regex **out);
void hf_regex_free(hf_regex *r);

/* One match/non-match range of a piece. */
typedef struct {
    size_t a, b;
    bool match;
} hf_range;

typedef struct {
    hf_range *r;
    size_t n, cap;
} hf_ranges;

/* Per-call scratch: match data for the regexes, range and piece lists. */
typedef struct {
    void *md; /* pcre2_match_data, created on first use */
    hf_ranges rg, rg2;
    hf_pieces a, b;
    hf_buf t1, t2;
    void *cache; /* the pieces of this call already encoded (tokenizer_hf_encode.c) */
} hf_scratch;

void hf_scratch_free(hf_scratch *sc);
/* The match and gap ranges of s, covering s (Rust's find_matches). */
mt_status_t hf_regex_ranges(const hf_regex *r, const char *s, size_t n, hf_scratch *sc,
                            hf_ranges *out);
mt_status_t hf_ranges_add(hf_ranges *rs, size_t a, size_t b, bool match);

/* ---- normalizers (tokenizer_hf_norm.c) ---- */
typedef enum {
    HF_N_NFC, HF_N_NFD, HF_N_NFKC, HF_N_NFKD, HF_N_LOWER, HF_N_REPLACE, HF_N_PREPEND,
    HF_N_STRIP, HF_N_SEQ
} hf_norm_kind;

typedef struct hf_norm {
    hf_norm_kind kind;
    hf_regex *re;        /* REPLACE */
    char *content;       /* REPLACE, PREPEND */
    bool left, right;    /* STRIP */
    struct hf_norm **sub;
    size_t nsub;
} hf_norm;

mt_status_t hf_norm_parse(const void *json, const char *file, hf_norm **out);
void hf_norm_free(hf_norm *n);
/* Normalize s into out (replacing out's content). */
mt_status_t hf_norm_apply(const hf_norm *n, const char *s, size_t len, hf_scratch *sc,
                          hf_buf *out);

/* ---- pre-tokenizers (tokenizer_hf_pretok.c) ---- */
typedef enum {
    HF_SPLIT_REMOVED, HF_SPLIT_ISOLATED, HF_SPLIT_PREV, HF_SPLIT_NEXT, HF_SPLIT_CONTIG
} hf_split_behavior;

typedef enum {
    HF_P_BYTELEVEL, HF_P_SPLIT, HF_P_METASPACE, HF_P_DIGITS, HF_P_PUNCT, HF_P_WHITESPACE,
    HF_P_WSSPLIT, HF_P_SEQ
} hf_pretok_kind;

typedef enum { HF_PREPEND_ALWAYS, HF_PREPEND_FIRST, HF_PREPEND_NEVER } hf_prepend;

typedef struct hf_pretok {
    hf_pretok_kind kind;
    bool add_prefix_space, use_regex; /* BYTELEVEL */
    hf_regex *re;                     /* SPLIT, BYTELEVEL (use_regex), WHITESPACE */
    hf_split_behavior behavior;       /* SPLIT, PUNCT */
    bool invert;                      /* SPLIT */
    char repl[8];                     /* METASPACE: the replacement character */
    int32_t repl_cp;
    hf_prepend prepend;               /* METASPACE */
    bool split;                       /* METASPACE */
    bool individual;                  /* DIGITS */
    struct hf_pretok **sub;
    size_t nsub;
} hf_pretok;

mt_status_t hf_pretok_parse(const void *json, const char *file, hf_pretok **out);
void hf_pretok_free(hf_pretok *p);
/* Apply to the pieces in *io (replaced by the result). */
mt_status_t hf_pretok_apply(const hf_pretok *p, hf_pieces **io, hf_scratch *sc);
/* Apply a split behaviour to the ranges of one piece, appending to out. */
mt_status_t hf_split_apply(const char *s, const hf_ranges *rg, hf_split_behavior b, bool invert,
                           bool first, hf_ranges *tmp, hf_pieces *out);
/* The byte -> character table of ByteLevel (GPT-2's bytes_to_unicode). */
int32_t hf_bytelevel_char(unsigned char b);
int hf_bytelevel_byte(int32_t cp); /* -1 for characters outside the table */

/* ---- the BPE model (tokenizer_hf_bpe.c) ---- */
/* One slot per pair, key and value together: one cache line per probe. */
typedef struct {
    uint64_t key; /* (left id << 32 | right id) + 1; 0 is empty */
    int32_t rank, merged;
} hf_merge_slot;

typedef struct {
    hf_merge_slot *slot;
    size_t mask;
} hf_merges;

typedef struct {
    hf_strmap vocab;
    int32_t *cp_id;        /* id of each single-character token below 0x10000, or -1 */
    hf_merges merges;
    int32_t unk_id;        /* -1 without unk_token */
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_id[256];  /* <0xNN>, or -1 */
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix, or NULL */
} hf_bpe;

mt_status_t hf_bpe_parse(const void *json, const char *file, hf_bpe *out, int32_t *max_id);
void hf_bpe_free(hf_bpe *m);
/* Tokenize one piece, appending ids. */
mt_status_t hf_bpe_encode(const hf_bpe *m, const char *s, size_t n, mt_ids_t *ids);

/* ---- decoders (tokenizer_hf_decode.c) ---- */
typedef enum {
    HF_D_BYTELEVEL, HF_D_METASPACE, HF_D_BYTEFALLBACK, HF_D_FUSE, HF_D_STRIP, HF_D_REPLACE,
    HF_D_SEQ
} hf_dec_kind;

typedef struct hf_dec {
    hf_dec_kind kind;
    char *pattern, *content; /* REPLACE (a literal pattern) */
    char *strip;             /* STRIP: the character */
    int start, stop;         /* STRIP */
    char repl[8];            /* METASPACE */
    hf_prepend prepend;      /* METASPACE */
    struct hf_dec **sub;
    size_t nsub;
} hf_dec;

mt_status_t hf_dec_parse(const void *json, const char *file, hf_dec **out);
void hf_dec_free(hf_dec *d);

/* ---- the whole tokenizer ---- */
typedef struct {
    char *content;
    size_t len;
    char *match; /* what is matched: content, normalized where the token is */
    size_t mlen;
    int32_t id;
    bool special, lstrip, rstrip, normalized, single_word;
} hf_added;

struct mt_hftok {
    char *file;
    hf_norm *norm;
    hf_pretok *pretok;
    hf_bpe bpe;
    hf_dec *dec;
    hf_added *added;
    size_t nadded;
    hf_strmap added_map;
    /* the added tokens matched before (0) and after (1) normalization:
     * indices into added, by first byte, longest first */
    int32_t *aidx[2];
    uint32_t abeg[2][257];
    /* the post-processor, as the ids it puts around one sequence */
    int32_t *pre, *post;
    size_t npre, npost;
    /* id -> token string (model vocabulary and added tokens) */
    char **tok;
    size_t *toklen;
    bool *is_special;
    int64_t ntok;
};

mt_status_t hf_load(const char *file, struct mt_hftok **out);
mt_status_t hf_added_index(struct mt_hftok *h);
void hf_free(struct mt_hftok *h);
mt_status_t hf_encode(const struct mt_hftok *h, const char *text, size_t len, bool add_special,
                      mt_ids_t *ids);
mt_status_t hf_decode(const struct mt_hftok *h, const int32_t *ids, size_t n, bool skip_special,
                      mt_text_t *out);
int32_t hf_token_to_id(const struct mt_hftok *h, const char *token);

#endif
