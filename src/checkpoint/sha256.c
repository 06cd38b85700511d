/* sha256.c: SHA-256 as specified in FIPS 180-4, for checkpoint manifests.
 *
 * Written from the standard (section 4.1.2 functions, 4.2.2 constants,
 * 5.1.1 padding, 5.3.3 initial value, 6.2.2 computation), byte-oriented
 * and portable: no assembly, no CPU extensions.  It hashes what the
 * checkpoint code writes; it is not meant for passwords or MACs and makes
 * no attempt to be constant-time. */
#include "mt_checkpoint.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SHA256_BLOCK 64
#define SHA256_FILE_BUFFER (1u << 20)

typedef struct {
    uint32_t h[8];
    uint64_t total;                   /* bytes hashed so far */
    unsigned char block[SHA256_BLOCK]; /* pending partial block */
    size_t fill;
} sha256_ctx_t;

/* First 32 bits of the fractional parts of the cube roots of the first 64
 * primes (FIPS 180-4, 4.2.2). */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

static inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
static inline uint32_t ch(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (~x & z); }
static inline uint32_t maj(uint32_t x, uint32_t y, uint32_t z)
{
    return (x & y) ^ (x & z) ^ (y & z);
}
static inline uint32_t big_sigma0(uint32_t x) { return rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22); }
static inline uint32_t big_sigma1(uint32_t x) { return rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25); }
static inline uint32_t small_sigma0(uint32_t x) { return rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3); }
static inline uint32_t small_sigma1(uint32_t x) { return rotr(x, 17) ^ rotr(x, 19) ^ (x >> 10); }

static void sha256_init(sha256_ctx_t *c)
{
    /* First 32 bits of the fractional parts of the square roots of the
     * first 8 primes (5.3.3). */
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->total = 0;
    c->fill = 0;
}

/* One 512-bit block (6.2.2). */
static void sha256_block(uint32_t h[8], const unsigned char *p)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
               (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
    for (int t = 16; t < 64; t++)
        w[t] = small_sigma1(w[t - 2]) + w[t - 7] + small_sigma0(w[t - 15]) + w[t - 16];

    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = k + big_sigma1(e) + ch(e, f, g) + K[t] + w[t];
        uint32_t t2 = big_sigma0(a) + maj(a, b, c);
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

static void sha256_update(sha256_ctx_t *c, const void *data, size_t len)
{
    const unsigned char *p = data;
    c->total += len;
    if (c->fill) {
        size_t take = SHA256_BLOCK - c->fill < len ? SHA256_BLOCK - c->fill : len;
        memcpy(c->block + c->fill, p, take);
        c->fill += take;
        p += take;
        len -= take;
        if (c->fill < SHA256_BLOCK)
            return;
        sha256_block(c->h, c->block);
        c->fill = 0;
    }
    for (; len >= SHA256_BLOCK; p += SHA256_BLOCK, len -= SHA256_BLOCK)
        sha256_block(c->h, p);
    memcpy(c->block, p, len);
    c->fill = len;
}

/* Padding (5.1.1): a 1 bit, zeros to 448 mod 512, then the message length
 * in bits as a 64-bit big-endian integer. */
static void sha256_final(sha256_ctx_t *c, unsigned char digest[32])
{
    uint64_t bits = c->total * 8;
    c->block[c->fill++] = 0x80;
    if (c->fill > SHA256_BLOCK - 8) {
        memset(c->block + c->fill, 0, SHA256_BLOCK - c->fill);
        sha256_block(c->h, c->block);
        c->fill = 0;
    }
    memset(c->block + c->fill, 0, SHA256_BLOCK - 8 - c->fill);
    for (int i = 0; i < 8; i++)
        c->block[SHA256_BLOCK - 1 - i] = (unsigned char)(bits >> (8 * i));
    sha256_block(c->h, c->block);
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (unsigned char)(c->h[i] >> 24);
        digest[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        digest[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
        digest[4 * i + 3] = (unsigned char)c->h[i];
    }
}

void mt_sha256(const void *data, size_t len, unsigned char digest[32])
{
    sha256_ctx_t c;
    sha256_init(&c);
    sha256_update(&c, data, len);
    sha256_final(&c, digest);
}

mt_status_t mt_sha256_file(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        MT_FAIL(MT_ERR_IO, "%s: cannot open for hashing: %s", path, strerror(errno));
    unsigned char *buf = malloc(SHA256_FILE_BUFFER);
    if (!buf) {
        fclose(f);
        MT_FAIL(MT_ERR_NOMEM, "%s: no memory for a %u-byte hash buffer", path,
                SHA256_FILE_BUFFER);
    }
    sha256_ctx_t c;
    sha256_init(&c);
    size_t got;
    while ((got = fread(buf, 1, SHA256_FILE_BUFFER, f)) > 0)
        sha256_update(&c, buf, got);
    int read_error = ferror(f), err = errno;
    free(buf);
    fclose(f);
    if (read_error)
        MT_FAIL(MT_ERR_IO, "%s: read error while hashing: %s", path, strerror(err));

    unsigned char d[32];
    sha256_final(&c, d);
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
    return MT_OK;
}
