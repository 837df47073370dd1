/* test_sha256.c — SHA-256 digests, incremental updates and file hashing (core/sha256). */
#include "test_common.h"
#include "sha256.h"

/* Hex digest of a buffer through the one-shot API. */
static void hex_of(const void *data, size_t len, char hex[TD_SHA256_HEX_LEN])
{
    uint8_t d[TD_SHA256_DIGEST_LEN];
    td_sha256(data, len, d);
    td_sha256_hex(d, hex);
}

/* A 200-byte message with every byte value pattern distinct enough to catch misordering. */
static void fill_pattern(uint8_t *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)(i * 131u + 7u);
}

/* ---- known answers ------------------------------------------------------------------- */

static void sha256_fips_vectors_match_published_digests(void **state)
{
    (void)state;
    /* FIPS 180-4 examples (NIST CSRC "SHA256.pdf" and "SHA2_Additional.pdf"). */
    static const struct { const char *msg; const char *hex; } cases[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", /* 448 bits */
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
         "klmnopqrlmnopqrsmnopqrstnopqrstu", /* 896 bits */
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        char hex[TD_SHA256_HEX_LEN];
        hex_of(cases[i].msg, strlen(cases[i].msg), hex);
        if (strcmp(hex, cases[i].hex) != 0) fail_msg("case %zu: got %s", i, hex);
    }
}

static void sha256_million_a_matches_published_digest(void **state)
{
    (void)state;
    const char *want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    size_t n = 1000000;
    char *msg = malloc(n);
    assert_non_null(msg);
    memset(msg, 'a', n);
    char hex[TD_SHA256_HEX_LEN];
    hex_of(msg, n, hex);
    assert_string_equal(hex, want);

    /* The same message fed in uneven pieces (a prime stride never aligns with blocks). */
    td_sha256_ctx ctx;
    td_sha256_init(&ctx);
    for (size_t off = 0; off < n; off += 997)
        td_sha256_update(&ctx, msg + off, n - off < 997 ? n - off : 997);
    uint8_t d[TD_SHA256_DIGEST_LEN];
    td_sha256_final(&ctx, d);
    td_sha256_hex(d, hex);
    assert_string_equal(hex, want);
    free(msg);
}

