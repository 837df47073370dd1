/* test_progress.c — progress bar: silence when disabled, line content, redraw rate limit
 * (core/progress). Time comes from an injected clock, so every check is deterministic. */
#define _XOPEN_SOURCE 700 /* posix_openpt, grantpt, unlockpt, ptsname */
#include "test_common.h"
#include "progress.h"

#include <fcntl.h>
#include <poll.h>

#define MS UINT64_C(1000000) /* nanoseconds per millisecond */
#define SEC UINT64_C(1000000000)

typedef struct fake_clock {
    uint64_t now_ns;
    int reads;
} fake_clock;

static uint64_t fake_clock_read(void *ctx)
{
    fake_clock *c = ctx;
    c->reads++;
    return c->now_ns;
}

/* Everything written to f so far, NUL-terminated (caller frees). */
static char *stream_text(FILE *f, size_t *len)
{
    assert_int_equal(fflush(f), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    rewind(f);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static size_t count_char(const char *s, char c)
{
    size_t n = 0;
    for (; *s; s++) n += *s == c;
    return n;
}

/* The text after the last '\r' (the line as it stands on the terminal). */
static const char *last_line(const char *s)
{
    const char *r = strrchr(s, '\r');
    return r ? r + 1 : s;
}

/* ---- disabled -------------------------------------------------------------------------- */

static void progress_forced_off_writes_zero_bytes(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    fake_clock clk = {0, 0};
    td_progress p;
    td_progress_init_ex(&p, f, "loading", 1000, 0, fake_clock_read, &clk);
    assert_false(td_progress_enabled(&p));
    for (uint64_t i = 0; i <= 1000; i++) {
        clk.now_ns += 10 * SEC; /* long gaps: a redraw would be due every time */
        td_progress_update(&p, i);
    }
    td_progress_done(&p);
    size_t len;
    char *text = stream_text(f, &len);
    assert_int_equal(len, 0);
    assert_int_equal(clk.reads, 0); /* a disabled bar does not even read the clock */
    free(text);
    fclose(f);
}

static void progress_auto_on_non_terminal_writes_zero_bytes(void **state)
{
    (void)state;
    FILE *f = tmpfile(); /* a regular file, never a terminal */
    assert_non_null(f);
    td_progress p;
    td_progress_init(&p, f, "hashing", 10);
    assert_false(td_progress_enabled(&p));
    for (uint64_t i = 0; i <= 10; i++) td_progress_update(&p, i);
    td_progress_done(&p);

    fake_clock clk = {0, 0};
    td_progress_init_ex(&p, f, "hashing", 10, -1, fake_clock_read, &clk);
    assert_false(td_progress_enabled(&p));
    td_progress_update(&p, 5);
    td_progress_done(&p);

    /* A NULL stream is disabled even when forced on. */
    td_progress_init_ex(&p, NULL, "x", 10, 1, fake_clock_read, &clk);
    assert_false(td_progress_enabled(&p));
    td_progress_update(&p, 5);
    td_progress_done(&p);

    size_t len;
    char *text = stream_text(f, &len);
    assert_int_equal(len, 0);
    free(text);
    fclose(f);
}

static void progress_auto_on_terminal_draws(void **state)
{
    (void)state;
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0) skip(); /* no pseudo-terminals here */
    const char *name = grantpt(master) == 0 && unlockpt(master) == 0 ? ptsname(master) : NULL;
    int slave = name ? open(name, O_RDWR | O_NOCTTY) : -1;
    if (slave < 0) {
        close(master);
        skip();
    }
    FILE *f = fdopen(slave, "w");
    assert_non_null(f);
    fake_clock clk = {0, 0};
    td_progress p;
    td_progress_init_ex(&p, f, "tty", 10, -1, fake_clock_read, &clk);
    assert_true(td_progress_enabled(&p));
    td_progress_update(&p, 3);
    td_progress_done(&p);
    td_progress_init(&p, f, "tty", 10); /* the plain init decides the same way */
    assert_true(td_progress_enabled(&p));

    /* Read what reached the terminal until the final newline arrives. */
    char got[1024];
    size_t n = 0;
    struct pollfd pfd = {.fd = master, .events = POLLIN};
    while (n < sizeof got - 1 && !memchr(got, '\n', n) && poll(&pfd, 1, 2000) > 0) {
        ssize_t r = read(master, got + n, sizeof got - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
    }
    got[n] = '\0';
    assert_non_null(strstr(got, "tty [######..............]  30% 3/10 ETA"));
    assert_non_null(strstr(got, "tty [####################] 100% 10/10 in 0:00"));
    fclose(f);
    close(master);
}

/* ---- enabled: content ------------------------------------------------------------------ */

static void progress_done_line_has_label_and_100_percent(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    fake_clock clk = {5 * SEC, 0};
    td_progress p;
    td_progress_init_ex(&p, f, "quantize", 1000, 1, fake_clock_read, &clk);
    assert_true(td_progress_enabled(&p));
    td_progress_update(&p, 400);
    clk.now_ns += 65 * SEC;
    td_progress_done(&p);
    size_t len;
    char *text = stream_text(f, &len);
    assert_true(len > 0);
    assert_true(text[len - 1] == '\n');
    assert_int_equal(count_char(text, '\n'), 1);
    const char *line = last_line(text);
    assert_non_null(strstr(line, "quantize"));
    assert_non_null(strstr(line, "100%"));
    assert_non_null(strstr(line, "1000/1000"));
    assert_non_null(strstr(line, "[####################]"));
    assert_non_null(strstr(line, "in 1:05")); /* elapsed since init */
    free(text);
    fclose(f);
}

static void progress_update_shows_percent_count_and_eta(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    fake_clock clk = {0, 0};
    td_progress p;
    td_progress_init_ex(&p, f, "layers", 1000, 1, fake_clock_read, &clk);
    td_progress_update(&p, 0); /* nothing done yet: no ETA */
    size_t len;
    char *text = stream_text(f, &len);
    assert_non_null(strstr(last_line(text), "  0% 0/1000 ETA --:--"));
    free(text);

    clk.now_ns = 10 * SEC; /* 250 of 1000 in 10 s: 750 more take 30 s */
    td_progress_update(&p, 250);
    text = stream_text(f, &len);
    const char *line = last_line(text);
    assert_non_null(strstr(line, "layers [#####...............]  25% 250/1000 ETA 0:30"));
    free(text);

    clk.now_ns = 2 * 3600 * SEC; /* 999 items in 2 h: the last one takes about 7 s */
    td_progress_update(&p, 999);
    text = stream_text(f, &len);
    assert_non_null(strstr(last_line(text), " 99% 999/1000 ETA 0:07"));
    free(text);
    fclose(f);
}

static void progress_percent_reaches_100_only_when_complete(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    fake_clock clk = {0, 0};
    td_progress p;
    td_progress_init_ex(&p, f, "big", UINT64_MAX, 1, fake_clock_read, &clk);
    td_progress_update(&p, UINT64_MAX - 1); /* 100 * done would overflow */
    size_t len;
    char *text = stream_text(f, &len);
    assert_non_null(strstr(text, " 99% "));
    assert_null(strstr(text, "100%"));
    assert_non_null(strstr(text, "[###################.]"));
    free(text);
    fclose(f);
}

static void progress_unknown_total_shows_count_and_elapsed(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    fake_clock clk = {0, 0};
    td_progress p;
    td_progress_init_ex(&p, f, "scan", 0, 1, fake_clock_read, &clk);
    clk.now_ns = 3 * SEC;
    td_progress_update(&p, 123);
    size_t len;
    char *text = stream_text(f, &len);
    assert_string_equal(last_line(text), "scan 123 elapsed 0:03");
    free(text);
    clk.now_ns = 3725 * SEC;
    td_progress_done(&p);
    text = stream_text(f, &len);
    assert_non_null(strstr(last_line(text), "scan 123 in 1:02:05"));
    assert_true(text[len - 1] == '\n');
    assert_null(strchr(text, '%'));
    free(text);
    fclose(f);
}

static void progress_long_label_is_truncated(void **state)
{
    (void)state;
    char label[200];
    memset(label, 'L', sizeof label - 1);
    label[sizeof label - 1] = '\0';
    FILE *f = tmpfile();
    assert_non_null(f);
    fake_clock clk = {0, 0};
    td_progress p;
    td_progress_init_ex(&p, f, label, 10, 1, fake_clock_read, &clk);
    memset(label, 'X', sizeof label - 1); /* the label was copied, not borrowed */
    td_progress_done(&p);
    size_t len;
    char *text = stream_text(f, &len);
    const char *line = last_line(text);
    assert_int_equal(strspn(line, "L"), TD_PROGRESS_LABEL_MAX - 1);
    assert_true(line[TD_PROGRESS_LABEL_MAX - 1] == ' ');
    assert_null(strchr(text, 'X'));
    free(text);
    fclose(f);
}

static void progress_shorter_line_blanks_the_previous_one(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    fake_clock clk = {0, 0};
    td_progress p;
    td_progress_init_ex(&p, f, "w", 1000, 1, fake_clock_read, &clk);
    clk.now_ns = 3600 * SEC;
    td_progress_update(&p, 100); /* 900 left at 100 per hour: ETA 9:00:00 */
    clk.now_ns = 3601 * SEC;
    td_progress_update(&p, 999); /* ETA 0:04: three characters shorter */
    size_t len;
    char *text = stream_text(f, &len);
    assert_int_equal(count_char(text, '\r'), 2);
    const char *second = last_line(text);
    size_t first_len = (size_t)(second - 1 - (text + 1));
    assert_non_null(strstr(text, " 10% 100/1000 ETA 9:00:00\r"));
    assert_true(strlen(second) == first_len);
    assert_non_null(strstr(second, " 99% 999/1000 ETA 0:04   "));
    free(text);
    fclose(f);
}

/* ---- enabled: rate limit --------------------------------------------------------------- */

static void progress_redraws_at_most_every_100_ms(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    fake_clock clk = {1 * SEC, 0};
    td_progress p;
    td_progress_init_ex(&p, f, "rate", 100000, 1, fake_clock_read, &clk);
    size_t len;
    char *text;
    uint64_t t0 = clk.now_ns, k = 0;

    td_progress_update(&p, ++k); /* first update draws at once */
    text = stream_text(f, &len);
    assert_int_equal(count_char(text, '\r'), 1);
    free(text);

    /* 1000 updates spread over the next 99.9 ms: no redraw. */
    for (int i = 1; i <= 999; i++) {
        clk.now_ns = t0 + (uint64_t)i * 100000; /* 0.1 ms steps */
        td_progress_update(&p, ++k);
    }
    clk.now_ns = t0 + 100 * MS - 1;
    td_progress_update(&p, ++k);
    text = stream_text(f, &len);
    assert_int_equal(count_char(text, '\r'), 1);
    free(text);

    clk.now_ns = t0 + 100 * MS; /* exactly the interval: redraw */
    td_progress_update(&p, ++k);
    text = stream_text(f, &len);
    assert_int_equal(count_char(text, '\r'), 2);
    free(text);

    /* Ten seconds of updates every millisecond: at most one redraw per 100 ms. */
    uint64_t t1 = clk.now_ns;
    for (int i = 1; i <= 10000; i++) {
        clk.now_ns = t1 + (uint64_t)i * MS;
        td_progress_update(&p, ++k);
    }
    text = stream_text(f, &len);
    assert_int_equal(count_char(text, '\r'), 2 + 100);
    assert_int_equal(count_char(text, '\n'), 0);
    free(text);

    td_progress_done(&p); /* the final line is never rate-limited */
    td_progress_done(&p); /* and drawn once */
    td_progress_update(&p, 5);
    text = stream_text(f, &len);
    assert_int_equal(count_char(text, '\r'), 2 + 100 + 1);
    assert_int_equal(count_char(text, '\n'), 1);
    assert_true(text[len - 1] == '\n');
    free(text);
    fclose(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(progress_forced_off_writes_zero_bytes),
        cmocka_unit_test(progress_auto_on_non_terminal_writes_zero_bytes),
        cmocka_unit_test(progress_auto_on_terminal_draws),
        cmocka_unit_test(progress_done_line_has_label_and_100_percent),
        cmocka_unit_test(progress_update_shows_percent_count_and_eta),
        cmocka_unit_test(progress_percent_reaches_100_only_when_complete),
        cmocka_unit_test(progress_unknown_total_shows_count_and_elapsed),
        cmocka_unit_test(progress_long_label_is_truncated),
        cmocka_unit_test(progress_shorter_line_blanks_the_previous_one),
        cmocka_unit_test(progress_redraws_at_most_every_100_ms),
    };
    return cmocka_run_group_tests_name("progress", tests, NULL, NULL);
}
