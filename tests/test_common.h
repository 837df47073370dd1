/* test_common.h — shared helpers for the CMocka unit tests.
 *
 * Every test binary runs from the repository root. TD_TEST_TMP (set by `make test`) is a
 * scratch directory; td_test_tmpdir() makes a fresh per-binary subdirectory under it (or
 * under /tmp when unset). TD_TANDEM is the path of the CLI for end-to-end tests.
 */
#ifndef TD_TEST_COMMON_H
#define TD_TEST_COMMON_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

/* Create (once) and return a scratch directory unique to this process. */
static inline const char *td_test_tmpdir(void)
{
    static char dir[512];
    if (dir[0]) return dir;
    const char *base = getenv("TD_TEST_TMP");
    if (!base || !*base) base = "/tmp";
    mkdir(base, 0777);
    snprintf(dir, sizeof dir, "%s/t%ld", base, (long)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* best effort */ }
    mkdir(dir, 0777);
    return dir;
}

/* Path join into a static rotating buffer (8 slots). */
static inline const char *td_test_path(const char *name)
{
    static char bufs[8][768];
    static int slot;
    char *b = bufs[slot++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", td_test_tmpdir(), name);
    return b;
}

/* Write bytes to a file; asserts success. */
static inline void td_test_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static inline void td_test_write_str(const char *path, const char *s)
{
    td_test_write(path, s, strlen(s));
}

/* Run a shell command, return its exit status (or -1). Output goes to `log` if non-NULL. */
static inline int td_test_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Read a whole file into a malloc'd NUL-terminated buffer (NULL on failure). */
static inline char *td_test_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[n] = 0; if (len) *len = (size_t)n; }
    return b;
}

#endif
