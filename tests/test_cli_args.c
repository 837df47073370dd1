/* test_cli_args.c — option-value parsing shared by the subcommands (cli/args). The CLI sources
 * are not in libtandem.a, so the module is included directly. */
#include "test_common.h"
#include "cli/args.c"

#include <unistd.h>

static void int_list_parses_lists_and_ranges(void **state)
{
    (void)state;
    int64_t *v = NULL;
    size_t n = 0;
    assert_int_equal(cli_int_list("0,23,47", 0, 47, &v, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(v[0], 0);
    assert_int_equal(v[2], 47);
    free(v);
    assert_int_equal(cli_int_list("5,0-3,2,5", 0, 10, &v, &n), 0); /* order kept, duplicates dropped */
    assert_int_equal(n, 5);
    static const int64_t want[] = {5, 0, 1, 2, 3};
    for (size_t i = 0; i < 5; i++) assert_int_equal(v[i], want[i]);
    free(v);
    char big[32];
    snprintf(big, sizeof big, "0-%d", CLI_LIST_MAX - 1);
    assert_int_equal(cli_int_list(big, 0, 1 << 20, &v, &n), 0);
    assert_int_equal(n, CLI_LIST_MAX);
    free(v);
}

static void int_list_rejects_bad_input_without_touching_out(void **state)
{
    (void)state;
    static const char *const bad[] = {"", ",", "1,", ",1", "a", "1;2", "3-1", "1-", "-1", "11",
                                      "0-99999999999", "99999999999999999999", "1 2", "1,,2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t *v = (int64_t *)0x1;
        size_t n = 77;
        if (cli_int_list(bad[i], 0, 10, &v, &n) != -1) fail_msg("'%s' accepted", bad[i]);
        assert_ptr_equal(v, (int64_t *)0x1);
        assert_int_equal(n, 77);
    }
    char big[32];
    int64_t *v;
    size_t n;
    snprintf(big, sizeof big, "0-%d", CLI_LIST_MAX); /* one value too many */
    assert_int_equal(cli_int_list(big, 0, 1 << 20, &v, &n), -1);
}

static void size_parses_binary_multiples(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int64_t want;
    } ok[] = {{"0", 0}, {"123", 123}, {"64K", 64 << 10}, {"64k", 64 << 10}, {"8M", 8 << 20}, {"1G", 1ll << 30},
              {"4194304G", 4194304ll << 30}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t v = -1;
        assert_int_equal(cli_size(ok[i].s, &v), 0);
        assert_int_equal(v, ok[i].want);
    }
    static const char *const bad[] = {"", "-1", "1T", "12KB", "K", "1.5M", "4194305G", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = 77;
        assert_int_equal(cli_size(bad[i], &v), -1);
        assert_int_equal(v, 77); /* untouched */
    }
}

static void value_takes_the_next_argument_or_fails(void **state)
{
    (void)state;
    char a0[] = "gen", a1[] = "--out", a2[] = "dir", a3[] = "--seed";
    char *argv[] = {a0, a1, a2, a3};
    int i = 1;
    const char *v = cli_value(4, argv, &i, "gen");
    assert_non_null(v);
    assert_string_equal(v, "dir");
    assert_int_equal(i, 2);
    i = 3;
    assert_null(cli_value(4, argv, &i, "gen")); /* last argument: no value */
    assert_int_equal(i, 3);
}

/* cli_error writes to stderr: capture it through a temporary file. */
static char *error_text(const char *cmd, const char *msg)
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    const int saved = dup(fileno(stderr));
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), fileno(stderr)) >= 0);
    cli_error(cmd, msg);
    fflush(stderr);
    assert_true(dup2(saved, fileno(stderr)) >= 0);
    close(saved);
    static char buf[256];
    rewind(tmp);
    const size_t n = fread(buf, 1, sizeof buf - 1, tmp);
    buf[n] = 0;
    fclose(tmp);
    return buf;
}

static void error_drops_a_repeated_prefix(void **state)
{
    (void)state;
    assert_string_equal(error_text("gen", "gen: unknown preset 'x'"), "tandem gen: unknown preset 'x'\n");
    assert_string_equal(error_text("gen", "bad seed"), "tandem gen: bad seed\n");
    assert_string_equal(error_text("audit e4m3", "e4m3: no tensors"), "tandem audit e4m3: no tensors\n");
    assert_string_equal(error_text("audit layer", "audit layer: tp 0"), "tandem audit layer: tp 0\n");
    /* only a whole word followed by ": " is a prefix */
    assert_string_equal(error_text("gen", "generator: x"), "tandem gen: generator: x\n");
    assert_string_equal(error_text("gen", "gen:x"), "tandem gen: gen:x\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(int_list_parses_lists_and_ranges),
        cmocka_unit_test(int_list_rejects_bad_input_without_touching_out),
        cmocka_unit_test(size_parses_binary_multiples),
        cmocka_unit_test(value_takes_the_next_argument_or_fails),
        cmocka_unit_test(error_drops_a_repeated_prefix),
    };
    return cmocka_run_group_tests_name("cli_args", tests, NULL, NULL);
}
