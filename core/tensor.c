/* tensor.c — dtype table and tensor views (see tensor.h). */
#include "tensor.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int bits;
    bool is_float;
} td_dtype_table[] = {
    [TD_DTYPE_INVALID] = {"INVALID", 0, false},
    [TD_BOOL] = {"BOOL", 8, false},
    [TD_U8] = {"U8", 8, false},
    [TD_I8] = {"I8", 8, false},
    [TD_F8_E5M2] = {"F8_E5M2", 8, true},
    [TD_F8_E4M3] = {"F8_E4M3", 8, true},
    [TD_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, true},
    [TD_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, true},
    [TD_F8_E8M0] = {"F8_E8M0", 8, true},
    [TD_F4] = {"F4", 4, true},
    [TD_F6_E2M3] = {"F6_E2M3", 6, true},
    [TD_F6_E3M2] = {"F6_E3M2", 6, true},
    [TD_I16] = {"I16", 16, false},
    [TD_U16] = {"U16", 16, false},
    [TD_F16] = {"F16", 16, true},
    [TD_BF16] = {"BF16", 16, true},
    [TD_I32] = {"I32", 32, false},
    [TD_U32] = {"U32", 32, false},
    [TD_F32] = {"F32", 32, true},
    [TD_C64] = {"C64", 64, true},
    [TD_F64] = {"F64", 64, true},
    [TD_I64] = {"I64", 64, false},
    [TD_U64] = {"U64", 64, false},
};
_Static_assert(TD_ARRAY_LEN(td_dtype_table) == TD_DTYPE_COUNT, "td_dtype_table incomplete");

td_dtype td_dtype_from_name(const char *name)
{
    if (!name) return TD_DTYPE_INVALID;
    for (int i = 1; i < TD_DTYPE_COUNT; i++)
        if (strcmp(name, td_dtype_table[i].name) == 0) return (td_dtype)i;
    return TD_DTYPE_INVALID;
}

const char *td_dtype_name(td_dtype dt)
{
    if ((unsigned)dt >= TD_DTYPE_COUNT) return "INVALID";
    return td_dtype_table[dt].name;
}

int td_dtype_bits(td_dtype dt)
{
    if ((unsigned)dt >= TD_DTYPE_COUNT) return 0;
    return td_dtype_table[dt].bits;
}

bool td_dtype_is_float(td_dtype dt)
{
    if ((unsigned)dt >= TD_DTYPE_COUNT) return false;
    return td_dtype_table[dt].is_float;
}

#define TD_NUMEL_MAX ((int64_t)1 << 62)

td_status td_shape_numel(int ndim, const int64_t *shape, int64_t *numel, td_err *err)
{
    if (ndim < 0 || ndim > TD_MAX_DIMS)
        return td_err_set(err, TD_ERR_RANGE, "rank %d outside 0..%d", ndim, TD_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return td_err_set(err, TD_ERR_RANGE, "negative dimension %lld", (long long)shape[i]);
        if (shape[i] != 0 && n > TD_NUMEL_MAX / shape[i])
            return td_err_set(err, TD_ERR_RANGE, "element count overflows");
        n *= shape[i];
    }
    *numel = n;
    return TD_OK;
}

td_status td_dtype_nbytes(td_dtype dt, int64_t numel, int64_t *nbytes, td_err *err)
{
    int bits = td_dtype_bits(dt);
    if (bits == 0) return td_err_set(err, TD_ERR_ARG, "invalid dtype");
    if (numel < 0 || numel > TD_NUMEL_MAX)
        return td_err_set(err, TD_ERR_RANGE, "element count %lld out of range", (long long)numel);
    /* numel <= 2^62 and bits <= 64: compute numel*bits without overflow via division. */
    int64_t whole = numel / 8, rem = numel % 8;
    int64_t total_bits_rem = rem * bits;
    if (total_bits_rem % 8 != 0)
        return td_err_set(err, TD_ERR_FORMAT, "%lld elements of %s are not a whole number of bytes",
                          (long long)numel, td_dtype_name(dt));
    if (whole > INT64_MAX / bits)
        return td_err_set(err, TD_ERR_RANGE, "byte count overflows");
    *nbytes = whole * bits + total_bits_rem / 8;
    return TD_OK;
}

void td_tensor_init(td_tensor *t, td_dtype dt, int ndim, const int64_t *shape, void *data,
                    const void *owner)
{
    TD_ASSERT(t && ndim >= 0 && ndim <= TD_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->strides[i] = stride;
        stride *= shape[i] > 0 ? shape[i] : 1;
    }
    t->data = data;
    t->owner = owner;
}

int64_t td_tensor_numel(const td_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

bool td_tensor_is_contiguous(const td_tensor *t)
{
    if (td_tensor_numel(t) == 0) return true; /* no element to be out of place */
    int64_t stride = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != stride) return false;
        stride *= t->shape[i];
    }
    return true;
}

char *td_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap)
{
    if (cap == 0) return buf;
    size_t used = 0;
    buf[0] = '\0';
    int n = snprintf(buf, cap, "[");
    if (n > 0) used = (size_t)n < cap ? (size_t)n : cap - 1;
    for (int i = 0; i < ndim && used < cap - 1; i++) {
        n = snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (n < 0) break;
        used += (size_t)n < cap - used ? (size_t)n : cap - used - 1;
    }
    if (used < cap - 1) snprintf(buf + used, cap - used, "]");
    return buf;
}
