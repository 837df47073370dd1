/* modview.c — one linear module of a checkpoint, found and checked (see modview.h). */
#include "modview.h"

#include <string.h>

static bool shape2(const td_tensor *t, int64_t a, int64_t b)
{
    return t->ndim == 2 && t->shape[0] == a && t->shape[1] == b;
}

td_status td_module_view_get(td_st_set *set, const td_quant *qm, const char *module, int64_t rows, int64_t cols,
                             td_module_view *out, td_err *err)
{
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    td_quant_tensors q;
    td_status st = td_quant_resolve(qm, module, true, &q, err);
    if (st) return st;
    td_tensor w, s, g;
    char have[96];
    switch (q.scheme) {
    case TD_SCHEME_NONE:
        st = td_st_set_tensor(set, q.weight, &w, err);
        if (st) return st;
        if (w.dtype != TD_BF16 && w.dtype != TD_F16 && w.dtype != TD_F32)
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: dtype %s, expected BF16, F16 or F32 (unquantized module)",
                              q.weight, td_dtype_name(w.dtype));
        if (!shape2(&w, rows, cols)) {
            td_shape_str(w.ndim, w.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: shape %s, expected [%lld, %lld]", q.weight, have,
                              (long long)rows, (long long)cols);
        }
        out->dtype = w.dtype;
        out->w = w.data;
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
        if (w.dtype != TD_U8 || !shape2(&w, rows, cols / 2)) {
            td_shape_str(w.ndim, w.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected U8 [%lld, %lld] (packed E2M1)", q.weight,
                              td_dtype_name(w.dtype), have, (long long)rows, (long long)(cols / 2));
        }
        if (s.dtype != TD_F8_E4M3 || !shape2(&s, rows, cols / TD_NVFP4_BLOCK)) {
            td_shape_str(s.ndim, s.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected F8_E4M3 [%lld, %lld] (block scales)",
                              q.scale, td_dtype_name(s.dtype), have, (long long)rows,
                              (long long)(cols / TD_NVFP4_BLOCK));
        }
        if (g.dtype != TD_F32 || td_tensor_numel(&g) != 1 || g.ndim > 1) {
            td_shape_str(g.ndim, g.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected an F32 scalar (global scale)", q.global,
                              td_dtype_name(g.dtype), have);
        }
        out->nvfp4 = true;
        out->w = w.data;
        out->scales = (const uint8_t *)s.data;
        memcpy(&out->global, g.data, sizeof out->global);
        out->conv = q.scheme == TD_SCHEME_NVFP4 ? TD_NVFP4_MODELOPT : TD_NVFP4_CT;
        return TD_OK;
    default:
        return td_err_set(err, TD_ERR_UNSUPPORTED, "module %s: scheme %s is not supported by the engines yet", module,
                          td_scheme_name(q.scheme));
    }
}
