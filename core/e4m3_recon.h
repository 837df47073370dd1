/* e4m3_recon.h — the arithmetic of E4M3 block-scale storage on the SM70 NVFP4 path: prepared
 * FP16 scales, the strict (prefill) and fast (decode) reconstructions from raw E4M3 codes, the
 * effective HMMA decode scale, and the per-element admission verdict with its reason class.
 * NVFP4_SPEC.md §5.8 and SEED_AUDITS.md §2.2-§2.6 define every formula used here.
 *
 * Contract
 * - td_codec is a table of the scalar conversions the audit relies on (E4M3, E2M1, FP16,
 *   BF16). td_codec_tandem() returns tandem's own (core/formats.h). Every function below that
 *   models a host-side torch/FP32 operation takes a codec, so a test can substitute a codec with
 *   a planted bug and watch the audit catch it. The FP16 *hardware* operations of the decode
 *   kernel (__hmul, __hfma) are emulated by td_f16_mul / td_f16_fma, which use their own exact
 *   arithmetic and never the codec.
 * - FP16 values are IEEE binary16 bit patterns (uint16_t). Comparisons that the seed makes with
 *   torch.equal on non-NaN values and isnan() on NaN positions use td_f16_same(): equal bit
 *   patterns, or both NaN (the NaN payload does not matter). Signed zeros and infinities are
 *   compared by bits.
 * - Exactness of the FP16 emulation: an FP16 value has an 11-bit significand and is a multiple
 *   of 2^-24, so a product of two FP16 values has at most 22 significant bits and is exact in
 *   binary64 (and in binary32: its exponent stays within [-48, 32]). The sum of that product
 *   and a third FP16 value may need more than 53 bits, so td_f16_fma() computes it with an
 *   error-free transformation (Knuth's TwoSum: s + e == p + c exactly, which holds because the
 *   build forbids FP contraction) and rounds s + e once to FP16, letting e decide the
 *   direction only when s lies exactly on an FP16 rounding boundary. That is exactly one
 *   rounding of the exact a*b + c, i.e. an IEEE fused multiply-add in binary16, which is what
 *   __hfma computes. The TwoSum needs binary64 + and - to round to nearest (the C default
 *   mode); nothing here changes the mode.
 * - Pure functions, no allocation, no global state, thread-safe. This file and its .c depend
 *   on core/formats.h, core/td.h and libc only and compile as C11 or as C++ (the GPU
 *   cross-check compiles them into a CUDA program).
 */
#ifndef TD_E4M3_RECON_H
#define TD_E4M3_RECON_H

#include "td.h"
#include "formats.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the codec under audit ----------------------------------------------------------------- */

typedef struct td_codec {
    const char *name;                                    /* "tandem", or a test's label */
    float (*e4m3_to_f32)(uint8_t code);
    uint8_t (*f32_to_e4m3)(float x, td_e4m3_mode mode);
    float (*e2m1_to_f32)(uint8_t code);
    uint8_t (*e2m1_encode)(float y, td_e2m1_sign rule);  /* non-failing form (NaN -> 0x7) */
    td_status (*f32_to_e2m1)(float y, td_e2m1_sign rule, uint8_t *code, td_err *err);
    uint16_t (*f32_to_f16)(float x);
    float (*f16_to_f32)(uint16_t h);
    uint16_t (*f32_to_bf16)(float x);
    float (*bf16_to_f32)(uint16_t h);
} td_codec;

/* tandem's conversions (core/formats.h). Never NULL; a constant table. */
const td_codec *td_codec_tandem(void);

/* ---- exact FP16 arithmetic (hardware __hmul / __hfma) --------------------------------------- */

#define TD_F16_MIN_NORMAL 0x0400u  /* 2^-14 */
#define TD_F16_MAX_FINITE 0x7BFFu  /* 65504 */
#define TD_F16_INF 0x7C00u
#define TD_F16_QNAN 0x7E00u

