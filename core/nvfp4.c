/* nvfp4.c — NVFP4 block quantization and dequantization (see nvfp4.h).
 *
 * The quantizer is a transcription of the float32 operation orders of NVFP4_SPEC.md §3.3.
 * Every intermediate is a float32 variable so that each operation is rounded exactly once
 * (the build uses -ffp-contract=off, so no multiply-add is fused).
 */
#include "nvfp4.h"

#include "formats.h"

#include <math.h>
#include <string.h>

#define NVFP4_MAX_NUMEL ((int64_t)1 << 62)

static const char *const nvfp4_conv_names[] = {
    [TD_NVFP4_MODELOPT] = "modelopt",
    [TD_NVFP4_CT] = "compressed-tensors",
};
_Static_assert(TD_ARRAY_LEN(nvfp4_conv_names) == TD_NVFP4_CONV_COUNT,
               "nvfp4_conv_names incomplete");

const char *td_nvfp4_conv_name(td_nvfp4_conv conv)
{
    if ((unsigned)conv >= TD_NVFP4_CONV_COUNT) return "unknown";
    return nvfp4_conv_names[conv];
}

/* Shape checks shared by quantize and dequantize; *numel = rows * k on success. */
static td_status nvfp4_check_shape(const char *fn, int64_t rows, int64_t k, int64_t *numel,
                                   td_err *err)
{
    if (rows < 0 || k < 0)
        return td_err_set(err, TD_ERR_ARG, "%s: negative shape [rows %lld, k %lld]", fn,
                          (long long)rows, (long long)k);
    if (k % TD_NVFP4_BLOCK != 0)
        return td_err_set(err, TD_ERR_ARG,
                          "%s: k = %lld is not a multiple of the NVFP4 block size %d", fn,
                          (long long)k, TD_NVFP4_BLOCK);
    if (k != 0 && rows > NVFP4_MAX_NUMEL / k)
        return td_err_set(err, TD_ERR_ARG, "%s: shape [%lld, %lld] has too many elements", fn,
                          (long long)rows, (long long)k);
    *numel = rows * k;
    return TD_OK;
}

/* ---- quantize ------------------------------------------------------------------------- */

/* One pass over w: reject non-finite values (naming row and column) and find max|w| and the
 * index of its first occurrence. */
static td_status nvfp4_scan(const float *w, int64_t numel, int64_t k, float *max_abs,
                            int64_t *max_at, td_err *err)
{
    float m = 0.0f;
    int64_t at = -1;
    for (int64_t i = 0; i < numel; i++) {
        float v = w[i];
        if (!isfinite(v))
            return td_err_set(err, TD_ERR_ARG,
                              "nvfp4 quantize: w[%lld, %lld] is %s; NVFP4 needs finite weights",
                              (long long)(i / k), (long long)(i % k),
                              isnan(v) ? "NaN" : (v > 0.0f ? "+inf" : "-inf"));
        float a = fabsf(v);
        if (a > m) { m = a; at = i; }
    }
    *max_abs = m;
    *max_at = at;
    return TD_OK;
}

static float block_amax(const float *w)
{
    float m = 0.0f;
    for (int i = 0; i < TD_NVFP4_BLOCK; i++) {
        float a = fabsf(w[i]);
        if (a > m) m = a;
    }
    return m;
}

/* ModelOpt ([MO] nvfp4_tensor.py, with _cast_per_block_scale_to_fp8's clamp). */
static void quantize_block_modelopt(const float *w, float g_dec, float six_g, uint8_t *codes,
                                    uint8_t *scale)
{
    float s_raw = block_amax(w) / six_g;
    if (s_raw == 0.0f) s_raw = 1.0f;            /* zero block -> scale 1.0 */
    if (s_raw < 0x1p-9f) s_raw = 0x1p-9f;       /* clamp to [2^-9, 448]: never 0, never NaN */
    if (s_raw > TD_E4M3_MAX) s_raw = TD_E4M3_MAX;
    uint8_t s = td_f32_to_e4m3(s_raw, TD_E4M3_TORCH);
    float divisor = td_e4m3_to_f32(s) * g_dec;  /* f32(f32(S) * g_dec) */
    for (int i = 0; i < TD_NVFP4_BLOCK; i++) {
        float y = w[i] / divisor;
        codes[i] = td_e2m1_encode(y, TD_E2M1_NEGATIVE);
    }
    *scale = s;
}

/* compressed-tensors (calculate_qparams + _quantize). */
static void quantize_block_ct(const float *w, float g_enc, uint8_t *codes, uint8_t *scale)
{
    float amax_over_6 = block_amax(w) / 6.0f;
    float s_raw = g_enc * amax_over_6;
    if (s_raw > TD_E4M3_MAX) s_raw = TD_E4M3_MAX;
    if (s_raw < -TD_E4M3_MAX) s_raw = -TD_E4M3_MAX;
    uint8_t s = td_f32_to_e4m3(s_raw, TD_E4M3_TORCH);
    if (td_e4m3_to_f32(s) == 0.0f) s = 0x20;    /* zero or underflowed block -> 0.125 */
    float eff = td_e4m3_to_f32(s) / g_enc;
    for (int i = 0; i < TD_NVFP4_BLOCK; i++) {
        float y = w[i] / eff;
        if (y > TD_E2M1_MAX) y = TD_E2M1_MAX;
        if (y < -TD_E2M1_MAX) y = -TD_E2M1_MAX;
        codes[i] = td_e2m1_encode(y, TD_E2M1_SIGNBIT);
    }
    *scale = s;
}

