/* test_json.c — hostile-input JSON parsing and typed getters (core/json). */
#include "test_common.h"
#include "json.h"

static td_status parse(const char *s, cJSON **out, td_err *err)
{
    return td_json_parse(s, strlen(s), 1 << 20, "t.json", out, err);
}

static void json_valid_object_parses(void **state)
{
    (void)state;
    cJSON *j;
    td_err err;
    assert_int_equal(parse("{\"a\": 1, \"b\": \"x\", \"c\": true, \"d\": 2.5}  \n", &j, &err), TD_OK);
    int64_t a;
    const char *b;
    bool c;
    double d;
    assert_int_equal(td_json_get_int(j, "a", "t", &a, &err), TD_OK);
    assert_int_equal(a, 1);
    assert_int_equal(td_json_get_str(j, "b", "t", &b, &err), TD_OK);
    assert_string_equal(b, "x");
    assert_int_equal(td_json_get_bool(j, "c", "t", &c, &err), TD_OK);
    assert_true(c);
    assert_int_equal(td_json_get_num(j, "d", "t", &d, &err), TD_OK);
    assert_true(d == 2.5);
    /* wrong types and missing keys are distinguished */
    assert_int_equal(td_json_get_int(j, "d", "t", &a, &err), TD_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "\"d\""));
    assert_int_equal(td_json_get_int(j, "zz", "t", &a, &err), TD_ERR_NOTFOUND);
    assert_non_null(strstr(err.msg, "zz"));
    assert_int_equal(td_json_get_str(j, "a", "t", &b, &err), TD_ERR_FORMAT);
    a = 7;
    assert_int_equal(td_json_opt_int(j, "zz", "t", &a, &err), TD_OK);
    assert_int_equal(a, 7);
    cJSON_Delete(j);
}

static void json_hostile_inputs_rejected(void **state)
{
    (void)state;
    static const struct { const char *text; td_status code; const char *needle; } cases[] = {
        {"", TD_ERR_FORMAT, "empty"},
        {"{\"a\":1} x", TD_ERR_FORMAT, "trailing"},
        {"{\"a\":1,\"a\":2}", TD_ERR_FORMAT, "duplicate key \"a\""},
        {"{\"o\":{\"k\":1,\"k\":1}}", TD_ERR_FORMAT, "duplicate key \"k\""},
        {"{\"a\":\"\xff\"}", TD_ERR_FORMAT, "UTF-8"},
        {"{\"a\":\"\xc0\x80\"}", TD_ERR_FORMAT, "UTF-8"},          /* overlong NUL */
        {"{\"a\":\"\xed\xa0\x80\"}", TD_ERR_FORMAT, "UTF-8"},      /* surrogate */
        {"{\"a\":\"\xf4\x90\x80\x80\"}", TD_ERR_FORMAT, "UTF-8"},  /* > U+10FFFF */
        {"{\"a\":\"\xe2\x82\"}", TD_ERR_FORMAT, "UTF-8"},          /* truncated sequence */
        {"{\"a\":", TD_ERR_FORMAT, "syntax"},
        {"{a:1}", TD_ERR_FORMAT, "syntax"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *j = (cJSON *)1;
        td_err err;
        td_status st = parse(cases[i].text, &j, &err);
        if (st != cases[i].code || !strstr(err.msg, cases[i].needle))
            fail_msg("case %zu: status %d msg '%s'", i, st, err.msg);
        assert_null(j);
        assert_non_null(strstr(err.msg, "t.json"));
    }
}

static void json_deep_nesting_rejected(void **state)
{
    (void)state;
    char buf[1000];
    size_t n = 0;
    for (int i = 0; i < 200; i++) buf[n++] = '[';
    for (int i = 0; i < 200; i++) buf[n++] = ']';
    cJSON *j;
    td_err err;
    assert_int_equal(td_json_parse(buf, n, 1 << 20, "deep.json", &j, &err), TD_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "nested"));
    /* depth exactly at the limit is fine */
    n = 0;
    for (int i = 0; i < TD_JSON_MAX_DEPTH; i++) buf[n++] = '[';
    for (int i = 0; i < TD_JSON_MAX_DEPTH; i++) buf[n++] = ']';
    assert_int_equal(td_json_parse(buf, n, 1 << 20, "ok.json", &j, &err), TD_OK);
    cJSON_Delete(j);
}

