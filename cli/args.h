/* args.h — option-value parsing shared by the `tandem` subcommands.
 *
 * Contract
 * - cli_int_list() parses "0,23,47" or "0-3,8" into a malloc'd array of integers, each in
 *   [lo, hi], in the order given with duplicates dropped, at most CLI_LIST_MAX values.
 *   Returns 0 and sets *out (caller frees) and *n; returns -1 on a malformed or out-of-range
 *   list (empty, trailing comma, reversed range, too many values), leaving *out untouched.
 *   The caller prints its own message naming the option.
 * - cli_size() parses "123", "64K", "8M", "1G" (binary multiples, case-insensitive suffix)
 *   into bytes; 0 is accepted (callers that need a positive size check it); anything else,
 *   a sign, or more than 2^52 bytes returns -1 with *out untouched.
 * - cli_value() takes the value of option argv[*i]: returns argv[*i + 1] and advances *i, or,
 *   when the option is the last argument, prints "tandem CMD: OPTION needs a value (see
 *   --help)" to stderr and returns NULL.
 * - cli_error() prints "tandem CMD: MSG" to stderr for a library error message; a MSG that
 *   already starts with "CMD: " or "WORD: ", WORD being CMD's last word (the library's own
 *   module prefix, e.g. "gen: ..." or "audit layer: ..."), is printed without it, so no
 *   prefix appears twice.
 */
#ifndef TD_CLI_ARGS_H
#define TD_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>

#define CLI_LIST_MAX 4096

int cli_int_list(const char *s, int64_t lo, int64_t hi, int64_t **out, size_t *n);
int cli_size(const char *s, int64_t *out);
const char *cli_value(int argc, char **argv, int *i, const char *cmd);
void cli_error(const char *cmd, const char *msg);

#endif /* TD_CLI_ARGS_H */
