/* wload.c — module weight lookup for the ref engine (see wload.h). */
#include "wload.h"
#include "modview.h"

#include <stdio.h>
#include <string.h>

td_status ref_wload_linear(td_st_set *set, const td_quant *qm, const char *module, int64_t rows, int64_t cols,
                           ref_linear *out, td_err *err)
{
    td_module_view v;
    td_status st = td_module_view_get(set, qm, module, rows, cols, &v, err);
    if (st) return st;
    if (v.nvfp4) ref_linear_nvfp4(out, v.conv, rows, cols, v.w, v.scales, v.global);
    else ref_linear_dense(out, v.dtype, rows, cols, v.w);
    return TD_OK;
}

td_status ref_wload_vec(td_st_set *set, const ref_numerics *nx, const char *name, int64_t numel, float *dst,
                        td_err *err)
{
    td_tensor t;
    td_status st = td_st_set_tensor(set, name, &t, err);
    if (st) return st;
    if ((t.dtype != TD_BF16 && t.dtype != TD_F16 && t.dtype != TD_F32) || td_tensor_numel(&t) != numel) {
        char have[96];
        td_shape_str(t.ndim, t.shape, have, sizeof have);
        return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected BF16/F16/F32 with %lld elements", name,
                          td_dtype_name(t.dtype), have, (long long)numel);
    }
    ref_linear l;
    ref_linear_dense(&l, t.dtype, 1, numel, t.data);
    ref_linear_decode_row(&l, nx, 0, dst);
    return TD_OK;
}

td_status ref_wload_linear_at(td_st_set *set, const td_quant *q, const char *base, const char *suffix, int64_t rows,
                              int64_t cols, ref_linear *out, td_status st, td_err *err)
{
    if (st) return st;
    char name[320];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    return ref_wload_linear(set, q, name, rows, cols, out, err);
}

td_status ref_wload_vec_at(td_st_set *set, const ref_numerics *nx, const char *base, const char *suffix, int64_t numel,
                           float **v, const float **dst, td_status st, td_err *err)
{
    if (st) return st;
    char name[320];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    st = ref_wload_vec(set, nx, name, numel, *v, err);
    *dst = *v;
    *v += numel;
    return st;
}

td_status ref_wload_i64(td_st_set *set, const char *name, int64_t numel, int64_t *dst, bool *found, td_err *err)
{
    *found = false;
    if (!td_st_set_has(set, name)) return TD_OK;
    td_tensor t;
    td_status st = td_st_set_tensor(set, name, &t, err);
    if (st) return st;
    if (t.dtype != TD_I64 || td_tensor_numel(&t) != numel)
        return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s, expected I64 with %lld elements", name,
                          td_dtype_name(t.dtype), (long long)numel);
    memcpy(dst, t.data, (size_t)numel * sizeof *dst);
    *found = true;
    return TD_OK;
}
