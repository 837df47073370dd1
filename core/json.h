/* json.h — hostile-input JSON parsing and typed getters on top of cJSON.
 *
 * Contract
 * - td_json_parse() accepts a byte buffer of known length (not necessarily NUL-terminated)
 *   and rejects, with a message naming `what` (usually the file name) and the byte offset:
 *   empty input, input over `max_len`, NUL bytes, invalid UTF-8 (overlongs, surrogates,
 *   > U+10FFFF), nesting deeper than TD_JSON_MAX_DEPTH, syntax errors, trailing garbage
 *   (only whitespace may follow the value), and duplicate object keys at any depth.
 *   On success *out is a cJSON tree the caller frees with cJSON_Delete().
 * - Getters take the object, a key and a `where` context for messages ("config.json"), and
 *   distinguish missing (TD_ERR_NOTFOUND) from wrong type/range (TD_ERR_FORMAT). Integers
 *   must be integral JSON numbers of magnitude below 2^53 (exactly representable).
 * - td_json_read_file() reads a whole file (bounded by max_len) and parses it.
 * - Thread-safe (cJSON parsing uses no global state when given a length and end pointer).
 */
#ifndef TD_JSON_H
#define TD_JSON_H

#include "td.h"

#include <stdbool.h>
#include <stdio.h>
#include <cjson/cJSON.h>

#define TD_JSON_MAX_DEPTH 64
#define TD_JSON_MAX_INT ((int64_t)1 << 53)

td_status td_json_parse(const char *buf, size_t len, size_t max_len, const char *what,
                        cJSON **out, td_err *err);

/* Read and parse a whole file; files larger than max_len are rejected before reading. */
td_status td_json_read_file(const char *path, size_t max_len, cJSON **out, td_err *err);

/* Validate UTF-8 (no NUL). On failure *bad_off is the offending byte offset. */
bool td_utf8_valid(const char *buf, size_t len, size_t *bad_off);

/* Integer member `key` of `obj`. */
td_status td_json_get_int(const cJSON *obj, const char *key, const char *where, int64_t *out,
                          td_err *err);
/* Number member (any finite JSON number). */
td_status td_json_get_num(const cJSON *obj, const char *key, const char *where, double *out,
                          td_err *err);
/* String member; *out points into the tree (borrowed). */
td_status td_json_get_str(const cJSON *obj, const char *key, const char *where,
                          const char **out, td_err *err);
/* Boolean member. */
td_status td_json_get_bool(const cJSON *obj, const char *key, const char *where, bool *out,
                           td_err *err);
/* Optional variants: leave *out unchanged and return TD_OK when the key is absent or null. */
td_status td_json_opt_int(const cJSON *obj, const char *key, const char *where, int64_t *out,
                          td_err *err);
td_status td_json_opt_num(const cJSON *obj, const char *key, const char *where, double *out,
                          td_err *err);
td_status td_json_opt_str(const cJSON *obj, const char *key, const char *where,
                          const char **out, td_err *err);
td_status td_json_opt_bool(const cJSON *obj, const char *key, const char *where, bool *out,
                           td_err *err);

/* Write `s` (NULL = "") to f as a JSON string literal: quotes, backslashes and control
 * characters escaped, other bytes passed through (callers keep strings UTF-8). For writers
 * that stream large JSON without building a cJSON tree. */
void td_json_fput_str(FILE *f, const char *s);

/* Integer value of a node (not a member lookup). */
td_status td_json_as_int(const cJSON *node, const char *where, int64_t *out, td_err *err);

#endif /* TD_JSON_H */
