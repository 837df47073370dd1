/* linear.c — reference linear layers (see linear.h for the numerics). */
#include "linear.h"
#include "formats.h"

#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* E2M1 code -> value (NVFP4_SPEC §2.1); code 8 is -0.0. */
static const float e2m1_values[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/* ==== views ================================================================================== */

void ref_linear_dense(ref_linear *l, td_dtype dtype, int64_t rows, int64_t cols, const void *data)
{
    TD_ASSERT(dtype == TD_BF16 || dtype == TD_F16 || dtype == TD_F32);
    TD_ASSERT(rows >= 0 && cols >= 0);
    memset(l, 0, sizeof *l);
    l->kind = REF_W_DENSE;
    l->dtype = dtype;
    l->rows = rows;
    l->cols = cols;
    l->w = data;
    l->w_stride = cols * (dtype == TD_F32 ? 4 : 2);
}

void ref_linear_nvfp4(ref_linear *l, td_nvfp4_conv conv, int64_t rows, int64_t cols,
                      const uint8_t *packed, const uint8_t *scales, float global)
{
    TD_ASSERT(rows >= 0 && cols >= 0 && cols % TD_NVFP4_BLOCK == 0);
    memset(l, 0, sizeof *l);
    l->kind = REF_W_NVFP4;
    l->dtype = TD_U8;
    l->conv = conv;
    l->rows = rows;
    l->cols = cols;
    l->w = packed;
    l->w_stride = cols / 2;
    l->scales = scales;
    l->s_stride = cols / TD_NVFP4_BLOCK;
    l->global = global;
}

td_status ref_linear_rows_slice(const ref_linear *src, int64_t r0, int64_t n, ref_linear *out,
                                td_err *err)
{
    if (r0 < 0 || n < 0 || r0 + n > src->rows)
        return td_err_set(err, TD_ERR_RANGE, "row slice [%lld, %lld) outside %lld rows", (long long)r0,
                          (long long)(r0 + n), (long long)src->rows);
    *out = *src;
    out->rows = n;
    out->w = src->w + r0 * src->w_stride;
    if (src->kind == REF_W_NVFP4) out->scales = src->scales + r0 * src->s_stride;
    return TD_OK;
}

td_status ref_linear_cols_slice(const ref_linear *src, int64_t c0, int64_t n, ref_linear *out,
                                td_err *err)
{
    if (c0 < 0 || n < 0 || c0 + n > src->cols)
        return td_err_set(err, TD_ERR_RANGE, "column slice [%lld, %lld) outside %lld columns",
                          (long long)c0, (long long)(c0 + n), (long long)src->cols);
    *out = *src;
    out->cols = n;
    if (src->kind == REF_W_NVFP4) {
        if (c0 % TD_NVFP4_BLOCK || n % TD_NVFP4_BLOCK)
            return td_err_set(err, TD_ERR_RANGE,
                              "NVFP4 column slice [%lld, %lld) does not fall on 16-element blocks",
                              (long long)c0, (long long)(c0 + n));
        out->w = src->w + c0 / 2;
        out->scales = src->scales + c0 / TD_NVFP4_BLOCK;
    } else {
        out->w = src->w + c0 * (src->dtype == TD_F32 ? 4 : 2);
    }
    return TD_OK;
}

/* ==== decoding =============================================================================== */

float ref_nvfp4_eff_scale(uint8_t s, float global, td_nvfp4_conv conv, const ref_numerics *nx)
{
    float sf = td_e4m3_to_f32(s);
    bool multiply = conv == TD_NVFP4_MODELOPT;
    if (nx->fault == TD_FAULT_RECIPROCAL_GLOBAL) multiply = !multiply;
    float eff = multiply ? sf * global : sf / global;
    if (nx->scale == TD_SCALE_FP16) eff = td_f16_to_f32(td_f32_to_f16(eff));
    return eff;
}

void ref_linear_decode_row(const ref_linear *l, const ref_numerics *nx, int64_t r, float *out)
{
    TD_ASSERT(r >= 0 && r < l->rows);
    const uint8_t *src = l->w + r * l->w_stride; /* [w_stride] bytes of row r */
    const int64_t n = l->cols;
    if (l->kind == REF_W_DENSE) {
        switch (l->dtype) {
        case TD_F32:
            memcpy(out, src, (size_t)n * 4);
            break;
        case TD_BF16:
            for (int64_t k = 0; k < n; k++) {
                uint32_t u = ((uint32_t)src[2 * k] | (uint32_t)src[2 * k + 1] << 8) << 16;
                memcpy(&out[k], &u, 4);
            }
            break;
        default: /* TD_F16 */
            for (int64_t k = 0; k < n; k++)
                out[k] = td_f16_to_f32((uint16_t)(src[2 * k] | src[2 * k + 1] << 8));
            break;
        }
        return;
    }
    const uint8_t *sc = l->scales + r * l->s_stride; /* [cols/16] E4M3 scales of row r */
    const bool swap = nx->fault == TD_FAULT_NIBBLE_ORDER;
    const int lo_shift = swap ? 4 : 0, hi_shift = swap ? 0 : 4;
    float tab[16]; /* [16] the block's decoded values, one per code */
    for (int64_t b = 0; b < n / TD_NVFP4_BLOCK; b++) {
        float eff = ref_nvfp4_eff_scale(sc[b], l->global, l->conv, nx);
        for (int c = 0; c < 16; c++) tab[c] = e2m1_values[c] * eff;
        const uint8_t *p = src + b * (TD_NVFP4_BLOCK / 2); /* [8] packed bytes of the block */
        float *o = out + b * TD_NVFP4_BLOCK;               /* [16] decoded elements */
        for (int j = 0; j < TD_NVFP4_BLOCK / 2; j++) {
            o[2 * j] = tab[(p[j] >> lo_shift) & 0xF];
            o[2 * j + 1] = tab[(p[j] >> hi_shift) & 0xF];
        }
    }
}

/* ==== dot products (ascending k, one accumulator per output) ================================ */

float ref_dot(const float *w, const float *x, int64_t n, td_accum accum)
{
    if (accum == TD_ACCUM_FP64) {
        double acc = 0.0;
        for (int64_t k = 0; k < n; k++) acc += (double)w[k] * (double)x[k];
        return (float)acc;
    }
    float acc = 0.0f;
    for (int64_t k = 0; k < n; k++) acc += w[k] * x[k];
    return acc;
}

/* One weight row against four input vectors: four independent accumulators. */
static void dot_1x4_f32(const float *w, const float *const *x, int64_t n, float out[4])
{
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        const float wk = w[k];
        a0 += wk * x0[k];
        a1 += wk * x1[k];
        a2 += wk * x2[k];
        a3 += wk * x3[k];
    }
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
}

