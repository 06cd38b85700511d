/* test_tokenizer_hf.c: Hugging Face tokenizer.json files through the
 * public API, on small hand-made files: the BPE merge order, byte_fallback
 * and the unknown token, added tokens and their flags, the template with
 * add_special, BOS/EOS from the template and from tokenizer_config.json,
 * the decoders, invalid UTF-8 input, concurrent encodes, and the errors
 * for bad or unsupported files (each naming the file). */
#include <config.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mt_tokenizer.h"
#include "mt_test.h"

static char dir[256];

static const char *put(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

/* The ids of text, as a space-separated string. */
static const char *ids_of(const mt_tokenizer_t *t, const char *text, bool special)
{
    static char buf[1024];
    mt_ids_t ids = {0};
    buf[0] = 0;
    if (mt_tokenizer_encode(t, text, strlen(text), special, &ids) != MT_OK)
        return mt_error_message();
    for (size_t i = 0; i < ids.n; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), i ? " %d" : "%d", ids.v[i]);
    mt_ids_free(&ids);
    return buf;
}

static const char *dec_of(const mt_tokenizer_t *t, const int32_t *ids, size_t n, bool skip)
{
    static char buf[1024];
    mt_text_t out = {0};
    if (mt_tokenizer_decode(t, ids, n, skip, &out) != MT_OK)
        return mt_error_message();
    snprintf(buf, sizeof buf, "%s", out.s);
    mt_text_free(&out);
    return buf;
}

#define EXPECT_IDS(t, text, special, want)                                      \
    do {                                                                        \
        const char *got_ = ids_of((t), (text), (special));                      \
        CHECK(strcmp(got_, (want)) == 0, "\"%s\": ids \"%s\", want \"%s\"", (text), got_, (want)); \
    } while (0)

/* A WhitespaceSplit BPE over a few letters; merges in "a b" form. */
static const char *WS_BPE =
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
    " \"added_tokens\": [\n"
    "  {\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": false},\n"
    "  {\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": false},\n"
    "  {\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": false},\n"
    "  {\"id\": 15, \"content\": \"[X]\", \"special\": false, \"normalized\": false, \"lstrip\": true, \"rstrip\": true, \"single_word\": false},\n"
    "  {\"id\": 16, \"content\": \"tok\", \"special\": false, \"normalized\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": true}],\n"
    " \"normalizer\": null,\n"
    " \"pre_tokenizer\": {\"type\": \"WhitespaceSplit\"},\n"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}],\n"
    "   \"pair\": [], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}, \"</s>\": {\"id\": \"</s>\", \"ids\": [2], \"tokens\": [\"</s>\"]}}},\n"
    " \"decoder\": null,\n"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"fuse_unk\": %s, \"byte_fallback\": true,\n"
    "  \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"a\": 3, \"b\": 4, \"c\": 5, \"ab\": 6, \"bc\": 7, \"abc\": 8, \"aa\": 9,\n"
    "            \"<0xC3>\": 10, \"<0xA9>\": 11, \"t\": 12, \"o\": 13, \"k\": 14},\n"
    "  \"merges\": [%s]}}\n";

/* A Metaspace BPE with the Llama-2-style decoder; merges as pairs. */
static const char *META_BPE =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true, \"normalized\": false}],\n"
    " \"normalizer\": null,\n"
    " \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"first\", \"split\": true},\n"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],\n"
    "   \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [0], \"tokens\": [\"<s>\"]}}},\n"
    " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"first\", \"split\": true},\n"
    " \"model\": {\"type\": \"BPE\", \"byte_fallback\": false, \"ignore_merges\": false,\n"
    "  \"vocab\": {\"<s>\": 0, \"\\u2581\": 1, \"h\": 2, \"i\": 3, \"\\u2581h\": 4, \"\\u2581hi\": 5, \"x\": 6},\n"
    "  \"merges\": [[\"\\u2581\", \"h\"], [\"\\u2581h\", \"i\"]]}}\n";

static mt_tokenizer_t *load_text(const char *text, const char *name)
{
    mt_tokenizer_t *t = NULL;
    const char *p = put(name, text);
    CHECK(mt_tokenizer_load(p, &t) == MT_OK && t, "load %s: %s", name, mt_error_message());
    return t;
}

