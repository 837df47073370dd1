/* safetensors.h — memory-mapped safetensors reader, sharded checkpoints, and a streaming writer.
 *
 * Format (NVFP4_SPEC.md §6): u64 little-endian header length N, N bytes of UTF-8 JSON
 * (object: tensor name → {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
 * "__metadata__" string→string map), then the data buffer. Offsets are relative to the data
 * buffer, END is exclusive.
 *
 * Contract
 * - Everything is validated before any tensor byte is touched (td_st_parse_header):
 *   the header length (>= 2, <= TD_ST_MAX_HEADER, within the file), the first header byte
 *   ('{'), the JSON (core/json.h rules: UTF-8, no NUL, depth, duplicate keys, nothing but
 *   whitespace padding after the object; no string may contain the escape \u0000), each
 *   entry's fields (exactly dtype/shape/data_offsets, known dtype string, rank <= TD_MAX_DIMS,
 *   dims and offsets written as plain non-negative integer literals below 2^53 — "2.0",
 *   "2e0", "-0" and "02" are rejected — with begin <= end), the byte count
 *   (end - begin == numel * bits / 8, whole bytes), and the layout: sorted by offset the
 *   entries must tile [0, data_len) exactly — no hole, no overlap — and data_len must equal
 *   file size - 8 - N. "__metadata__" must be an object of strings.
 *   Any violation is TD_ERR_FORMAT/TD_ERR_RANGE with a message naming the file (`what`) and
 *   the tensor (docs/safetensors.md lists each one). NaN/inf *values* are never checked here
 *   (that is for audits and inspect).
 * - td_st_header owns its arrays; free with td_st_header_free (NULL-safe). Tensors are
 *   sorted by name; lookups are binary searches.
 * - td_st_file maps a file read-only (MAP_PRIVATE). Views returned by td_st_file_tensor point
 *   into the mapping (owner = the td_st_file) and are valid until td_st_file_close.
 *   A zero-size tensor yields data == NULL. The mapping is read-only: writing through a view
 *   faults. Data pointers are aligned only as far as the file aligns them (8 + N + begin).
 *   A missing file is TD_ERR_NOTFOUND; other open/stat/mmap failures are TD_ERR_IO.
 * - td_st_set is a checkpoint's tensor namespace: model.safetensors.index.json (weight_map:
 *   name → shard file; shard names must be plain file names inside the directory) or a single
 *   model.safetensors (as with the HF loaders, model.safetensors wins when both exist; with
 *   neither, TD_ERR_NOTFOUND naming the directory). Shards are opened lazily on first access
 *   (a single file is opened by td_st_set_open); a missing shard (TD_ERR_NOTFOUND naming shard
 *   and directory), a malformed one (its own message), or a shard that lacks a tensor the
 *   index assigns to it (TD_ERR_FORMAT) is an error naming both. The index's
 *   "metadata.total_size" and any other top-level keys are informational and not validated.
 * - td_st_writer writes one file in two phases: declare every tensor (and metadata), then
 *   begin (lays out offsets, writes the header into PATH.tmp), then write each tensor's bytes
 *   in any order, then finish (checks every tensor was written, fsyncs, renames to PATH).
 *   On any failure or td_st_writer_free before finish, PATH.tmp is removed and PATH is left
 *   untouched; a failed writer refuses every later call (only td_st_writer_free remains).
 *   Every declared tensor must be written, zero-size ones included (data may then be NULL).
 *   The header is compact JSON padded with spaces to a multiple of 8 bytes (so data starts
 *   8-aligned); data is laid out in declaration order with no gaps; the header lists tensors
 *   sorted by name (strcmp), then "__metadata__" (keys sorted, omitted when empty). The same
 *   calls give byte-identical files. Names and metadata must be valid UTF-8; names must be
 *   non-empty, unique and not "__metadata__".
 * - Not thread-safe per object; distinct objects may be used from different threads.
 */
#ifndef TD_SAFETENSORS_H
#define TD_SAFETENSORS_H

#include "tensor.h"

#include <stdbool.h>
#include <stdint.h>

#define TD_ST_MAX_HEADER 100000000ULL /* same limit as the reference implementation */
#define TD_ST_INDEX_MAX_BYTES (256u << 20)

typedef struct td_st_info {
    char *name;                  /* owned by the header */
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    uint64_t begin, end;         /* byte range inside the data buffer, end exclusive */
} td_st_info;

typedef struct td_st_header {
    td_st_info *tensors;         /* [n], sorted by name */
    size_t n;
    char **meta_keys;            /* [n_meta] "__metadata__" keys, owned, sorted */
    char **meta_vals;            /* [n_meta] values, owned */
    size_t n_meta;
    uint64_t header_len;         /* N */
    uint64_t data_len;           /* bytes in the data buffer */
} td_st_header;

