/* wload.c — module weight lookup for the ref engine (see wload.h). */
#include "wload.h"

#include <string.h>

static bool shape_is(const td_tensor *t, int ndim, int64_t a, int64_t b)
{
    if (t->ndim != ndim) return false;
    const int64_t want[2] = {a, b};
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != want[i]) return false;
    return true;
}

td_status ref_wload_linear(td_st_set *set, const td_quant *qm, const char *module, int64_t rows, int64_t cols,
                           ref_linear *out, td_err *err)
{
    td_quant_tensors q;
    td_status st = td_quant_resolve(qm, module, true, &q, err);
    if (st) return st;
    td_tensor w, s, g;
    char have[96];
    switch (q.scheme) {
    case TD_SCHEME_NONE:
        st = td_st_set_tensor(set, q.weight, &w, err);
        if (st) return st;
        td_shape_str(w.ndim, w.shape, have, sizeof have);
        if ((w.dtype != TD_BF16 && w.dtype != TD_F16 && w.dtype != TD_F32) || !shape_is(&w, 2, rows, cols))
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected BF16/F16/F32 [%lld, %lld]", q.weight,
                              td_dtype_name(w.dtype), have, (long long)rows, (long long)cols);
        ref_linear_dense(out, w.dtype, rows, cols, w.data);
        return TD_OK;
    case TD_SCHEME_NVFP4:
    case TD_SCHEME_NVFP4_CT:
        if (cols % TD_NVFP4_BLOCK)
            return td_err_set(err, TD_ERR_FORMAT, "module %s: %lld input features is not a multiple of 16 (NVFP4)",
                              module, (long long)cols);
        st = td_st_set_tensor(set, q.weight, &w, err);
        if (!st) st = td_st_set_tensor(set, q.scale, &s, err);
        if (!st) st = td_st_set_tensor(set, q.global, &g, err);
        if (st) return st;
        if (w.dtype != TD_U8 || !shape_is(&w, 2, rows, cols / 2)) {
            td_shape_str(w.ndim, w.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected U8 [%lld, %lld] (packed E2M1)", q.weight,
                              td_dtype_name(w.dtype), have, (long long)rows, (long long)(cols / 2));
        }
        if (s.dtype != TD_F8_E4M3 || !shape_is(&s, 2, rows, cols / TD_NVFP4_BLOCK)) {
            td_shape_str(s.ndim, s.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected F8_E4M3 [%lld, %lld] (block scales)",
                              q.scale, td_dtype_name(s.dtype), have, (long long)rows,
                              (long long)(cols / TD_NVFP4_BLOCK));
        }
        if (g.dtype != TD_F32 || td_tensor_numel(&g) != 1 || g.ndim > 1)
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: expected an F32 scalar (global scale)", q.global);
        float gv;
        memcpy(&gv, g.data, sizeof gv);
        ref_linear_nvfp4(out, q.scheme == TD_SCHEME_NVFP4 ? TD_NVFP4_MODELOPT : TD_NVFP4_CT, rows, cols, w.data,
                         s.data, gv);
        return TD_OK;
    default:
        return td_err_set(err, TD_ERR_UNSUPPORTED, "module %s: scheme %s is not supported by the ref engine",
                          module, td_scheme_name(q.scheme));
    }
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