static void expect_refused(const char *text, mt_status_t want, const char *needle)
{
    mt_tokenizer_t *t = NULL;
    const char *p = put("bad.json", text);
    mt_status_t st = mt_tokenizer_load(p, &t);
    CHECK(st == want && !t, "%s: status %d, want %d", needle, (int)st, (int)want);
    CHECK_CONTAINS(mt_error_message(), "bad.json");
    CHECK_CONTAINS(mt_error_message(), needle);
    mt_tokenizer_free(t);
}

typedef struct {
    const mt_tokenizer_t *t;
    const char *text;
    mt_ids_t ids;
    int rc;
} job_t;

static void *encode_job(void *arg)
{
    job_t *j = arg;
    for (int r = 0; r < 50 && j->rc == 0; r++) {
        j->ids.n = 0;
        j->rc = mt_tokenizer_encode(j->t, j->text, strlen(j->text), true, &j->ids) != MT_OK;
    }
    return NULL;
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s/mt-tok-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char text[4096];

    /* merge order: the lowest rank first, the leftmost among equals */
    snprintf(text, sizeof text, WS_BPE, "false", "\"b c\", \"a b\", \"a bc\", \"a a\"");
    mt_tokenizer_t *t = load_text(text, "tokenizer.json");
    if (!t)
        return mt_test_exit("test_tokenizer_hf");
    CHECK(strcmp(mt_tokenizer_kind(t), "tokenizer.json") == 0, "kind");
    CHECK(mt_tokenizer_vocab_size(t) == 17, "vocab %lld", (long long)mt_tokenizer_vocab_size(t));
    CHECK(mt_tokenizer_bos_id(t) == 1 && mt_tokenizer_eos_id(t) == 2, "BOS/EOS from the template");
    CHECK(mt_tokenizer_chat_template(t) == NULL, "no chat template");
    EXPECT_IDS(t, "abc", false, "8");      /* b+c, then a+bc */
    EXPECT_IDS(t, "aaa", false, "9 3");    /* a+a at the left first */
    EXPECT_IDS(t, "ab cab", false, "6 5 6");
    EXPECT_IDS(t, "abc", true, "1 8 2");
    /* byte_fallback: é is not a token, its bytes are; z is neither */
    EXPECT_IDS(t, "\xC3\xA9", false, "10 11");
    EXPECT_IDS(t, "azzb", false, "3 0 0 4");
    /* added tokens: before pre-tokenization, with their flags */
    EXPECT_IDS(t, "a<s>b</s>", false, "3 1 4 2");
    EXPECT_IDS(t, "ab  [X]  c", false, "6 15 5");
    EXPECT_IDS(t, "tok atok tok_ tok", false, "16 3 12 13 14 12 13 14 0 16");
    /* a combining mark is a word character to single_word */
    EXPECT_IDS(t, "tok\xCC\x81 tok", false, "12 13 14 0 16");
    /* invalid UTF-8 becomes U+FFFD, which is the unknown token here */
    EXPECT_IDS(t, "a\xFF\xFE" "b", false, "3 0 0 4");
    CHECK(mt_tokenizer_token_to_id(t, "[X]") == 15 && mt_tokenizer_token_to_id(t, "bc") == 7 &&
          mt_tokenizer_token_to_id(t, "zz") == -1, "token_to_id");
    CHECK(strcmp(mt_tokenizer_id_to_token(t, 8), "abc") == 0 &&
          mt_tokenizer_id_to_token(t, 17) == NULL, "id_to_token");
    /* no decoder: the tokens joined by spaces, as the Rust library does */
    int32_t some[] = {1, 6, 5, 2};
    CHECK(strcmp(dec_of(t, some, 4, false), "<s> ab c </s>") == 0, "decode: %s",
          dec_of(t, some, 4, false));
    CHECK(strcmp(dec_of(t, some, 4, true), "ab c") == 0, "skip_special: %s",
          dec_of(t, some, 4, true));
    int32_t bad[] = {3, 17};
    CHECK(strcmp(dec_of(t, bad, 2, false), "") != 0, "id 17");
    CHECK_CONTAINS(mt_error_message(), "id 17 at position 1");

    /* a long text (with the word cache of a call) gives the ids of its
     * words encoded alone */
    const char *phrase = "abc aaa tok [X] ab c azzb \xC3\xA9 abcabcabc aaaaaaaaaaaaa bc ";
    static char long_text[8192];
    size_t reps = 0;
    long_text[0] = 0;
    while (strlen(long_text) + strlen(phrase) < sizeof long_text) {
        strcat(long_text, phrase);
        reps++;
    }
    char once[1024];
    snprintf(once, sizeof once, "%s", ids_of(t, phrase, false));
    mt_ids_t all = {0};
    CHECK(mt_tokenizer_encode(t, long_text, strlen(long_text), false, &all) == MT_OK, "long");
    char *joined = calloc(reps, strlen(once) + 1);
    for (size_t r = 0; joined && r < reps; r++)
        sprintf(joined + strlen(joined), r ? " %s" : "%s", once);
    char *got = calloc(all.n, 12);
    for (size_t k = 0; got && k < all.n; k++)
        sprintf(got + strlen(got), k ? " %d" : "%d", all.v[k]);
    CHECK(joined && got && strcmp(joined, got) == 0, "the long text's ids differ (%zu reps)", reps);
    free(joined);
    free(got);
    mt_ids_free(&all);

    /* several threads on one tokenizer agree with one */
    job_t jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job_t){t, long_text, {0}, 0};
        pthread_create(&th[i], NULL, encode_job, &jobs[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        mt_ids_t ref = {0};
        CHECK(mt_tokenizer_encode(t, long_text, strlen(long_text), true, &ref) == MT_OK, "one");
        CHECK(jobs[i].rc == 0 && jobs[i].ids.n == ref.n &&
              memcmp(jobs[i].ids.v, ref.v, ref.n * sizeof *ref.v) == 0, "thread %d differs", i);
        mt_ids_free(&ref);
        mt_ids_free(&jobs[i].ids);
    }
    mt_tokenizer_free(t);

    /* fuse_unk; another merge order; the directory with its config */
    snprintf(text, sizeof text, WS_BPE, "true", "\"a b\", \"b c\", \"ab c\"");
    put("tokenizer.json", text);
    put("tokenizer_config.json",
        "{\"bos_token\": null, \"eos_token\": {\"content\": \"</s>\", \"lstrip\": false},\n"
        " \"chat_template\": \"{{ messages }}\", \"model_max_length\": 1000000000000000019884624838656}");
    t = NULL;
    CHECK(mt_tokenizer_load(dir, &t) == MT_OK && t, "load dir: %s", mt_error_message());
    if (t) {
        EXPECT_IDS(t, "azzzb", false, "3 0 4");
        /* as in Rust, byte-fallback bytes do not end a pending unknown token */
        EXPECT_IDS(t, "z\xC3\xA9" "a", false, "10 11 0 3");
        EXPECT_IDS(t, "abc", false, "8");
        CHECK(mt_tokenizer_bos_id(t) == 1, "null bos_token keeps the template's");
        CHECK(mt_tokenizer_eos_id(t) == 2, "eos");
        CHECK(t && mt_tokenizer_chat_template(t) &&
              strcmp(mt_tokenizer_chat_template(t), "{{ messages }}") == 0, "chat template");
        CHECK_CONTAINS(mt_tokenizer_path(t), "/tokenizer.json");
    }
    mt_tokenizer_free(t);
    put("tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
    t = NULL;
    CHECK(mt_tokenizer_load(dir, &t) == MT_ERR_CONFIG && !t, "unknown eos_token");
    CHECK_CONTAINS(mt_error_message(), "tokenizer_config.json: eos_token \"<|im_end|>\"");
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    unlink(cfg);

    /* Metaspace, prepend_scheme first, and its decoder */
    t = load_text(META_BPE, "meta.json");
    if (t) {
        EXPECT_IDS(t, "hi hix", true, "0 5 5 6");
        EXPECT_IDS(t, "hi<s>hi", false, "5 0 2 3"); /* no prepend after the start */
        CHECK(mt_tokenizer_eos_id(t) == -1 && mt_tokenizer_bos_id(t) == 0, "no EOS");
        int32_t m[] = {0, 5, 5, 6};
        CHECK(strcmp(dec_of(t, m, 4, true), "hi hix") == 0, "metaspace decode: \"%s\"",
              dec_of(t, m, 4, true));
    }
    mt_tokenizer_free(t);

    /* continuing_subword_prefix (stripped from the right part of a merge)
     * and end_of_word_suffix */
    t = load_text("{\"pre_tokenizer\": {\"type\": \"WhitespaceSplit\"}, \"model\": {\"type\": \"BPE\", "
                  "\"continuing_subword_prefix\": \"##\", \"vocab\": {\"a\": 0, \"##b\": 1, "
                  "\"##c\": 2, \"ab\": 3, \"abc\": 4}, \"merges\": [\"a ##b\", \"ab ##c\"]}}",
                  "prefix.json");
    if (t) {
        EXPECT_IDS(t, "abc acb", false, "4 0 2 1");
        CHECK(mt_tokenizer_vocab_size(t) == 5 && mt_tokenizer_eos_id(t) == -1, "prefix vocab");
    }
    mt_tokenizer_free(t);
    t = load_text("{\"pre_tokenizer\": {\"type\": \"WhitespaceSplit\"}, \"model\": {\"type\": \"BPE\", "
                  "\"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": 0, \"b</w>\": 1, "
                  "\"ab</w>\": 2, \"b\": 3, \"a</w>\": 4}, \"merges\": [\"a b</w>\"]}}",
                  "suffix.json");
    if (t)
        EXPECT_IDS(t, "ab ba", false, "2 3 4");
    mt_tokenizer_free(t);

    /* the added tokens that are not normalized are split out first, even
     * without a normalizer: "b" wins over the longer normalized "ab" */
    t = load_text("{\"added_tokens\": [{\"id\": 3, \"content\": \"ab\", \"normalized\": true, "
                  "\"special\": false}, {\"id\": 4, \"content\": \"b\", \"normalized\": false, "
                  "\"special\": true}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, "
                  "\"b\": 1, \"c\": 2}, \"merges\": []}}", "order.json");
    if (t) {
        EXPECT_IDS(t, "ab", false, "0 4");
        EXPECT_IDS(t, "cab", false, "2 0 4");
    }
    mt_tokenizer_free(t);

    /* refusals and bad files, each naming the file */
    expect_refused("{\"model\": ", MT_ERR_IO, "bad.json:1:");
    expect_refused("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", MT_ERR_UNSUPPORTED,
                   "model \"WordPiece\" is not supported");
    expect_refused("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", MT_ERR_UNSUPPORTED,
                   "model \"Unigram\"");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
                   MT_ERR_CONFIG, "model.merges[0] (\"a\" \"b\"): the right part");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}",
                   MT_ERR_CONFIG, "model.merges[0] is neither");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, "
                   "\"merges\": []}}", MT_ERR_UNSUPPORTED, "dropout");
    expect_refused("{\"truncation\": {\"max_length\": 8}, \"model\": {\"type\": \"BPE\", "
                   "\"vocab\": {\"a\": 0}, \"merges\": []}}", MT_ERR_UNSUPPORTED, "\"truncation\"");
    expect_refused("{\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}, \"model\": {\"type\": "
                   "\"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", MT_ERR_UNSUPPORTED,
                   "pre_tokenizer \"BertPreTokenizer\"");
    expect_refused("{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": "
                   "{\"id\": \"A\"}}, {\"SpecialToken\": {\"id\": \"</s>\"}}], \"special_tokens\": {}},"
                   " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                   MT_ERR_CONFIG, "single[1] names no entry of special_tokens");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {\"a\": 0}, "
                   "\"merges\": []}}", MT_ERR_CONFIG, "unk_token \"<unk>\" is not in the vocabulary");
    t = NULL;
    CHECK(mt_tokenizer_load("/nonexistent/tok", &t) == MT_ERR_IO && !t, "missing");
    CHECK_CONTAINS(mt_error_message(), "/nonexistent/tok: no such tokenizer");

    char sub[300];
    snprintf(sub, sizeof sub, "%s/empty", dir);
    CHECK(mkdir(sub, 0700) == 0, "mkdir");
    t = NULL;
    CHECK(mt_tokenizer_load(sub, &t) == MT_ERR_IO && !t, "a directory without tokenizer.json");
    CHECK_CONTAINS(mt_error_message(), "empty: no tokenizer.json in this directory");

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
    return mt_test_exit("test_tokenizer_hf");
}
