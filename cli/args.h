/* args.h — option-value parsing shared by the `tandem` subcommands.
 *
 * Contract
 * - cli_int_list() parses "0,23,47" or "0-3,8" into a malloc'd array of integers, each in
 *   [lo, hi], in the order given with duplicates dropped, at most CLI_LIST_MAX values.
 *   Returns 0 and sets *out (caller frees) and *n; returns -1 on a malformed or out-of-range
 *   list (empty, trailing comma, reversed range, too many values), leaving *out untouched.
 *   The caller prints its own message naming the option.
 */
#ifndef TD_CLI_ARGS_H
#define TD_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>

#define CLI_LIST_MAX 4096

int cli_int_list(const char *s, int64_t lo, int64_t hi, int64_t **out, size_t *n);

#endif /* TD_CLI_ARGS_H */