/* Exact value of an FP16 pattern as a double (NaN for NaN patterns). Independent of the codec. */
double td_f16_value(uint16_t h);
/* Round s + e to FP16 (RNE, overflow to ±inf, subnormals kept), where e is 0 or the exact
 * error term of a TwoSum with |e| <= ulp(s)/2; e matters only when s lies exactly on an FP16
 * rounding boundary. NaN gives a quiet NaN with the sign of s. */
uint16_t td_f16_round(double s, double e);
/* RN16(a * b): one rounding of the exact product (__hmul). */
uint16_t td_f16_mul(uint16_t a, uint16_t b);
/* RN16(a * b + c): one rounding of the exact a*b + c (__hfma). inf*0 and inf-inf give NaN. */
uint16_t td_f16_fma(uint16_t a, uint16_t b, uint16_t c);

static inline bool td_f16_is_nan(uint16_t h) { return (h & 0x7FFFu) > TD_F16_INF; }
static inline bool td_f16_is_finite(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }
/* Equal as the seed compares: same bits, or both NaN. */
static inline bool td_f16_same(uint16_t a, uint16_t b)
{
    return a == b || (td_f16_is_nan(a) && td_f16_is_nan(b));
}
/* Positive and normal: 2^-14 <= h <= 65504. */
static inline bool td_f16_is_pos_normal(uint16_t h)
{
    return h >= TD_F16_MIN_NORMAL && h <= TD_F16_MAX_FINITE;
}

/* ---- reconstruction arithmetic -------------------------------------------------------------- */

/* A per-column FP32 global scale (the decode multiplier g_dec) and its decode-time split:
 * G = g * 2^14 in FP32, hi = FP16_rn(G), lo = FP16_rn(G - f32(hi)). */
typedef struct td_recon_global {
    float g;
    float G;
    uint16_t hi, lo;
} td_recon_global;

void td_recon_global_init(const td_codec *c, float g, td_recon_global *out);

/* prepared = FP16_rn(f32(e4m3(code)) * g): the loader's FP16 scale (§2.2). */
uint16_t td_recon_prepared(const td_codec *c, uint8_t code, float g);
/* Raw storage code derived from a prepared scale: E4M3_torch(f32(prepared) / g) (§2.4). */
uint8_t td_recon_raw_code(const td_codec *c, uint16_t prepared, float g);
/* Strict E4M3 -> FP16 decode of the expander: |code| == 0x7F -> 0x7E00 (NaN); |code| < 8 ->
 * FP16_rn(|code| * 2^-9); otherwise (|code| << 7) + 0x2000; sign (code & 0x80) << 8. */
uint16_t td_recon_strict_decode(const td_codec *c, uint8_t code);
/* Strict (prefill) reconstruction: FP16_rn(f32(strict_decode(raw)) * g) (§2.5). */
uint16_t td_recon_strict(const td_codec *c, uint8_t raw, float g);
/* Fast decode bit trick: the FP16 pattern (raw << 7) + 0x2000, computed in 32 bits and
 * truncated to 16 (no sign, zero, subnormal or NaN handling). */
uint16_t td_recon_fast_decode(uint8_t raw);
/* Fast (decode) reconstruction: __hfma(trick(raw), hi, __hmul(trick(raw), lo)) (§2.5). */
uint16_t td_recon_fast(const td_recon_global *g, uint8_t raw);
/* Effective HMMA decode scale: FP16_rn(f32(prepared) * 16384) (§2.3). */
uint16_t td_recon_effective(const td_codec *c, uint16_t prepared);

/* ---- W13 global-slot layouts (SEED_AUDITS.md §2.2, §2.5) ----------------------------------- */

/* A rank's W13 holds i_r gate rows and i_r up rows as n = 2*i_r prepared columns, each half
 * with its own global (slot 0 gate, slot 1 up). Non-interleaved: columns [0, i_r) are gate,
 * [i_r, n) up. Interleaved (fused SwiGLU prefill): 32-column tiles alternate gate, up, gate,
 * ... (requires i_r % 32 == 0). W2 has a single slot. */
typedef enum td_w13_layout {
    TD_W13_NON_INTERLEAVED = 0,
    TD_W13_INTERLEAVED,
    TD_W13_LAYOUT_COUNT
} td_w13_layout;

