/* test_checkpoint_sha256.c: the manifest's hash, SHA-256, against the
 * FIPS 180-4 vectors and the padding boundaries (55, 56, 63, 64, 65, 119
 * and 120 bytes), in memory and streamed from a file that crosses the
 * 1 MiB read buffer three times; a missing file is refused.  Part of
 * test_checkpoint, on rank 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_checkpoint.h"
#include "mt_test.h"
#include "test_checkpoint.h"

static void hex_of(const unsigned char d[32], char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

void test_sha256(const char *root, int *checks, int *failures)
{
    static const struct {
        const char *msg;
        size_t repeat_a; /* or this many 'a's */
        const char *hex;
    } v[] = {
        {"", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", 0, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 0,
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqr"
         "lmnopqrsmnopqrstnopqrstu",
         0, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
        {NULL, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
        /* padding boundaries (references from coreutils sha256sum) */
        {NULL, 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {NULL, 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {NULL, 63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {NULL, 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {NULL, 65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {NULL, 119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {NULL, 120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
    };
    char *as = malloc(1000000);
    memset(as, 'a', 1000000);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        const char *m = v[i].msg ? v[i].msg : as;
        size_t len = v[i].msg ? strlen(v[i].msg) : v[i].repeat_a;
        unsigned char d[32];
        char hex[65];
        mt_sha256(m, len, d);
        hex_of(d, hex);
        CHECK(strcmp(hex, v[i].hex) == 0, "SHA-256 vector %zu (%zu bytes): %s", i, len, hex);
    }

    /* The file version streams through a 1 MiB buffer: a file of 3 MiB + 17
     * bytes crosses it three times. */
    char path[700], hex[65], want[65];
    size_t n = (3u << 20) + 17;
    unsigned char *buf = malloc(n), d[32];
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)(i * 2654435761u >> 13);
    snprintf(path, sizeof path, "%s/blob", root);
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
    mt_sha256(buf, n, d);
    hex_of(d, want);
    CHECK(mt_sha256_file(path, hex) == MT_OK && strcmp(hex, want) == 0, "file hash %s vs %s", hex,
          want);
    f = fopen(path, "wb");
    fwrite(as, 1, 1000000, f);
    fclose(f);
    CHECK(mt_sha256_file(path, hex) == MT_OK && strcmp(hex, v[4].hex) == 0, "million a file");
    remove(path);
    CHECK(mt_sha256_file(path, hex) == MT_ERR_IO, "missing file hashes");
    CHECK_CONTAINS(mt_error_message(), "cannot open for hashing");
    free(buf);
    free(as);
    *checks = mt_test_checks;
    *failures = mt_test_failures;
}