static void sha256_padding_boundaries_match_reference(void **state)
{
    (void)state;
    /* Lengths around the 55/56-byte padding split and the 64-byte block edge; digests of
     * n repetitions of 'a' from an independent implementation. */
    static const struct { size_t n; const char *hex; } cases[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {57, "f13b2d724659eb3bf47f2dd6af1accc87b81f09f59f2b75e5c0bed6589dfe8c6"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
        {128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"},
    };
    char msg[128];
    memset(msg, 'a', sizeof msg);
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        char hex[TD_SHA256_HEX_LEN];
        hex_of(msg, cases[i].n, hex);
        if (strcmp(hex, cases[i].hex) != 0) fail_msg("length %zu: got %s", cases[i].n, hex);
    }
}

/* ---- incremental updates ------------------------------------------------------------- */

static void sha256_split_at_every_offset_matches_oneshot(void **state)
{
    (void)state;
    uint8_t msg[200];
    fill_pattern(msg, sizeof msg);
    uint8_t want[TD_SHA256_DIGEST_LEN];
    td_sha256(msg, sizeof msg, want);

    for (size_t i = 0; i <= sizeof msg; i++) {
        td_sha256_ctx ctx;
        uint8_t got[TD_SHA256_DIGEST_LEN];
        td_sha256_init(&ctx);
        td_sha256_update(&ctx, msg, i);
        td_sha256_update(&ctx, msg + i, sizeof msg - i);
        td_sha256_final(&ctx, got);
        if (memcmp(got, want, sizeof want) != 0) fail_msg("two-way split at %zu differs", i);
    }
    /* Three pieces: every pair of cut points. */
    for (size_t i = 0; i <= sizeof msg; i++) {
        for (size_t j = i; j <= sizeof msg; j++) {
            td_sha256_ctx ctx;
            uint8_t got[TD_SHA256_DIGEST_LEN];
            td_sha256_init(&ctx);
            td_sha256_update(&ctx, msg, i);
            td_sha256_update(&ctx, msg + i, j - i);
            td_sha256_update(&ctx, msg + j, sizeof msg - j);
            td_sha256_final(&ctx, got);
            if (memcmp(got, want, sizeof want) != 0) fail_msg("cuts at %zu,%zu differ", i, j);
        }
    }
}

static void sha256_byte_at_a_time_matches_oneshot(void **state)
{
    (void)state;
    uint8_t msg[200];
    fill_pattern(msg, sizeof msg);
    uint8_t want[TD_SHA256_DIGEST_LEN], got[TD_SHA256_DIGEST_LEN];
    td_sha256(msg, sizeof msg, want);
    td_sha256_ctx ctx;
    td_sha256_init(&ctx);
    for (size_t i = 0; i < sizeof msg; i++) {
        td_sha256_update(&ctx, msg + i, 1);
        td_sha256_update(&ctx, NULL, 0); /* empty updates change nothing */
    }
    td_sha256_final(&ctx, got);
    assert_memory_equal(got, want, sizeof want);
}

static void sha256_reinit_after_final_starts_fresh(void **state)
{
    (void)state;
    td_sha256_ctx ctx;
    uint8_t d[TD_SHA256_DIGEST_LEN];
    char hex[TD_SHA256_HEX_LEN];
    td_sha256_init(&ctx);
    td_sha256_update(&ctx, "some earlier message", 20);
    td_sha256_final(&ctx, d);
    td_sha256_init(&ctx);
    td_sha256_update(&ctx, "abc", 3);
    td_sha256_final(&ctx, d);
    td_sha256_hex(d, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void sha256_hex_is_lowercase_and_terminated(void **state)
{
    (void)state;
    uint8_t d[TD_SHA256_DIGEST_LEN];
    /* 07 0f 17 ... ff */
    for (int i = 0; i < TD_SHA256_DIGEST_LEN; i++) d[i] = (uint8_t)(i * 8 + 7);
    char hex[TD_SHA256_HEX_LEN];
    memset(hex, 'X', sizeof hex);
    td_sha256_hex(d, hex);
    assert_string_equal(hex, "070f171f272f373f474f575f676f777f878f979fa7afb7bfc7cfd7dfe7eff7ff");
    assert_int_equal(strlen(hex), 64);
}

/* ---- files --------------------------------------------------------------------------- */

static void sha256_file_matches_buffer_hash(void **state)
{
    (void)state;
    /* Empty, tiny, exactly one read chunk (64 KiB), one past it, and several chunks. */
    static const size_t sizes[] = {0, 1, 65536, 65537, 200003};
    size_t max = 200003;
    uint8_t *buf = malloc(max);
    assert_non_null(buf);
    for (size_t i = 0; i < max; i++) buf[i] = (uint8_t)((i * 2654435761u) >> 13);
    for (size_t k = 0; k < TD_ARRAY_LEN(sizes); k++) {
        char name[64];
        snprintf(name, sizeof name, "sha_%zu.bin", sizes[k]);
        const char *path = td_test_path(name);
        td_test_write(path, buf, sizes[k]);
        char want[TD_SHA256_HEX_LEN], got[TD_SHA256_HEX_LEN];
        hex_of(buf, sizes[k], want);
        td_err err;
        td_err_clear(&err);
        assert_int_equal(td_sha256_file(path, got, &err), TD_OK);
        if (strcmp(got, want) != 0) fail_msg("size %zu: file %s buffer %s", sizes[k], got, want);
    }
    free(buf);
}

static void sha256_missing_file_error_names_path(void **state)
{
    (void)state;
    const char *path = td_test_path("no-such-file.bin");
    char hex[TD_SHA256_HEX_LEN];
    memset(hex, 'X', sizeof hex);
    td_err err;
    td_err_clear(&err);
    assert_int_equal(td_sha256_file(path, hex, &err), TD_ERR_NOTFOUND);
    assert_int_equal(err.code, TD_ERR_NOTFOUND);
    assert_non_null(strstr(err.msg, path));
    assert_string_equal(hex, "");
    /* A NULL err still reports the status. */
    assert_int_equal(td_sha256_file(path, hex, NULL), TD_ERR_NOTFOUND);
}

static void sha256_directory_fails_with_io_error(void **state)
{
    (void)state;
    const char *dir = td_test_tmpdir();
    char hex[TD_SHA256_HEX_LEN];
    memset(hex, 'X', sizeof hex);
    td_err err;
    td_err_clear(&err);
    assert_int_equal(td_sha256_file(dir, hex, &err), TD_ERR_IO);
    assert_non_null(strstr(err.msg, dir));
    assert_string_equal(hex, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sha256_fips_vectors_match_published_digests),
        cmocka_unit_test(sha256_million_a_matches_published_digest),
        cmocka_unit_test(sha256_padding_boundaries_match_reference),
        cmocka_unit_test(sha256_split_at_every_offset_matches_oneshot),
        cmocka_unit_test(sha256_byte_at_a_time_matches_oneshot),
        cmocka_unit_test(sha256_reinit_after_final_starts_fresh),
        cmocka_unit_test(sha256_hex_is_lowercase_and_terminated),
        cmocka_unit_test(sha256_file_matches_buffer_hash),
        cmocka_unit_test(sha256_missing_file_error_names_path),
        cmocka_unit_test(sha256_directory_fails_with_io_error),
    };
    return cmocka_run_group_tests_name("sha256", tests, NULL, NULL);
}