/* "non_interleaved", "interleaved"; "unknown" when out of range. */
const char *td_w13_layout_name(td_w13_layout l);
/* Where prepare put column `col` (0 <= col < 2*i_r): returns 0 (gate) or 1 (up) and sets
 * *row to the row within that half of the rank slice. */
int td_w13_origin(td_w13_layout l, int64_t col, int64_t i_r, int64_t *row);
/* The global slot the expander reads for column `col` of `n`: interleaved (col >> 5) & 1,
 * non-interleaved col >= n / 2. */
int td_w13_slot(td_w13_layout l, int64_t col, int64_t n);

/* ---- admission verdict and reason classes --------------------------------------------------- */

/* Why an element (and, through its first offending element, a tensor) cannot keep raw
 * storage. Precedence, first match wins: bad global, NaN code, negative code, zero code,
 * subnormal code (classes of the checkpoint code), then overflow, underflow, hi/lo inexact,
 * an otherwise unexplained mismatch; layout mismatch is assigned by the global-slot check. */
typedef enum td_scale_reason {
    TD_SCALE_OK = 0,
    TD_SCALE_BAD_GLOBAL,       /* global not finite, or <= 0 */
    TD_SCALE_NAN_CODE,         /* 0x7F / 0xFF */
    TD_SCALE_NEGATIVE_CODE,    /* sign bit set (0x80 = -0 included) */
    TD_SCALE_ZERO_CODE,        /* 0x00 */
    TD_SCALE_SUBNORMAL_CODE,   /* 0x01..0x07 */
    TD_SCALE_OVERFLOW,         /* prepared, effective or hi not finite */
    TD_SCALE_UNDERFLOW,        /* prepared or hi below the FP16 normal range */
    TD_SCALE_HILO_INEXACT,     /* the hi/lo FMA does not reproduce the effective scale */
    TD_SCALE_MISMATCH,         /* a reconstruction differs for no reason above */
    TD_SCALE_LAYOUT_MISMATCH,  /* the expander reads another global slot than prepare used */
    TD_SCALE_REASON_COUNT
} td_scale_reason;

/* "ok", "bad_global", "nan_code", "negative_code", "zero_code", "subnormal_code", "overflow",
 * "underflow", "hilo_inexact", "mismatch", "layout_mismatch"; "unknown" when out of range. */
const char *td_scale_reason_name(td_scale_reason r);

/* Everything about one block-scale element: checkpoint code `code`, prepared with g_prep,
 * stored raw and expanded with g_raw (the two differ only under a global-slot layout error).
 * An element is admitted when all four checks hold:
 *   strict_ok  strict(raw, g_raw) == prepared            (bits; NaN as NaN)
 *   fast_ok    fast(raw, g_raw)   == effective           (bits; NaN as NaN)
 *   finite_ok  prepared and effective finite
 *   range_ok   effective positive and FP16 normal, g_prep and g_raw finite and > 0 */
typedef struct td_recon_eval {
    uint8_t code, raw;
    uint16_t prepared, strict, effective, fast;
    bool strict_ok, fast_ok, finite_ok, range_ok, admit;
    td_scale_reason reason;    /* TD_SCALE_OK when admitted */
} td_recon_eval;

void td_recon_eval_code(const td_codec *c, uint8_t code, const td_recon_global *g_prep,
                        const td_recon_global *g_raw, td_recon_eval *out);

/* Raw-storage admission of a whole tensor: the n block scales `codes` of one tensor with decode
 * multiplier g_dec (td_nvfp4_g_dec), each judged by td_recon_eval_code with tandem's codec and
 * the same global for prepare and expand. Returns how many fail; when some do, *first is the
 * index of the first and *reason its class (both untouched otherwise). The verdict depends on
 * (code, g_dec) only, so it is tabulated once (256 evaluations) and every byte looked up. */
int64_t td_recon_admit_tensor(const uint8_t *codes, int64_t n, float g_dec, int64_t *first,
                              td_scale_reason *reason);

#ifdef __cplusplus
}
#endif

#endif /* TD_E4M3_RECON_H */
