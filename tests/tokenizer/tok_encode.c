/* tok_encode.c: the C side of the reference comparison and the benchmark.
 *
 *   tok_encode [--no-special] SPEC FILE...   one line of ids per file
 *   tok_encode --decode [--no-special] SPEC FILE...  and after each line the hex of
 *                                            the ids' decoding
 *   tok_encode --roundtrip SPEC FILE...      decode(encode(x)) == x, per file
 *   tok_encode --bench SECONDS SPEC FILE...  MB/s of encode on one thread
 *
 * The files are read as bytes: invalid UTF-8 goes to the encoder as is. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt_tokenizer.h"

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    if (s && fread(s, 1, (size_t)len, f) != (size_t)len) {
        free(s);
        s = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return s;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int a = 1, mode = 0; /* 0 ids, 1 roundtrip, 2 bench, 3 ids and decoding */
    bool special = true;
    double secs = 0;
    for (; a < argc && strncmp(argv[a], "--", 2) == 0; a++) {
        if (strcmp(argv[a], "--no-special") == 0)
            special = false;
        else if (strcmp(argv[a], "--decode") == 0)
            mode = 3;
        else if (strcmp(argv[a], "--roundtrip") == 0)
            mode = 1;
        else if (strcmp(argv[a], "--bench") == 0 && a + 1 < argc) {
            mode = 2;
            secs = atof(argv[++a]);
        } else
            break;
    }
    if (argc - a < 2) {
        fprintf(stderr, "usage: tok_encode [--no-special] [--decode|--roundtrip|--bench S] SPEC "
                        "FILE...\n");
        return 2;
    }
    mt_tokenizer_t *t;
    if (mt_tokenizer_load(argv[a], &t) != MT_OK) {
        fprintf(stderr, "tok_encode: %s\n", mt_error_message());
        return 1;
    }
    int bad = 0;
    size_t total = 0;
    char **text = calloc((size_t)argc, sizeof *text);
    size_t *len = calloc((size_t)argc, sizeof *len);
    for (int i = a + 1; i < argc; i++) {
        if (!(text[i] = slurp(argv[i], &len[i]))) {
            fprintf(stderr, "tok_encode: cannot read %s\n", argv[i]);
            return 1;
        }
        total += len[i];
    }
    if (mode == 2) {
        mt_ids_t ids = {0};
        size_t ntok = 0, bytes = 0;
        double t0 = now();
        do {
            for (int i = a + 1; i < argc; i++) {
                ids.n = 0;
                if (mt_tokenizer_encode(t, text[i], len[i], false, &ids) != MT_OK) {
                    fprintf(stderr, "tok_encode: %s\n", mt_error_message());
                    return 1;
                }
                ntok += ids.n;
            }
            bytes += total;
        } while (now() - t0 < secs);
        double dt = now() - t0;
        printf("%.2f MB/s %.0f tokens/s\n", (double)bytes / dt / 1e6, (double)ntok / dt);
        mt_ids_free(&ids);
    }
    for (int i = a + 1; mode != 2 && i < argc; i++) {
        mt_ids_t ids = {0};
        if (mt_tokenizer_encode(t, text[i], len[i], special && mode != 1, &ids) != MT_OK) {
            fprintf(stderr, "tok_encode: %s: %s\n", argv[i], mt_error_message());
            return 1;
        }
        if (mode == 0 || mode == 3) {
            for (size_t k = 0; k < ids.n; k++)
                printf(k ? " %d" : "%d", ids.v[k]);
            printf("\n");
        }
        if (mode == 3) { /* special tokens kept: the decoders see them too */
            mt_text_t out = {0};
            if (mt_tokenizer_decode(t, ids.v, ids.n, false, &out) != MT_OK) {
                fprintf(stderr, "tok_encode: %s: %s\n", argv[i], mt_error_message());
                return 1;
            }
            for (size_t k = 0; k < out.n; k++)
                printf("%02x", (unsigned char)out.s[k]);
            printf("\n");
            mt_text_free(&out);
        } else if (mode == 1) {
            mt_text_t out = {0};
            if (mt_tokenizer_decode(t, ids.v, ids.n, false, &out) != MT_OK) {
                fprintf(stderr, "tok_encode: %s: %s\n", argv[i], mt_error_message());
                return 1;
            }
            if (out.n != len[i] || memcmp(out.s, text[i], len[i]) != 0) {
                size_t k = 0;
                while (k < out.n && k < len[i] && out.s[k] == text[i][k])
                    k++;
                printf("roundtrip differs: %s at byte %zu (%zu vs %zu bytes)\n", argv[i], k,
                       out.n, len[i]);
                bad++;
            } else
                printf("roundtrip ok: %s\n", argv[i]);
            mt_text_free(&out);
        }
        mt_ids_free(&ids);
    }
    for (int i = a + 1; i < argc; i++)
        free(text[i]);
    free(text);
    free(len);
    mt_tokenizer_free(t);
    return bad ? 1 : 0;
}
