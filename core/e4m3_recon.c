/* e4m3_recon.c — prepared / strict / fast / effective scale arithmetic (see e4m3_recon.h).
 *
 * Written to compile both as C11 and as C++ (no designated initializers, no implicit void*
 * conversions, no `restrict`), because the GPU cross-check includes it into a CUDA program to
 * compare td_f16_fma() and the fast reconstruction with the hardware __hfma.
 */
#include "e4m3_recon.h"

#include <math.h>
#include <string.h>

/* ---- tandem's codec ------------------------------------------------------------------------ */

static float recon_e2m1_to_f32(uint8_t code) { return td_e2m1_to_f32(code); }
static uint8_t recon_e2m1_encode(float y, td_e2m1_sign rule) { return td_e2m1_encode(y, rule); }

static const td_codec recon_tandem_codec = {
    "tandem",
    td_e4m3_to_f32,
    td_f32_to_e4m3,
    recon_e2m1_to_f32,
    recon_e2m1_encode,
    td_f32_to_e2m1,
    td_f32_to_f16,
    td_f16_to_f32,
    td_f32_to_bf16,
    td_bf16_to_f32,
};

const td_codec *td_codec_tandem(void)
{
    return &recon_tandem_codec;
}

/* ---- exact FP16 arithmetic ----------------------------------------------------------------- */

double td_f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1F;
    int m = h & 0x3FF;
    double v;
    if (e == 0x1F) v = m ? (double)NAN : (double)INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);            /* subnormal: m * 2^-24 */
    else v = ldexp((double)(m + 1024), e - 25);            /* (1024 + m) * 2^(e-15-10) */
    return (h & 0x8000u) ? -v : v;
}

uint16_t td_f16_round(double s, double e)
{
    uint16_t sign = signbit(s) ? 0x8000u : 0u;
    if (isnan(s)) return (uint16_t)(sign | TD_F16_QNAN);
    double a = fabs(s);
    if (isinf(a)) return (uint16_t)(sign | TD_F16_INF);
    if (a == 0.0) return sign;                  /* then e == 0 too: the sum was exact */
    double ea = sign ? -e : e;                  /* remainder, positive = away from zero */
    int ex;
    (void)frexp(a, &ex);                        /* a in [2^(ex-1), 2^ex) */
    int e2 = ex - 1;                            /* floor(log2 a) */
    if (e2 > 16) return (uint16_t)(sign | TD_F16_INF);  /* far beyond 65520 */
    int qexp = (e2 < -14 ? -14 : e2) - 10;      /* exponent of one unit in the last place */
    double q = ldexp(a, -qexp);                 /* exact: a power-of-two scaling */
    double qi = floor(q);
    double frac = q - qi;                       /* exact: q < 2^12 has few integer bits */
    uint32_t n = (uint32_t)qi;
    if (frac > 0.5) n++;
    else if (frac == 0.5) {
        if (ea > 0.0 || (ea == 0.0 && (n & 1u))) n++;  /* tie: the remainder decides, else even */
    }
    if (e2 < -14) return (uint16_t)(sign | n);  /* subnormal; n == 1024 is the smallest normal */
    if (n == 2048u) {                           /* mantissa carry into the exponent */
        n = 1024u;
        e2++;
    }
    int biased = e2 + 15;
    if (biased >= 31) return (uint16_t)(sign | TD_F16_INF);
    return (uint16_t)(sign | ((uint32_t)biased << 10) | (n - 1024u));
}

uint16_t td_f16_mul(uint16_t a, uint16_t b)
{
    return td_f16_round(td_f16_value(a) * td_f16_value(b), 0.0); /* the product is exact */
}

uint16_t td_f16_fma(uint16_t a, uint16_t b, uint16_t c)
{
    double p = td_f16_value(a) * td_f16_value(b); /* exact: <= 22 significant bits */
    double cv = td_f16_value(c);
    double s = p + cv;
    if (!isfinite(p) || !isfinite(cv) || !isfinite(s)) return td_f16_round(s, 0.0);
    /* TwoSum: s + err == p + cv exactly. */
    double bv = s - p;
    double err = (p - (s - bv)) + (cv - bv);
    return td_f16_round(s, err);
}

/* ---- reconstructions ------------------------------------------------------------------------ */

void td_recon_global_init(const td_codec *c, float g, td_recon_global *out)
{
    out->g = g;
    out->G = g * 16384.0f;
    out->hi = c->f32_to_f16(out->G);
    out->lo = c->f32_to_f16(out->G - c->f16_to_f32(out->hi));
}

uint16_t td_recon_prepared(const td_codec *c, uint8_t code, float g)
{
    return c->f32_to_f16(c->e4m3_to_f32(code) * g);
}

uint8_t td_recon_raw_code(const td_codec *c, uint16_t prepared, float g)
{
    return c->f32_to_e4m3(c->f16_to_f32(prepared) / g, TD_E4M3_TORCH);
}

uint16_t td_recon_strict_decode(const td_codec *c, uint8_t code)
{
    uint32_t mag = code & 0x7Fu;
    uint32_t sign = (uint32_t)(code & 0x80u) << 8;
    uint32_t h;
    if (mag == 0x7Fu) h = TD_F16_QNAN;
    else if (mag < 8u) h = c->f32_to_f16((float)mag * 0x1p-9f);
    else h = (mag << 7) + 0x2000u;
    return (uint16_t)(sign | h);
}

