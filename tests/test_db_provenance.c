/* test_db_provenance.c — host and process identity, environment capture, uids, time format
 * and checkpoint fingerprints (db/provenance.c). */
#include "test_common.h"
#include "db/provenance.h"

static void prov_host_identity_of_this_process(void **state)
{
    (void)state;
    td_prov_host h;
    td_prov_host_get(&h);
    assert_true(strlen(h.host) > 0);
    assert_true(strlen(h.cpu) > 0);
    assert_int_equal(h.pid, getpid());
    assert_true(h.proc_start > 0);
    assert_int_equal(td_prov_proc_start(getpid()), h.proc_start);
    char self[65];
    td_err err;
    assert_int_equal(td_prov_self_sha256(self, &err), TD_OK);
    assert_int_equal(strlen(self), 64);
}

static void prov_dead_and_zombie_processes_have_no_start(void **state)
{
    (void)state;
    assert_int_equal(td_prov_proc_start(0), -1);
    assert_int_equal(td_prov_proc_start(-5), -1);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(0);
    /* until reaped the child is a zombie: it counts as gone */
    for (int i = 0; i < 200; i++) {
        if (td_prov_proc_start(pid) == -1) break;
        usleep(5000);
    }
    assert_int_equal(td_prov_proc_start(pid), -1);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(td_prov_proc_start(pid), -1);
}

static void prov_env_selected_redacted_and_clean(void **state)
{
    (void)state;
    assert_true(td_prov_env_selected("TANDEM_DB"));
    assert_true(td_prov_env_selected("CUDA_VISIBLE_DEVICES"));
    assert_true(td_prov_env_selected("NCCL_ALGO"));
    assert_true(td_prov_env_selected("OMP_NUM_THREADS"));
    assert_true(td_prov_env_selected("LD_LIBRARY_PATH"));
    assert_false(td_prov_env_selected("HOME"));
    assert_false(td_prov_env_selected("PATH"));
    assert_false(td_prov_env_selected("MY_CUDA_THING"));
    setenv("TANDEM_PROV_A", "1", 1);
    setenv("CUDA_PROV_SECRET_KEY", "s3cret", 1);
    setenv("TANDEM_PROV_BYTES", "ok\xff\xfe" "end", 1);
    setenv("HOME_PROV_UNRELATED", "x", 1);
    cJSON *e = td_prov_env_json();
    assert_non_null(e);
    assert_string_equal(cJSON_GetObjectItem(e, "TANDEM_PROV_A")->valuestring, "1");
    assert_string_equal(cJSON_GetObjectItem(e, "CUDA_PROV_SECRET_KEY")->valuestring, "<redacted>");
    assert_string_equal(cJSON_GetObjectItem(e, "TANDEM_PROV_BYTES")->valuestring, "ok??end");
    assert_null(cJSON_GetObjectItem(e, "HOME_PROV_UNRELATED"));
    /* names come out sorted */
    const cJSON *prev = NULL, *it;
    cJSON_ArrayForEach(it, e) {
        if (prev) assert_true(strcmp(prev->string, it->string) < 0);
        prev = it;
    }
    cJSON_Delete(e);
    unsetenv("TANDEM_PROV_A");
    unsetenv("CUDA_PROV_SECRET_KEY");
    unsetenv("TANDEM_PROV_BYTES");
    unsetenv("HOME_PROV_UNRELATED");
}

static void prov_uids_are_v4_and_unique(void **state)
{
    (void)state;
    enum { N = 2000 };
    char(*u)[37] = calloc(N, 37);
    td_err err;
    for (int i = 0; i < N; i++) {
        assert_int_equal(td_prov_uid(u[i], &err), TD_OK);
        assert_int_equal(strlen(u[i]), 36);
        for (int k = 0; k < 36; k++) {
            if (k == 8 || k == 13 || k == 18 || k == 23) assert_int_equal(u[i][k], '-');
            else assert_non_null(strchr("0123456789abcdef", u[i][k]));
        }
        assert_int_equal(u[i][14], '4');
        assert_non_null(strchr("89ab", u[i][19]));
    }
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++) assert_true(strcmp(u[i], u[j]) != 0);
    free(u);
}