/* Parse and validate the header of a complete safetensors image `buf` of `len` bytes (the
 * whole file). `what` names the file in messages. On failure *out is left empty. */
td_status td_st_parse_header(const uint8_t *buf, size_t len, const char *what,
                             td_st_header *out, td_err *err);
void td_st_header_free(td_st_header *h);
/* Binary search by name; NULL if absent. */
const td_st_info *td_st_header_find(const td_st_header *h, const char *name);
/* Metadata value for key, or NULL. */
const char *td_st_header_meta(const td_st_header *h, const char *key);

/* ---- single mapped file ---- */
typedef struct td_st_file td_st_file;

td_status td_st_file_open(const char *path, td_st_file **out, td_err *err);
void td_st_file_close(td_st_file *f);                 /* NULL-safe */
const td_st_header *td_st_file_header(const td_st_file *f);
const char *td_st_file_path(const td_st_file *f);
uint64_t td_st_file_size(const td_st_file *f);
/* View of tensor `name` (TD_ERR_NOTFOUND naming file and tensor when absent). */
td_status td_st_file_tensor(const td_st_file *f, const char *name, td_tensor *view, td_err *err);
/* View of the i-th tensor in name order. */
void td_st_file_tensor_at(const td_st_file *f, size_t i, td_tensor *view);

/* ---- sharded checkpoint namespace ---- */
typedef struct td_st_set td_st_set;

/* Parse a model.safetensors.index.json image: validates JSON, "weight_map" non-empty object
 * of name → plain file name (no '/' or '\\', no "..", no control character, a non-empty stem
 * before ".safetensors"). On success names/shards are parallel arrays sorted by name (owned
 * by the caller via td_st_index_free; each shards[i] points at one of shard_files). On
 * failure *out is left empty. Errors are TD_ERR_FORMAT (TD_ERR_RANGE over
 * TD_ST_INDEX_MAX_BYTES) naming `what`. */
typedef struct td_st_index {
    char **names;                /* [n] tensor names, sorted */
    char **shards;               /* [n] shard file for each name */
    size_t n;
    char **shard_files;          /* [n_shards] distinct shard names, sorted */
    size_t n_shards;
} td_st_index;

td_status td_st_index_parse(const char *buf, size_t len, const char *what, td_st_index *out,
                            td_err *err);
void td_st_index_free(td_st_index *idx);

/* Open a checkpoint directory's tensors (index or single model.safetensors). */
td_status td_st_set_open(const char *dir, td_st_set **out, td_err *err);
void td_st_set_close(td_st_set *s);                   /* NULL-safe */
/* Number of tensors and the i-th name (sorted). Names come from the index (sharded) or the
 * single file's header; no shard is opened by these calls. */
size_t td_st_set_count(const td_st_set *s);
const char *td_st_set_name(const td_st_set *s, size_t i);
bool td_st_set_has(const td_st_set *s, const char *name);
/* Shard file names (1 for a single file) and which shard holds a name. */
size_t td_st_set_shard_count(const td_st_set *s);
const char *td_st_set_shard_name(const td_st_set *s, size_t i);
/* Metadata of the tensor (opens its shard lazily). info and shard may be NULL; the pointers
 * stay valid until td_st_set_close. A name absent from the set is TD_ERR_NOTFOUND. */
td_status td_st_set_info(td_st_set *s, const char *name, const td_st_info **info,
                         const char **shard, td_err *err);
/* View of the tensor (opens its shard lazily). */
td_status td_st_set_tensor(td_st_set *s, const char *name, td_tensor *view, td_err *err);
/* Open every shard (validating all headers) and check the index against the shard contents
 * in both directions; reports the first problem. */
td_status td_st_set_validate(td_st_set *s, td_err *err);

/* ---- streaming writer ---- */
typedef struct td_st_writer td_st_writer;

td_status td_st_writer_init(const char *path, td_st_writer **out, td_err *err);
td_status td_st_writer_meta(td_st_writer *w, const char *key, const char *value, td_err *err);
td_status td_st_writer_declare(td_st_writer *w, const char *name, td_dtype dtype, int ndim,
                               const int64_t *shape, td_err *err);
td_status td_st_writer_begin(td_st_writer *w, td_err *err);
/* Write the full bytes of a declared tensor (nbytes must match its declared size). */
td_status td_st_writer_write(td_st_writer *w, const char *name, const void *data,
                             size_t nbytes, td_err *err);
td_status td_st_writer_finish(td_st_writer *w, td_err *err);
void td_st_writer_free(td_st_writer *w);              /* NULL-safe; removes PATH.tmp if unfinished */

/* Convenience: write a whole file from an array of views (contiguous) in one call. */
td_status td_st_write_file(const char *path, size_t n, const char *const *names,
                           const td_tensor *tensors, size_t n_meta, const char *const *meta_keys,
                           const char *const *meta_vals, td_err *err);

#endif /* TD_SAFETENSORS_H */
