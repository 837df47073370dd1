/* sha256.h — SHA-256 message digests (FIPS 180-4), one-shot, incremental and of files.
 *
 * Contract
 * - td_sha256_ctx is a plain value the caller owns (stack or embedded); nothing here
 *   allocates except td_sha256_file(), which frees what it takes before returning.
 * - Incremental use: td_sha256_init(), any number of td_sha256_update() calls (data may be
 *   NULL when len is 0; the split of the message into updates does not change the digest),
 *   then td_sha256_final(). final wipes the context; call init again before reusing it.
 *   Calling update/final on a context that was never initialized is a programmer error.
 * - Messages are bytes; lengths up to 2^61-1 bytes are supported (the FIPS 180-4 limit of
 *   2^64-1 bits rounded down to whole bytes).
 * - td_sha256_hex() writes 64 lowercase hex digits and a NUL.
 * - td_sha256_file() streams the file in fixed-size chunks (never reads it whole). Errors
 *   are returned, with err->msg naming the path: TD_ERR_NOTFOUND when the file does not
 *   exist, TD_ERR_IO when it cannot be opened or read (a directory, a permission problem,
 *   a read error), TD_ERR_NOMEM when the chunk buffer cannot be allocated. On any error
 *   hex is set to the empty string.
 * - Thread-safe: no shared state; each thread uses its own context.
 */
#ifndef TD_SHA256_H
#define TD_SHA256_H

#include "td.h"

#define TD_SHA256_DIGEST_LEN 32 /* bytes */
#define TD_SHA256_HEX_LEN 65    /* 64 hex digits + NUL */
#define TD_SHA256_BLOCK_LEN 64  /* bytes per compression-function block */

typedef struct td_sha256_ctx {
    uint32_t h[8];                     /* chaining value */
    uint64_t nbytes;                   /* message bytes consumed so far */
    uint8_t block[TD_SHA256_BLOCK_LEN]; /* pending partial block */
    size_t block_len;                  /* bytes used in block, 0..63 */
} td_sha256_ctx;

void td_sha256_init(td_sha256_ctx *ctx);
void td_sha256_update(td_sha256_ctx *ctx, const void *data, size_t len);
void td_sha256_final(td_sha256_ctx *ctx, uint8_t out[TD_SHA256_DIGEST_LEN]);

/* One-shot digest of a buffer (data may be NULL when len is 0). */
void td_sha256(const void *data, size_t len, uint8_t out[TD_SHA256_DIGEST_LEN]);

/* Lowercase hex of a digest. */
void td_sha256_hex(const uint8_t digest[TD_SHA256_DIGEST_LEN], char hex[TD_SHA256_HEX_LEN]);

/* Hex digest of a file's contents, read in chunks. */
td_status td_sha256_file(const char *path, char hex[TD_SHA256_HEX_LEN], td_err *err);

#endif /* TD_SHA256_H */
