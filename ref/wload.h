/* wload.h — looking up, checking and viewing the weights of one module for the ref engine.
 *
 * ref_wload_linear: a linear module [rows, cols] under the scheme the quantization metadata
 * gives it (core/quant.h): unquantized BF16/F16/F32, or NVFP4 (ModelOpt / compressed-tensors)
 * with its block scales and scalar global; dtype, shape and block alignment are checked and the
 * error names the tensor. ref_wload_vec: a BF16/F16/F32 tensor of `numel` elements decoded to
 * float32 (exact) into dst. ref_wload_i64: an I64 tensor of `numel` elements (optional: *found
 * is false when the checkpoint lacks it). Views point into the mapped shards (not owned).
 *
 * The _at forms load the tensor named `base` followed by `suffix` (a layer's modules one after
 * another) and do nothing after an earlier error `st`, which they return as is; the vector form
 * decodes into an arena at *v, points *dst at it and moves *v past it, so a sequence reads
 *   st = ref_wload_linear_at(..., "q_proj", ..., st, err);
 *   st = ref_wload_vec_at(..., "q_norm.weight", hd, &v, &w->q_norm, st, err);
 */
#ifndef TD_REF_WLOAD_H
#define TD_REF_WLOAD_H

#include "linear.h"
#include "quant.h"
#include "safetensors.h"

td_status ref_wload_linear(td_st_set *set, const td_quant *q, const char *module, int64_t rows, int64_t cols,
                           ref_linear *out, td_err *err);
td_status ref_wload_vec(td_st_set *set, const ref_numerics *nx, const char *name, int64_t numel, float *dst,
                        td_err *err);
td_status ref_wload_linear_at(td_st_set *set, const td_quant *q, const char *base, const char *suffix, int64_t rows,
                              int64_t cols, ref_linear *out, td_status st, td_err *err);
td_status ref_wload_vec_at(td_st_set *set, const ref_numerics *nx, const char *base, const char *suffix, int64_t numel,
                           float **v, const float **dst, td_status st, td_err *err);
td_status ref_wload_i64(td_st_set *set, const char *name, int64_t numel, int64_t *dst, bool *found, td_err *err);

#endif /* TD_REF_WLOAD_H */