static void prov_time_format_sorts(void **state)
{
    (void)state;
    char a[TD_PROV_TIME_LEN + 1], b[TD_PROV_TIME_LEN + 1];
    td_prov_time_iso(0, 0, a);
    assert_string_equal(a, "1970-01-01T00:00:00.000Z");
    td_prov_time_iso(1788614096, 789, b);
    assert_string_equal(b, "2026-09-05T13:14:56.789Z");
    assert_true(strcmp(a, b) < 0);
    td_prov_now_iso(a);
    assert_int_equal(strlen(a), TD_PROV_TIME_LEN);
    assert_int_equal(a[10], 'T');
    assert_int_equal(a[23], 'Z');
}

static void write_file(const char *dir, const char *name, const char *data, size_t len)
{
    char p[800];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    td_test_write(p, data, len);
}

static void fp(const char *dir, bool full, char out[65])
{
    td_err err;
    td_status s = td_prov_checkpoint_fingerprint(dir, full, out, &err);
    if (s != TD_OK) fail_msg("fingerprint %s: %s", dir, err.msg);
}

static void prov_checkpoint_fingerprint_tracks_what_matters(void **state)
{
    (void)state;
    const char *d = td_test_path("ck");
    mkdir(d, 0777);
    write_file(d, "config.json", "{\"a\": 1}", 8);
    write_file(d, "model-00001-of-00002.safetensors", "AAAA", 4);
    write_file(d, "model-00002-of-00002.safetensors", "BBBBBB", 6);
    write_file(d, "README.md", "ignored", 7);
    char f0[65], f1[65], full0[65], full1[65];
    fp(d, false, f0);
    fp(d, false, f1);
    assert_string_equal(f0, f1); /* stable */
    fp(d, true, full0);
    assert_string_not_equal(f0, full0); /* a full hash never equals a quick one */
    /* same sizes, different bytes: only the full fingerprint sees it */
    write_file(d, "model-00001-of-00002.safetensors", "AAAB", 4);
    fp(d, false, f1);
    assert_string_equal(f0, f1);
    fp(d, true, full1);
    assert_string_not_equal(full0, full1);
    /* files outside the fingerprint do not count */
    write_file(d, "README.md", "changed!", 8);
    fp(d, false, f1);
    assert_string_equal(f0, f1);
    /* a shard's size, a new shard, a config byte, a new index: all count */
    write_file(d, "model-00002-of-00002.safetensors", "BBBBBBB", 7);
    fp(d, false, f1);
    assert_string_not_equal(f0, f1);
    char f2[65];
    write_file(d, "extra.safetensors", "", 0);
    fp(d, false, f2);
    assert_string_not_equal(f1, f2);
    write_file(d, "config.json", "{\"a\": 2}", 8);
    fp(d, false, f1);
    assert_string_not_equal(f1, f2);
    write_file(d, "model.safetensors.index.json", "{}", 2);
    fp(d, false, f2);
    assert_string_not_equal(f1, f2);
    /* errors name the path */
    td_err err;
    char out[65];
    char cfg[800];
    snprintf(cfg, sizeof cfg, "%s/config.json", d);
    assert_int_equal(td_prov_checkpoint_fingerprint(cfg, false, out, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "config.json"));
    unlink(cfg);
    assert_int_equal(td_prov_checkpoint_fingerprint(d, false, out, &err), TD_ERR_NOTFOUND);
    assert_non_null(strstr(err.msg, "config.json"));
    assert_int_equal(td_prov_checkpoint_fingerprint(td_test_path("nope"), false, out, &err), TD_ERR_NOTFOUND);
    assert_string_equal(out, "");
}

static void prov_utf8_clean_replaces_bad_bytes(void **state)
{
    (void)state;
    char *c = td_prov_utf8_clean("a\xc3\xa9z\x80\xc3");
    assert_string_equal(c, "a\xc3\xa9z??");
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prov_host_identity_of_this_process),
        cmocka_unit_test(prov_dead_and_zombie_processes_have_no_start),
        cmocka_unit_test(prov_env_selected_redacted_and_clean),
        cmocka_unit_test(prov_uids_are_v4_and_unique),
        cmocka_unit_test(prov_time_format_sorts),
        cmocka_unit_test(prov_checkpoint_fingerprint_tracks_what_matters),
        cmocka_unit_test(prov_utf8_clean_replaces_bad_bytes),
    };
    return cmocka_run_group_tests_name("db_provenance", tests, NULL, NULL);
}