td_status td_nvfp4_quantize(const float *w, int64_t rows, int64_t k, td_nvfp4_conv conv,
                            float amax, uint8_t *packed, uint8_t *scales, float *global,
                            td_err *err)
{
    TD_ASSERT((unsigned)conv < TD_NVFP4_CONV_COUNT);
    TD_ASSERT(global);
    int64_t numel;
    td_status st = nvfp4_check_shape("nvfp4 quantize", rows, k, &numel, err);
    if (st != TD_OK) return st;
    TD_ASSERT(numel == 0 || (w && packed && scales));

    float max_abs = 0.0f;
    int64_t max_at = -1;
    st = nvfp4_scan(w, numel, k, &max_abs, &max_at, err);
    if (st != TD_OK) return st;

    if (isnan(amax)) {
        amax = max_abs;
    } else if (!isfinite(amax) || amax < 0.0f) {
        return td_err_set(err, TD_ERR_RANGE,
                          "nvfp4 quantize: amax %g is not a finite value >= 0 (pass NAN to "
                          "compute it from w)", (double)amax);
    } else if (amax == 0.0f && max_abs != 0.0f) {
        return td_err_set(err, TD_ERR_RANGE,
                          "nvfp4 quantize: amax is 0 but w[%lld, %lld] = %g is non-zero",
                          (long long)(max_at / k), (long long)(max_at % k), (double)w[max_at]);
    }
    if (amax != 0.0f && amax < TD_NVFP4_AMAX_MIN)
        return td_err_set(err, TD_ERR_RANGE,
                          "nvfp4 quantize: amax %g is below %g; the global scale would be "
                          "subnormal", (double)amax, (double)TD_NVFP4_AMAX_MIN);

    /* amax == 0 means an all-zero tensor: global 1.0 (its own reciprocal) makes the standard
     * path produce the zero-block scale and all-zero codes in both conventions. */
    float g;
    if (amax == 0.0f) g = 1.0f;
    else if (conv == TD_NVFP4_MODELOPT) g = amax / TD_NVFP4_AMAX_SCALE;
    else g = TD_NVFP4_AMAX_SCALE / amax;
    float six_g = 6.0f * g; /* ModelOpt rounds 6*g_dec before dividing */

    int64_t nblk = k / TD_NVFP4_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nblk; b++) {
            const float *wb = w + r * k + b * TD_NVFP4_BLOCK;
            uint8_t codes[TD_NVFP4_BLOCK];
            uint8_t *sp = scales + r * nblk + b;
            if (conv == TD_NVFP4_MODELOPT) quantize_block_modelopt(wb, g, six_g, codes, sp);
            else quantize_block_ct(wb, g, codes, sp);
            td_e2m1_pack(codes, TD_NVFP4_BLOCK, packed + r * (k / 2) + b * (TD_NVFP4_BLOCK / 2));
        }
    }
    *global = g;
    return TD_OK;
}

/* ---- dequantize ----------------------------------------------------------------------- */

float td_nvfp4_g_dec(float global, td_nvfp4_conv conv)
{
    TD_ASSERT((unsigned)conv < TD_NVFP4_CONV_COUNT);
    return conv == TD_NVFP4_MODELOPT ? global : 1.0f / global;
}

float td_nvfp4_block_factor(uint8_t scale, float global, td_nvfp4_conv conv)
{
    TD_ASSERT((unsigned)conv < TD_NVFP4_CONV_COUNT);
    float s = td_e4m3_to_f32(scale);
    return conv == TD_NVFP4_MODELOPT ? s * global : s / global;
}

td_status td_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, float global,
                              td_nvfp4_conv conv, int64_t rows, int64_t k, float *out,
                              td_err *err)
{
    TD_ASSERT((unsigned)conv < TD_NVFP4_CONV_COUNT);
    int64_t numel;
    td_status st = nvfp4_check_shape("nvfp4 dequantize", rows, k, &numel, err);
    if (st != TD_OK) return st;
    if (!isfinite(global) || !(global > 0.0f))
        return td_err_set(err, TD_ERR_RANGE,
                          "nvfp4 dequantize: %s global scale %g is not finite and > 0",
                          conv == TD_NVFP4_MODELOPT ? "weight_scale_2" : "weight_global_scale",
                          (double)global);
    TD_ASSERT(numel == 0 || (packed && scales && out));

    int64_t nblk = k / TD_NVFP4_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nblk; b++) {
            float factor = td_nvfp4_block_factor(scales[r * nblk + b], global, conv);
            uint8_t codes[TD_NVFP4_BLOCK];
            td_e2m1_unpack(packed + r * (k / 2) + b * (TD_NVFP4_BLOCK / 2), TD_NVFP4_BLOCK, codes);
            float *ob = out + r * k + b * TD_NVFP4_BLOCK;
            for (int i = 0; i < TD_NVFP4_BLOCK; i++) ob[i] = td_e2m1_to_f32(codes[i]) * factor;
        }
    }
    return TD_OK;
}
