/* tensor.h — dtypes and tensor views.
 *
 * Contract
 * - td_dtype enumerates every safetensors dtype string (NVFP4_SPEC.md §6.2). Bit widths are
 *   exact (F4 = 4, F6_* = 6); td_dtype_nbytes() computes the byte size of an element count and
 *   fails when it is not a whole number of bytes or overflows.
 * - td_tensor is a *view*: it never owns data by itself. `owner` names what keeps `data`
 *   alive (a mapped file, an arena, or NULL when the caller owns the buffer); freeing the
 *   owner invalidates the view. Shapes have at most TD_MAX_DIMS dimensions; strides are in
 *   elements (row-major contiguous views have strides = suffix products of the shape).
 *   For sub-byte dtypes only contiguous views are meaningful.
 * - All functions are pure and thread-safe.
 */
#ifndef TD_TENSOR_H
#define TD_TENSOR_H

#include "td.h"

#include <stdbool.h>

typedef enum td_dtype {
    TD_DTYPE_INVALID = 0,
    TD_BOOL, TD_U8, TD_I8, TD_F8_E5M2, TD_F8_E4M3, TD_F8_E4M3FNUZ, TD_F8_E5M2FNUZ, TD_F8_E8M0,
    TD_F4, TD_F6_E2M3, TD_F6_E3M2,
    TD_I16, TD_U16, TD_F16, TD_BF16,
    TD_I32, TD_U32, TD_F32,
    TD_C64, TD_F64, TD_I64, TD_U64,
    TD_DTYPE_COUNT
} td_dtype;

#define TD_MAX_DIMS 8

typedef struct td_tensor {
    td_dtype dtype;
    int ndim;                      /* 0 = scalar */
    int64_t shape[TD_MAX_DIMS];    /* logical element counts per dimension */
    int64_t strides[TD_MAX_DIMS];  /* in elements */
    void *data;                    /* first element; borrowed */
    const void *owner;             /* what keeps data alive; NULL = caller */
} td_tensor;

/* safetensors dtype string ("BF16") → dtype; TD_DTYPE_INVALID when unknown. */
td_dtype td_dtype_from_name(const char *name);
/* dtype → safetensors string; "INVALID" for an unknown value. */
const char *td_dtype_name(td_dtype dt);
/* Bits per element (4, 6, 8, 16, 32, 64, or 0 for invalid). */
int td_dtype_bits(td_dtype dt);
/* true for floating types (F*, BF16). */
bool td_dtype_is_float(td_dtype dt);

/* Number of elements of a shape (1 for ndim 0). Fails on negative dims or overflow past
 * 2^62. */
td_status td_shape_numel(int ndim, const int64_t *shape, int64_t *numel, td_err *err);

/* Bytes of `numel` elements of dt. Fails when not a whole number of bytes (sub-byte dtypes)
 * or on overflow. */
td_status td_dtype_nbytes(td_dtype dt, int64_t numel, int64_t *nbytes, td_err *err);

/* Fill a contiguous row-major view. ndim <= TD_MAX_DIMS is asserted. */
void td_tensor_init(td_tensor *t, td_dtype dt, int ndim, const int64_t *shape, void *data,
                    const void *owner);

/* Element count of a view. */
int64_t td_tensor_numel(const td_tensor *t);

/* true when strides are row-major contiguous. */
bool td_tensor_is_contiguous(const td_tensor *t);

/* Format a shape as "[a, b, c]" into buf (always NUL-terminated). Returns buf. */
char *td_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

#endif /* TD_TENSOR_H */
