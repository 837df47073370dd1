/* td.h — status codes, error messages and invariant checks shared by all of tandem.
 *
 * Contract
 * - Two error tiers (never mixed):
 *   1. Errors caused by input or the environment (bad file, bad JSON, unsupported shape,
 *      I/O failure) are *returned* as a td_status and described in a caller-owned td_err.
 *      The message names the file, tensor or option at fault.
 *   2. Broken invariants (programmer errors) go to TD_ASSERT, which is always on, prints
 *      file:line and the expression, and aborts.
 * - td_err_set() formats into err->msg (truncating safely) and returns the code, so callers
 *   write `return td_err_set(err, TD_ERR_FORMAT, "%s: ...", path);`.
 *   A NULL err is accepted everywhere: the code is still returned, the message dropped.
 * - td_err_prefix() prepends context ("model-00001.safetensors: ") to an existing message.
 * - Nothing here allocates. Thread-safe: each thread uses its own td_err.
 */
#ifndef TD_H
#define TD_H

#include <stddef.h>
#include <stdint.h>

typedef enum td_status {
    TD_OK = 0,
    TD_ERR_ARG,         /* bad argument or option value from the user */
    TD_ERR_IO,          /* open/read/write/mmap failed */
    TD_ERR_FORMAT,      /* file content violates its format */
    TD_ERR_RANGE,       /* a value or offset out of its allowed range */
    TD_ERR_NOMEM,       /* allocation failed */
    TD_ERR_NOTFOUND,    /* a named file, tensor or key is missing */
    TD_ERR_UNSUPPORTED, /* valid input that tandem does not handle */
    TD_ERR_MISMATCH,    /* a comparison or consistency check failed */
    TD_ERR_INTERNAL,    /* a library call failed unexpectedly */
    TD_STATUS_COUNT
} td_status;

#define TD_ERR_MSG_MAX 1024

typedef struct td_err {
    td_status code;
    char msg[TD_ERR_MSG_MAX];
} td_err;

#if defined(__GNUC__)
#define TD_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define TD_NORETURN __attribute__((noreturn))
#else
#define TD_PRINTF(f, a)
#define TD_NORETURN
#endif

/* Name of a status ("format error", ...); never NULL. */
const char *td_status_str(td_status s);

/* Clear err (code TD_OK, empty message). NULL-safe. */
void td_err_clear(td_err *err);

/* Set code and formatted message; returns code. NULL-safe. */
td_status td_err_set(td_err *err, td_status code, const char *fmt, ...) TD_PRINTF(3, 4);

/* Prepend "prefix" to the current message (keeps the code); returns err->code. NULL-safe. */
td_status td_err_prefix(td_err *err, const char *fmt, ...) TD_PRINTF(2, 3);

/* Abort with file:line and message. Used by TD_ASSERT. */
TD_NORETURN void td_abort(const char *file, int line, const char *expr);

#define TD_ASSERT(x) do { if (!(x)) td_abort(__FILE__, __LINE__, #x); } while (0)

#define TD_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif /* TD_H */
