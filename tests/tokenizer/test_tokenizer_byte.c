/* test_tokenizer_byte.c: the tokenizer handle with the byte-level
 * tokenizer: encode and decode round trips, the special ids, the growable
 * buffers, and the errors for an unknown id and a missing tokenizer. */
#include <config.h>

#include "mt_tokenizer.h"
#include "mt_test.h"

#include <string.h>

int main(void)
{
    mt_tokenizer_t *t = NULL;
    CHECK(mt_tokenizer_load("byte", &t) == MT_OK && t, "load byte: %s", mt_error_message());
    CHECK(strcmp(mt_tokenizer_kind(t), "byte") == 0, "kind");
    CHECK(mt_tokenizer_vocab_size(t) == 258, "vocab %lld", (long long)mt_tokenizer_vocab_size(t));
    CHECK(mt_tokenizer_eos_id(t) == 256 && mt_tokenizer_bos_id(t) == -1, "eos/bos");
    CHECK(mt_tokenizer_token_to_id(t, "<|eod|>") == 256, "eod id");
    CHECK(mt_tokenizer_token_to_id(t, "A") == 65, "A");
    CHECK(mt_tokenizer_token_to_id(t, "AB") == -1, "AB is no token");
    CHECK(strcmp(mt_tokenizer_id_to_token(t, 66), "B") == 0, "id 66");
    CHECK(mt_tokenizer_id_to_token(t, 258) == NULL, "id 258");

    /* every byte value, invalid UTF-8 included, round-trips; the buffer
     * grows past its first capacity */
    char text[3000];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = (char)(i * 7 + 3);
    mt_ids_t ids = {0};
    CHECK(mt_tokenizer_encode(t, text, sizeof text, true, &ids) == MT_OK, "encode");
    CHECK(ids.n == sizeof text, "n %zu", ids.n);
    int bad = 0;
    for (size_t i = 0; i < ids.n; i++)
        bad += ids.v[i] != (unsigned char)text[i];
    CHECK(bad == 0, "%d ids differ", bad);
    CHECK(mt_ids_push(&ids, 256) == MT_OK, "push");
    mt_text_t out = {0};
    CHECK(mt_tokenizer_decode(t, ids.v, ids.n, true, &out) == MT_OK, "decode");
    CHECK(out.n == sizeof text && memcmp(out.s, text, out.n) == 0, "skip_special round trip");
    mt_text_free(&out);
    CHECK(mt_tokenizer_decode(t, ids.v, ids.n, false, &out) == MT_OK, "decode");
    CHECK(out.n == sizeof text + 7 && strcmp(out.s + sizeof text, "<|eod|>") == 0,
          "special token text");
    mt_text_free(&out);

    int32_t badid[2] = {65, 300};
    CHECK(mt_tokenizer_decode(t, badid, 2, false, &out) == MT_ERR_RANGE, "id 300 refused");
    CHECK_CONTAINS(mt_error_message(), "id 300 at position 1");
    mt_text_free(&out);
    mt_ids_free(&ids);
    mt_tokenizer_free(t);

    CHECK(mt_tokenizer_load("", &t) == MT_ERR_CONFIG && !t, "empty spec");
    return mt_test_exit("test_tokenizer_byte");
}