uint16_t td_recon_strict(const td_codec *c, uint8_t raw, float g)
{
    return c->f32_to_f16(c->f16_to_f32(td_recon_strict_decode(c, raw)) * g);
}

uint16_t td_recon_fast_decode(uint8_t raw)
{
    return (uint16_t)((((uint32_t)raw << 7) + 0x2000u) & 0xFFFFu);
}

uint16_t td_recon_fast(const td_recon_global *g, uint8_t raw)
{
    uint16_t r = td_recon_fast_decode(raw);
    return td_f16_fma(r, g->hi, td_f16_mul(r, g->lo));
}

uint16_t td_recon_effective(const td_codec *c, uint16_t prepared)
{
    return c->f32_to_f16(c->f16_to_f32(prepared) * 16384.0f);
}

/* ---- W13 layouts ----------------------------------------------------------------------------- */

const char *td_w13_layout_name(td_w13_layout l)
{
    switch (l) {
    case TD_W13_NON_INTERLEAVED: return "non_interleaved";
    case TD_W13_INTERLEAVED: return "interleaved";
    default: return "unknown";
    }
}

int td_w13_origin(td_w13_layout l, int64_t col, int64_t i_r, int64_t *row)
{
    if (l == TD_W13_INTERLEAVED) {
        int64_t tile = col / 32;
        *row = (tile / 2) * 32 + col % 32;
        return (int)(tile & 1);
    }
    if (col < i_r) {
        *row = col;
        return 0;
    }
    *row = col - i_r;
    return 1;
}

int td_w13_slot(td_w13_layout l, int64_t col, int64_t n)
{
    if (l == TD_W13_INTERLEAVED) return (int)((col >> 5) & 1);
    return col >= n / 2 ? 1 : 0;
}

/* ---- verdict -------------------------------------------------------------------------------- */

static const char *const recon_reason_names[TD_SCALE_REASON_COUNT] = {
    "ok", "bad_global", "nan_code", "negative_code", "zero_code", "subnormal_code",
    "overflow", "underflow", "hilo_inexact", "mismatch", "layout_mismatch",
};

const char *td_scale_reason_name(td_scale_reason r)
{
    if ((unsigned)r >= (unsigned)TD_SCALE_REASON_COUNT) return "unknown";
    return recon_reason_names[r];
}

static bool recon_global_ok(float g)
{
    return isfinite(g) && g > 0.0f;
}

void td_recon_eval_code(const td_codec *c, uint8_t code, const td_recon_global *g_prep,
                        const td_recon_global *g_raw, td_recon_eval *out)
{
    memset(out, 0, sizeof *out);
    out->code = code;
    out->prepared = td_recon_prepared(c, code, g_prep->g);
    out->raw = td_recon_raw_code(c, out->prepared, g_raw->g);
    out->strict = td_recon_strict(c, out->raw, g_raw->g);
    out->effective = td_recon_effective(c, out->prepared);
    out->fast = td_recon_fast(g_raw, out->raw);
    out->strict_ok = td_f16_same(out->strict, out->prepared);
    out->fast_ok = td_f16_same(out->fast, out->effective);
    out->finite_ok = td_f16_is_finite(out->prepared) && td_f16_is_finite(out->effective);
    out->range_ok = td_f16_is_pos_normal(out->effective) && recon_global_ok(g_prep->g) &&
                    recon_global_ok(g_raw->g);
    out->admit = out->strict_ok && out->fast_ok && out->finite_ok && out->range_ok;
    if (out->admit) {
        out->reason = TD_SCALE_OK;
        return;
    }
    uint8_t mag = code & 0x7F;
    if (!recon_global_ok(g_prep->g) || !recon_global_ok(g_raw->g)) out->reason = TD_SCALE_BAD_GLOBAL;
    else if (mag == 0x7F) out->reason = TD_SCALE_NAN_CODE;
    else if (code & 0x80) out->reason = TD_SCALE_NEGATIVE_CODE;
    else if (code == 0) out->reason = TD_SCALE_ZERO_CODE;
    else if (code < 8) out->reason = TD_SCALE_SUBNORMAL_CODE;
    else if (!td_f16_is_finite(out->prepared) || !td_f16_is_finite(out->effective) ||
             !td_f16_is_finite(g_raw->hi) || !td_f16_is_finite(out->fast))
        out->reason = TD_SCALE_OVERFLOW;
    else if ((out->prepared & 0x7FFFu) < TD_F16_MIN_NORMAL || (g_raw->hi & 0x7FFFu) < TD_F16_MIN_NORMAL)
        out->reason = TD_SCALE_UNDERFLOW;
    else if (!out->fast_ok) out->reason = TD_SCALE_HILO_INEXACT;
    else out->reason = TD_SCALE_MISMATCH;
}

int64_t td_recon_admit_tensor(const uint8_t *codes, int64_t n, float g_dec, int64_t *first,
                              td_scale_reason *reason)
{
    const td_codec *codec = td_codec_tandem();
    td_recon_global gl;
    td_recon_global_init(codec, g_dec, &gl);
    bool ok[256];
    td_scale_reason why[256];
    for (int code = 0; code < 256; code++) {
        td_recon_eval ev;
        td_recon_eval_code(codec, (uint8_t)code, &gl, &gl, &ev);
        ok[code] = ev.admit;
        why[code] = ev.reason;
    }
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!ok[codes[i]]) {
            if (bad++ == 0) {
                *first = i;
                *reason = why[codes[i]];
            }
        }
    return bad;
}
