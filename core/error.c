/* error.c — td_status names and td_err formatting (see td.h). */
#include "td.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const td_status_names[] = {
    "ok",              /* TD_OK */
    "invalid argument",/* TD_ERR_ARG */
    "I/O error",       /* TD_ERR_IO */
    "format error",    /* TD_ERR_FORMAT */
    "out of range",    /* TD_ERR_RANGE */
    "out of memory",   /* TD_ERR_NOMEM */
    "not found",       /* TD_ERR_NOTFOUND */
    "unsupported",     /* TD_ERR_UNSUPPORTED */
    "mismatch",        /* TD_ERR_MISMATCH */
    "internal error",  /* TD_ERR_INTERNAL */
};
_Static_assert(TD_ARRAY_LEN(td_status_names) == TD_STATUS_COUNT, "td_status_names incomplete");

const char *td_status_str(td_status s)
{
    if ((unsigned)s >= TD_STATUS_COUNT) return "unknown status";
    return td_status_names[s];
}

void td_err_clear(td_err *err)
{
    if (!err) return;
    err->code = TD_OK;
    err->msg[0] = '\0';
}

td_status td_err_set(td_err *err, td_status code, const char *fmt, ...)
{
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

td_status td_err_prefix(td_err *err, const char *fmt, ...)
{
    if (!err) return TD_ERR_INTERNAL;
    char prefix[TD_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Truncation is intended: the message keeps as much of both as fits. */
    size_t plen = strlen(prefix), olen = strnlen(err->msg, sizeof err->msg - 1);
    if (plen > sizeof err->msg - 1) plen = sizeof err->msg - 1;
    if (olen > sizeof err->msg - 1 - plen) olen = sizeof err->msg - 1 - plen;
    memmove(err->msg + plen, err->msg, olen);
    memcpy(err->msg, prefix, plen);
    err->msg[plen + olen] = '\0';
    return err->code;
}

void td_abort(const char *file, int line, const char *expr)
{
    fflush(stdout);
    fprintf(stderr, "tandem: internal invariant failed at %s:%d: %s\n", file, line, expr);
    abort();
}
