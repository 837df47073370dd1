/* test_error.c — status names and error messages (core/error, td.h). */
#include "test_common.h"
#include "td.h"

static void status_names_are_distinct(void **state)
{
    (void)state;
    for (int a = 0; a < TD_STATUS_COUNT; a++) {
        assert_non_null(td_status_str((td_status)a));
        for (int b = a + 1; b < TD_STATUS_COUNT; b++)
            assert_string_not_equal(td_status_str((td_status)a), td_status_str((td_status)b));
    }
    assert_string_equal(td_status_str(TD_OK), "ok");
    assert_string_equal(td_status_str((td_status)1234), "unknown status");
}

static void err_set_formats_and_returns_code(void **state)
{
    (void)state;
    td_err e;
    td_err_clear(&e);
    assert_int_equal(e.code, TD_OK);
    assert_string_equal(e.msg, "");
    assert_int_equal(td_err_set(&e, TD_ERR_FORMAT, "%s: tensor \"%s\" bad", "f.safetensors", "w"), TD_ERR_FORMAT);
    assert_int_equal(e.code, TD_ERR_FORMAT);
    assert_string_equal(e.msg, "f.safetensors: tensor \"w\" bad");
    /* NULL err is accepted */
    assert_int_equal(td_err_set(NULL, TD_ERR_IO, "x"), TD_ERR_IO);
    td_err_clear(NULL);
}

static void err_prefix_prepends_and_truncates(void **state)
{
    (void)state;
    td_err e;
    td_err_set(&e, TD_ERR_RANGE, "offset out of range");
    assert_int_equal(td_err_prefix(&e, "%s: ", "shard-2"), TD_ERR_RANGE);
    assert_string_equal(e.msg, "shard-2: offset out of range");
    char longp[TD_ERR_MSG_MAX * 2];
    memset(longp, 'p', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    td_err_prefix(&e, "%s", longp);
    assert_int_equal(strlen(e.msg), TD_ERR_MSG_MAX - 1);
    assert_int_equal(e.msg[0], 'p');
    /* an over-long message is truncated, never overflowed */
    td_err_set(&e, TD_ERR_IO, "%s", longp);
    assert_int_equal(strlen(e.msg), TD_ERR_MSG_MAX - 1);
    assert_int_equal(td_err_prefix(NULL, "x"), TD_ERR_INTERNAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_names_are_distinct),
        cmocka_unit_test(err_set_formats_and_returns_code),
        cmocka_unit_test(err_prefix_prepends_and_truncates),
    };
    return cmocka_run_group_tests_name("error", tests, NULL, NULL);
}
