/* test_tensor.c — dtype table and tensor views (core/tensor). */
#include "test_common.h"
#include "tensor.h"

static void dtype_names_round_trip(void **state)
{
    (void)state;
    static const struct { const char *name; int bits; bool is_float; } want[] = {
        {"BOOL", 8, false}, {"U8", 8, false}, {"I8", 8, false}, {"F8_E5M2", 8, true},
        {"F8_E4M3", 8, true}, {"F8_E4M3FNUZ", 8, true}, {"F8_E5M2FNUZ", 8, true},
        {"F8_E8M0", 8, true}, {"F4", 4, true}, {"F6_E2M3", 6, true}, {"F6_E3M2", 6, true},
        {"I16", 16, false}, {"U16", 16, false}, {"F16", 16, true}, {"BF16", 16, true},
        {"I32", 32, false}, {"U32", 32, false}, {"F32", 32, true}, {"C64", 64, true},
        {"F64", 64, true}, {"I64", 64, false}, {"U64", 64, false},
    };
    assert_int_equal(sizeof want / sizeof want[0], TD_DTYPE_COUNT - 1);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        td_dtype dt = td_dtype_from_name(want[i].name);
        assert_int_not_equal(dt, TD_DTYPE_INVALID);
        assert_string_equal(td_dtype_name(dt), want[i].name);
        assert_int_equal(td_dtype_bits(dt), want[i].bits);
        assert_int_equal(td_dtype_is_float(dt), want[i].is_float);
    }
    assert_int_equal(td_dtype_from_name("f32"), TD_DTYPE_INVALID); /* case matters */
    assert_int_equal(td_dtype_from_name(""), TD_DTYPE_INVALID);
    assert_int_equal(td_dtype_from_name(NULL), TD_DTYPE_INVALID);
    assert_string_equal(td_dtype_name((td_dtype)999), "INVALID");
    assert_int_equal(td_dtype_bits((td_dtype)-1), 0);
}

static void dtype_nbytes_checks_whole_bytes_and_overflow(void **state)
{
    (void)state;
    int64_t nb;
    td_err err;
    assert_int_equal(td_dtype_nbytes(TD_BF16, 7, &nb, &err), TD_OK);
    assert_int_equal(nb, 14);
    assert_int_equal(td_dtype_nbytes(TD_F4, 6, &nb, &err), TD_OK);
    assert_int_equal(nb, 3);
    assert_int_equal(td_dtype_nbytes(TD_F4, 5, &nb, &err), TD_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "F4"));
    assert_int_equal(td_dtype_nbytes(TD_F6_E2M3, 4, &nb, &err), TD_OK);
    assert_int_equal(nb, 3);
    assert_int_equal(td_dtype_nbytes(TD_F6_E2M3, 2, &nb, &err), TD_ERR_FORMAT);
    assert_int_equal(td_dtype_nbytes(TD_F64, (int64_t)1 << 62, &nb, &err), TD_ERR_RANGE);
    assert_int_equal(td_dtype_nbytes(TD_F32, -1, &nb, &err), TD_ERR_RANGE);
    assert_int_equal(td_dtype_nbytes(TD_DTYPE_INVALID, 1, &nb, &err), TD_ERR_ARG);
    assert_int_equal(td_dtype_nbytes(TD_U8, 0, &nb, &err), TD_OK);
    assert_int_equal(nb, 0);
}

static void shape_numel_rejects_negative_and_overflow(void **state)
{
    (void)state;
    int64_t n;
    td_err err;
    int64_t s[3] = {3, 4, 5};
    assert_int_equal(td_shape_numel(3, s, &n, &err), TD_OK);
    assert_int_equal(n, 60);
    assert_int_equal(td_shape_numel(0, s, &n, &err), TD_OK);
    assert_int_equal(n, 1);
    int64_t z[2] = {0, (int64_t)1 << 62};
    assert_int_equal(td_shape_numel(2, z, &n, &err), TD_OK);
    assert_int_equal(n, 0);
    int64_t neg[2] = {2, -1};
    assert_int_equal(td_shape_numel(2, neg, &n, &err), TD_ERR_RANGE);
    int64_t big[3] = {(int64_t)1 << 31, (int64_t)1 << 31, 4};
    assert_int_equal(td_shape_numel(3, big, &n, &err), TD_ERR_RANGE);
    assert_int_equal(td_shape_numel(9, s, &n, &err), TD_ERR_RANGE);
}

static void tensor_view_contiguity_and_strides(void **state)
{
    (void)state;
    float data[24];
    int64_t s[3] = {2, 3, 4};
    td_tensor t;
    td_tensor_init(&t, TD_F32, 3, s, data, NULL);
    assert_int_equal(t.strides[0], 12);
    assert_int_equal(t.strides[1], 4);
    assert_int_equal(t.strides[2], 1);
    assert_int_equal(td_tensor_numel(&t), 24);
    assert_true(td_tensor_is_contiguous(&t));
    assert_ptr_equal(t.data, data);
    assert_null(t.owner);
    t.strides[1] = 8; /* a strided view */
    assert_false(td_tensor_is_contiguous(&t));
    int64_t one[2] = {1, 5};
    td_tensor_init(&t, TD_F32, 2, one, data, data);
    t.strides[0] = 999; /* size-1 dims do not matter */
    assert_true(td_tensor_is_contiguous(&t));
    assert_ptr_equal(t.owner, data);
    td_tensor_init(&t, TD_F32, 0, NULL, data, NULL);
    assert_int_equal(td_tensor_numel(&t), 1);
    int64_t empty[2] = {3, 0};
    td_tensor_init(&t, TD_F32, 2, empty, NULL, NULL);
    assert_int_equal(td_tensor_numel(&t), 0);
    assert_true(td_tensor_is_contiguous(&t));
}

static void shape_str_formats_and_truncates(void **state)
{
    (void)state;
    char buf[64];
    int64_t s[3] = {151936, 2048, 16};
    assert_string_equal(td_shape_str(3, s, buf, sizeof buf), "[151936, 2048, 16]");
    assert_string_equal(td_shape_str(0, s, buf, sizeof buf), "[]");
    char small[6];
    td_shape_str(3, s, small, sizeof small);
    assert_int_equal(strlen(small), 5); /* truncated, still terminated */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dtype_names_round_trip),
        cmocka_unit_test(dtype_nbytes_checks_whole_bytes_and_overflow),
        cmocka_unit_test(shape_numel_rejects_negative_and_overflow),
        cmocka_unit_test(tensor_view_contiguity_and_strides),
        cmocka_unit_test(shape_str_formats_and_truncates),
    };
    return cmocka_run_group_tests_name("tensor", tests, NULL, NULL);
}
