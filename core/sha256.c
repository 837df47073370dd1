/* sha256.c — SHA-256 per FIPS 180-4 (see sha256.h).
 *
 * Section numbers below refer to FIPS 180-4: §4.1.2 functions, §4.2.2 constants, §5.1.1
 * padding, §5.3.3 initial hash value, §6.2.2 hash computation. Words are big-endian and are
 * assembled byte by byte, so the code is independent of host endianness and alignment.
 */
#include "sha256.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- constants ----------------------------------------------------------------------- */

/* §4.2.2: first 32 bits of the fractional parts of the cube roots of the first 64 primes. */
static const uint32_t sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u,
};

/* §5.3.3: first 32 bits of the fractional parts of the square roots of the first 8 primes. */
static const uint32_t sha256_h0[8] = {
    0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
    0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u,
};

/* Bytes read per fread() in td_sha256_file(): large enough that per-call overhead is noise,
 * small enough to allocate without thought. */
#define SHA256_FILE_CHUNK ((size_t)1 << 16)

/* ---- compression function (§4.1.2, §6.2.2) ------------------------------------------- */

static inline uint32_t rotr32(uint32_t x, unsigned n) { return (x >> n) | (x << (32u - n)); }

static inline uint32_t load_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Process one 64-byte block into the chaining value h. */
static void sha256_compress(uint32_t h[8], const uint8_t block[TD_SHA256_BLOCK_LEN])
{
    uint32_t w[64]; /* message schedule */
    for (int t = 0; t < 16; t++) w[t] = load_be32(block + 4 * t);
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr32(w[t - 15], 7) ^ rotr32(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr32(w[t - 2], 17) ^ rotr32(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }

    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    uint32_t e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t big_s1 = rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + big_s1 + ch + sha256_k[t] + w[t];
        uint32_t big_s0 = rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = big_s0 + maj;
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
    h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

/* ---- incremental interface ----------------------------------------------------------- */

void td_sha256_init(td_sha256_ctx *ctx)
{
    TD_ASSERT(ctx != NULL);
    memcpy(ctx->h, sha256_h0, sizeof ctx->h);
    ctx->nbytes = 0;
    ctx->block_len = 0;
    memset(ctx->block, 0, sizeof ctx->block);
}

void td_sha256_update(td_sha256_ctx *ctx, const void *data, size_t len)
{
    TD_ASSERT(ctx != NULL);
    TD_ASSERT(ctx->block_len < TD_SHA256_BLOCK_LEN);
    if (len == 0) return;
    TD_ASSERT(data != NULL);
    const uint8_t *p = data;
    ctx->nbytes += len;

    /* Top up a pending partial block first. */
    if (ctx->block_len > 0) {
        size_t take = TD_SHA256_BLOCK_LEN - ctx->block_len;
        if (take > len) take = len;
        memcpy(ctx->block + ctx->block_len, p, take);
        ctx->block_len += take;
        p += take;
        len -= take;
        if (ctx->block_len < TD_SHA256_BLOCK_LEN) return;
        sha256_compress(ctx->h, ctx->block);
        ctx->block_len = 0;
    }
    /* Whole blocks straight from the caller's buffer. */
    while (len >= TD_SHA256_BLOCK_LEN) {
        sha256_compress(ctx->h, p);
        p += TD_SHA256_BLOCK_LEN;
        len -= TD_SHA256_BLOCK_LEN;
    }
    /* Keep the tail for later. */
    if (len > 0) {
        memcpy(ctx->block, p, len);
        ctx->block_len = len;
    }
}

void td_sha256_final(td_sha256_ctx *ctx, uint8_t out[TD_SHA256_DIGEST_LEN])
{
    TD_ASSERT(ctx != NULL && out != NULL);
    TD_ASSERT(ctx->block_len < TD_SHA256_BLOCK_LEN);
    /* §5.1.1: append a 1 bit, zeros up to 56 mod 64 bytes, then the bit length big-endian. */
    uint64_t nbits = ctx->nbytes << 3;
    size_t n = ctx->block_len;
    ctx->block[n++] = 0x80;
    if (n > TD_SHA256_BLOCK_LEN - 8) {
        memset(ctx->block + n, 0, TD_SHA256_BLOCK_LEN - n);
        sha256_compress(ctx->h, ctx->block);
        n = 0;
    }
    memset(ctx->block + n, 0, TD_SHA256_BLOCK_LEN - 8 - n);
    store_be32(ctx->block + 56, (uint32_t)(nbits >> 32));
    store_be32(ctx->block + 60, (uint32_t)nbits);
    sha256_compress(ctx->h, ctx->block);

    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, ctx->h[i]);
    memset(ctx, 0, sizeof *ctx);
}

/* ---- one-shot helpers ---------------------------------------------------------------- */

void td_sha256(const void *data, size_t len, uint8_t out[TD_SHA256_DIGEST_LEN])
{
    td_sha256_ctx ctx;
    td_sha256_init(&ctx);
    td_sha256_update(&ctx, data, len);
    td_sha256_final(&ctx, out);
}

void td_sha256_hex(const uint8_t digest[TD_SHA256_DIGEST_LEN], char hex[TD_SHA256_HEX_LEN])
{
    static const char digits[] = "0123456789abcdef";
    TD_ASSERT(digest != NULL && hex != NULL);
    for (int i = 0; i < TD_SHA256_DIGEST_LEN; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 0xf];
    }
    hex[2 * TD_SHA256_DIGEST_LEN] = '\0';
}

td_status td_sha256_file(const char *path, char hex[TD_SHA256_HEX_LEN], td_err *err)
{
    TD_ASSERT(path != NULL && hex != NULL);
    hex[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return td_err_set(err, e == ENOENT ? TD_ERR_NOTFOUND : TD_ERR_IO, "%s: cannot open: %s",
                          path, strerror(e));
    }
    uint8_t *buf = malloc(SHA256_FILE_CHUNK);
    if (!buf) {
        fclose(f);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory for a %zu-byte read buffer",
                          path, SHA256_FILE_CHUNK);
    }
    /* Our own buffer is the only one needed. */
    setvbuf(f, NULL, _IONBF, 0);

    td_sha256_ctx ctx;
    td_sha256_init(&ctx);
    for (;;) {
        size_t got = fread(buf, 1, SHA256_FILE_CHUNK, f);
        td_sha256_update(&ctx, buf, got);
        if (got < SHA256_FILE_CHUNK) break;
    }
    int read_errno = errno;
    bool failed = ferror(f) != 0;
    free(buf);
    if (fclose(f) != 0 && !failed) {
        failed = true;
        read_errno = errno;
    }
    if (failed) {
        return td_err_set(err, TD_ERR_IO, "%s: read error: %s", path, strerror(read_errno));
    }
    uint8_t digest[TD_SHA256_DIGEST_LEN];
    td_sha256_final(&ctx, digest);
    td_sha256_hex(digest, hex);
    return TD_OK;
}
