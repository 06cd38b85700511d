/* checkpoint_digest.c: SHA-256 for checkpoint manifests, by OpenSSL's
 * libcrypto (EVP).  The hash is most of a save's and a resume's time on
 * large checkpoints, and libcrypto's SHA-NI / AVX2 code runs several times
 * faster than portable C.  It hashes what the checkpoint code writes; it
 * is no MAC and keys nothing. */
#include "mt_checkpoint.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

/* a file is read in pieces of this size; tests cross it on purpose */
#define DIGEST_FILE_BUFFER (1u << 20)

void mt_sha256(const void *data, size_t len, unsigned char digest[32])
{
    unsigned int n = 32;
    /* EVP_Digest fails only without memory for its context: then the
     * digest is all zeros, which no manifest line matches */
    if (!EVP_Digest(data, len, digest, &n, EVP_sha256(), NULL))
        memset(digest, 0, 32);
}

static mt_status_t hash_stream(FILE *f, const char *path, unsigned char *buf,
                               unsigned char d[32])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c)
        MT_FAIL(MT_ERR_NOMEM, "%s: no memory for a SHA-256 context", path);
    int ok = EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    size_t got;
    while (ok && (got = fread(buf, 1, DIGEST_FILE_BUFFER, f)) > 0)
        ok = EVP_DigestUpdate(c, buf, got);
    int read_error = ferror(f), err = errno;
    unsigned int n = 32;
    ok = ok && EVP_DigestFinal_ex(c, d, &n);
    EVP_MD_CTX_free(c);
    if (read_error)
        MT_FAIL(MT_ERR_IO, "%s: read error while hashing: %s", path, strerror(err));
    if (!ok)
        MT_FAIL(MT_ERR_IO, "%s: libcrypto's SHA-256 failed", path);
    return MT_OK;
}

mt_status_t mt_sha256_file(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        MT_FAIL(MT_ERR_IO, "%s: cannot open for hashing: %s", path, strerror(errno));
    unsigned char *buf = malloc(DIGEST_FILE_BUFFER);
    if (!buf) {
        fclose(f);
        MT_FAIL(MT_ERR_NOMEM, "%s: no memory for a %u-byte hash buffer", path,
                DIGEST_FILE_BUFFER);
    }
    unsigned char d[32];
    mt_status_t s = hash_stream(f, path, buf, d);
    free(buf);
    fclose(f);
    MT_TRY(s);
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
    return MT_OK;
}