static void json_embedded_nul_and_size_limit_rejected(void **state)
{
    (void)state;
    const char s[] = "{\"a\":1}\0{}";
    cJSON *j;
    td_err err;
    assert_int_equal(td_json_parse(s, sizeof s - 1, 1 << 20, "n.json", &j, &err), TD_ERR_FORMAT);
    assert_int_equal(td_json_parse("{}", 2, 1, "big.json", &j, &err), TD_ERR_RANGE);
}

static void json_integers_must_be_exact(void **state)
{
    (void)state;
    cJSON *j;
    td_err err;
    assert_int_equal(parse("{\"a\":9007199254740993, \"b\":1e300, \"c\":-3, \"d\":1.5}", &j, &err), TD_OK);
    int64_t v;
    assert_int_equal(td_json_get_int(j, "a", "t", &v, &err), TD_ERR_FORMAT);
    assert_int_equal(td_json_get_int(j, "b", "t", &v, &err), TD_ERR_FORMAT);
    assert_int_equal(td_json_get_int(j, "c", "t", &v, &err), TD_OK);
    assert_int_equal(v, -3);
    assert_int_equal(td_json_get_int(j, "d", "t", &v, &err), TD_ERR_FORMAT);
    cJSON_Delete(j);
}

static void json_read_file_names_path(void **state)
{
    (void)state;
    cJSON *j;
    td_err err;
    assert_int_equal(td_json_read_file(td_test_path("does-not-exist.json"), 1 << 20, &j, &err), TD_ERR_IO);
    assert_non_null(strstr(err.msg, "does-not-exist.json"));
    td_test_write_str(td_test_path("good.json"), "{\"x\": [1,2,3]}");
    assert_int_equal(td_json_read_file(td_test_path("good.json"), 1 << 20, &j, &err), TD_OK);
    cJSON_Delete(j);
}

static void json_fput_str_escapes_and_round_trips(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    const char *s = "a\"b\\c\nd\re\tf\x01g\x1fh \xc3\xa9";
    td_json_fput_str(f, s);
    fputc(' ', f);
    td_json_fput_str(f, NULL);
    assert_int_equal(fclose(f), 0);
    assert_string_equal(buf, "\"a\\\"b\\\\c\\nd\\re\\tf\\u0001g\\u001fh \xc3\xa9\" \"\"");
    /* what was written parses back to the original string */
    cJSON *j;
    td_err err;
    char *arr = malloc(len + 8);
    snprintf(arr, len + 8, "[%.*s]", (int)len, buf);
    for (char *p = arr; *p; p++)
        if (*p == ' ' && p[1] == '"' && p[2] == '"') *p = ',';
    assert_int_equal(td_json_parse(arr, strlen(arr), 1 << 20, "w", &j, &err), TD_OK);
    assert_string_equal(cJSON_GetArrayItem(j, 0)->valuestring, s);
    assert_string_equal(cJSON_GetArrayItem(j, 1)->valuestring, "");
    cJSON_Delete(j);
    free(arr);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_valid_object_parses),
        cmocka_unit_test(json_hostile_inputs_rejected),
        cmocka_unit_test(json_deep_nesting_rejected),
        cmocka_unit_test(json_embedded_nul_and_size_limit_rejected),
        cmocka_unit_test(json_integers_must_be_exact),
        cmocka_unit_test(json_read_file_names_path),
        cmocka_unit_test(json_fput_str_escapes_and_round_trips),
    };
    return cmocka_run_group_tests_name("json", tests, NULL, NULL);
}