/* Four weight rows (w, w + n, w + 2n, w + 3n) against one input vector. */
static void dot_4x1_f32(const float *w, const float *x, int64_t n, float out[4])
{
    const float *w0 = w, *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        const float xk = x[k];
        a0 += w0[k] * xk;
        a1 += w1[k] * xk;
        a2 += w2[k] * xk;
        a3 += w3[k] * xk;
    }
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
}

static void dot_1x4_f64(const float *w, const float *const *x, int64_t n, float out[4])
{
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    for (int64_t k = 0; k < n; k++) {
        const double wk = (double)w[k];
        a0 += wk * (double)x0[k];
        a1 += wk * (double)x1[k];
        a2 += wk * (double)x2[k];
        a3 += wk * (double)x3[k];
    }
    out[0] = (float)a0;
    out[1] = (float)a1;
    out[2] = (float)a2;
    out[3] = (float)a3;
}

static void dot_4x1_f64(const float *w, const float *x, int64_t n, float out[4])
{
    const float *w0 = w, *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    for (int64_t k = 0; k < n; k++) {
        const double xk = (double)x[k];
        a0 += (double)w0[k] * xk;
        a1 += (double)w1[k] * xk;
        a2 += (double)w2[k] * xk;
        a3 += (double)w3[k] * xk;
    }
    out[0] = (float)a0;
    out[1] = (float)a1;
    out[2] = (float)a2;
    out[3] = (float)a3;
}

/* ==== the linear ============================================================================= */

void ref_linear_rows(const ref_linear *l, const ref_numerics *nx, int64_t r0, int64_t r1,
                     const float *const *x, float *const *y, int64_t n_in, float *scratch)
{
    TD_ASSERT(r0 >= 0 && r0 <= r1 && r1 <= l->rows && n_in >= 0);
    const int64_t n = l->cols;
    const bool f64 = nx->accum == TD_ACCUM_FP64;
    float out[4];
    for (int64_t r = r0; r < r1; r += REF_LINEAR_TILE) {
        const int64_t nr = r1 - r < REF_LINEAR_TILE ? r1 - r : REF_LINEAR_TILE;
        /* scratch: [nr, n] decoded rows r .. r + nr - 1 */
        for (int64_t j = 0; j < nr; j++) ref_linear_decode_row(l, nx, r + j, scratch + j * n);
        const int64_t o = r - r0; /* output index of row r */
        int64_t i = 0;
        /* groups of four inputs share each decoded row */
        for (; i + 4 <= n_in; i += 4) {
            for (int64_t j = 0; j < nr; j++) {
                if (f64) dot_1x4_f64(scratch + j * n, x + i, n, out);
                else dot_1x4_f32(scratch + j * n, x + i, n, out);
                for (int q = 0; q < 4; q++) y[i + q][o + j] = out[q];
            }
        }
        /* the remaining inputs: four rows at a time, then one */
        for (; i < n_in; i++) {
            if (nr == REF_LINEAR_TILE) {
                if (f64) dot_4x1_f64(scratch, x[i], n, out);
                else dot_4x1_f32(scratch, x[i], n, out);
                for (int q = 0; q < 4; q++) y[i][o + q] = out[q];
            } else {
                for (int64_t j = 0; j < nr; j++) y[i][o + j] = ref_dot(scratch + j * n, x[i], n, nx->accum);
            }
        }
    }
}
