/* linear.h — reference linear layers: NVFP4 (ModelOpt and compressed-tensors conventions) and
 * dense BF16/F16/F32 weights, y = W x, in a fixed, documented arithmetic order.
 *
 * Numerics (docs/engine.md, "Linear layers")
 * - Weight W [rows, cols] (row = output, col = input/reduction index K). Each element is
 *   decoded to float32 exactly as the format says:
 *     dense      BF16/F16/F32 -> float32, exact;
 *     NVFP4      w = fl32(e2m1(code) * eff), eff the block's effective scale:
 *                scale=exact  eff = fl32(f32(e4m3 S) * g_dec)   (ModelOpt: g_dec = weight_scale_2)
 *                             eff = fl32(f32(e4m3 S) / g_enc)   (compressed-tensors)
 *                scale=fp16   eff = f32(fp16_rn(the exact eff))  (prepared FP16 storage, NVFP4_SPEC
 *                             §5.8: FP16(FP32(E4M3) x global), one rounding of the FP32 product)
 *                Element 2j of a row is the low nibble of byte j (NVFP4_SPEC §2.3).
 * - Dot products: accum=fp32: acc = +0.0f, then for k = 0, 1, ..., cols-1 in ascending order
 *   acc = fl32(acc + fl32(w[k] * x[k])) (two roundings per step: the build disables FMA
 *   contraction). accum=fp64: the same loop in double (products of two floats are exact in
 *   double), rounded to float32 once at the end.
 *   Several outputs may be computed at once (rows or input vectors interleaved) to keep the
 *   CPU busy, but every output keeps exactly this order, so results do not depend on tiling,
 *   thread count or the number of input vectors.
 * - Faults (td_fault, audit self-tests only): nibble_order reads element 2j from the high
 *   nibble; reciprocal_global uses the stored global the wrong way round (S / g for ModelOpt,
 *   S * g for compressed-tensors). Other faults do not concern linears.
 * - Activations are not quantized (W4A16, as the seed audit runs NVFP4): input_scale tensors
 *   are ignored.
 *
 * Views and TP slices
 * - A ref_linear is a view into mapped tensors (nothing owned). ref_linear_rows_slice keeps
 *   rows [r0, r0+n) (a column-parallel shard: W13 rows); ref_linear_cols_slice keeps columns
 *   [c0, c0+n) (a row-parallel shard: W2 columns). NVFP4 column slices must start and end on
 *   16-element blocks (TD_ERR_RANGE otherwise).
 *
 * Contract
 * - ref_linear_rows() writes y[i][r - r0] for every input i in [0, n_in) and row r in
 *   [r0, r1); x[i] points at `cols` floats, y[i] at r1 - r0 floats. It reads `scratch`
 *   (REF_LINEAR_SCRATCH(cols) floats, caller-owned) and allocates nothing. Inputs and
 *   outputs must not overlap. Thread-safe for distinct outputs and scratch.
 * - Views are built and checked (dtype, shape, alignment of slices) by the caller's loader;
 *   the functions here assert their invariants (TD_ASSERT).
 */
#ifndef TD_REF_LINEAR_H
#define TD_REF_LINEAR_H

#include "engine.h"
#include "nvfp4.h"
#include "tensor.h"

#include <stdbool.h>
#include <stdint.h>

/* Rows decoded at once by ref_linear_rows (a tile of outputs sharing one input vector). */
#define REF_LINEAR_TILE 4
/* Scratch floats ref_linear_rows needs for a weight of `cols` columns. */
#define REF_LINEAR_SCRATCH(cols) ((size_t)REF_LINEAR_TILE * (size_t)(cols))

typedef enum ref_wkind {
    REF_W_DENSE = 0,   /* BF16 / F16 / F32 elements */
    REF_W_NVFP4,       /* packed E2M1 + E4M3 block scales + F32 global */
} ref_wkind;

typedef struct ref_linear {
    ref_wkind kind;
    td_dtype dtype;         /* DENSE: TD_BF16, TD_F16 or TD_F32 */
    td_nvfp4_conv conv;     /* NVFP4: ModelOpt (global = g_dec) or compressed-tensors (g_enc) */
    int64_t rows, cols;     /* logical shape of this view [rows, cols] */
    const uint8_t *w;       /* DENSE: element (0, 0) of the view; NVFP4: packed byte of (0, 0) */
    int64_t w_stride;       /* bytes between consecutive rows */
    const uint8_t *scales;  /* NVFP4: E4M3 scale of block (0, 0) of the view */
    int64_t s_stride;       /* NVFP4: bytes between consecutive rows of scales */
    float global;           /* NVFP4: the stored global (weight_scale_2 or weight_global_scale) */
} ref_linear;

/* How a linear computes (the parts of a variant that concern it). */
typedef struct ref_numerics {
    td_accum accum;
    td_scale_mode scale;
    td_fault fault;
} ref_numerics;

/* A dense view of a row-major [rows, cols] tensor at `data` (any alignment). */
void ref_linear_dense(ref_linear *l, td_dtype dtype, int64_t rows, int64_t cols, const void *data);
/* An NVFP4 view: packed [rows, cols/2], scales [rows, cols/16], scalar global. cols % 16 == 0. */
void ref_linear_nvfp4(ref_linear *l, td_nvfp4_conv conv, int64_t rows, int64_t cols,
                      const uint8_t *packed, const uint8_t *scales, float global);

/* Row slice [r0, r0 + n) of `src`. */
td_status ref_linear_rows_slice(const ref_linear *src, int64_t r0, int64_t n, ref_linear *out,
                                td_err *err);
/* Column slice [c0, c0 + n) of `src` (multiples of 16 for NVFP4). */
td_status ref_linear_cols_slice(const ref_linear *src, int64_t c0, int64_t n, ref_linear *out,
                                td_err *err);

/* The effective block scale of NVFP4 scale byte `s` under the numerics (see above). */
float ref_nvfp4_eff_scale(uint8_t s, float global, td_nvfp4_conv conv, const ref_numerics *nx);

/* Decode row r of the view into out[cols] (float32, the exact element values). */
void ref_linear_decode_row(const ref_linear *l, const ref_numerics *nx, int64_t r, float *out);

/* y[i][r - r0] = W[r, :] . x[i] for i in [0, n_in), r in [r0, r1) (see the contract). */
void ref_linear_rows(const ref_linear *l, const ref_numerics *nx, int64_t r0, int64_t r1,
                     const float *const *x, float *const *y, int64_t n_in, float *scratch);

/* One dot product in the documented order (used for single values such as the shared-expert
 * gate): sum over k ascending of w[k] * x[k]. */
float ref_dot(const float *w, const float *x, int64_t n, td_accum accum);

#endif /* TD_REF_LINEAR_H */
