/* test_ref_linear.c — reference linear layers (ref/linear).
 *
 * What is asserted:
 * - hand-computed cases: one NVFP4 block with global 1 and scale 1.0 against x = 1..16 gives
 *   287.5 exactly; with the nibble_order fault 301.5; the worked vector of NVFP4_SPEC §8;
 * - NVFP4 row decoding against this file's own E2M1/E4M3/FP16 formulas for all 256 scale
 *   codes x all 16 element codes, both conventions, scale=exact and scale=fp16, globals
 *   covering 1, tiny, huge, negative and zero, and the two linear faults (nibble_order,
 *   reciprocal_global); dense BF16/F16/F32 rows bit for bit;
 * - ref_linear_rows() bit for bit against a naive loop written here in the documented order
 *   (acc = +0, ascending k, fl32(acc + fl32(w*x)); FP64: double loop rounded once), for every
 *   tiling path (rows 1..9, inputs 1..9, several widths), all weight kinds, both accumulations,
 *   with outputs poisoned (NaN) and guard elements after each output row;
 * - accuracy against an exact double-precision dot of the same weights on seeded inputs at
 *   scales 1e-3, 1 and 1e3: |y - exact| <= gamma_K * sum |w x| (the FP32 summation bound);
 * - edge inputs (signed zeros, subnormals, NaN, infinities, FLT_MAX products that overflow)
 *   give exactly what the naive loop gives, NaN positions included;
 * - row and column slices (TP shards) address the right elements, and NVFP4 column slices
 *   off the 16-element grid are refused with TD_ERR_RANGE.
 */
#include "test_common.h"
#include "moe_fixture.h"
#include "ref/linear.h"

#include <float.h>

/* ---- independent rounding and decoding -------------------------------------------------------- */

typedef struct t_nv {
    const uint8_t *packed, *scales;
    float global;
    td_nvfp4_conv conv;
    int64_t cols;
} t_nv;

/* Element (r, c) decoded the documented way, computed with this file's formulas. */
static float t_decode(const t_nv *w, int64_t r, int64_t c, td_scale_mode mode, td_fault fault)
{
    const uint8_t byte = w->packed[r * (w->cols / 2) + c / 2];
    bool high = (c & 1) != 0;
    if (fault == TD_FAULT_NIBBLE_ORDER) high = !high;
    const unsigned code = high ? byte >> 4 : byte & 15u;
    const double s = mf_e4m3(w->scales[r * (w->cols / 16) + c / 16]);
    bool mul = w->conv == TD_NVFP4_MODELOPT;
    if (fault == TD_FAULT_RECIPROCAL_GLOBAL) mul = !mul;
    float eff = mul ? (float)(s * (double)w->global) : (float)(s / (double)w->global);
    if (mode == TD_SCALE_FP16) eff = (float)mf_round_f16((double)eff);
    return (float)(mf_e2m1(code) * (double)eff);
}

static bool same_bits(float a, float b)
{
    return (isnan(a) && isnan(b)) || td_f32_bits(a) == td_f32_bits(b);
}

static float naive_f32(const float *w, const float *x, int64_t n)
{
    float acc = 0.0f;
    for (int64_t k = 0; k < n; k++) acc = acc + w[k] * x[k];
    return acc;
}

static float naive_f64(const float *w, const float *x, int64_t n)
{
    double acc = 0.0;
    for (int64_t k = 0; k < n; k++) acc = acc + (double)w[k] * (double)x[k];
    return (float)acc;
}

/* ---- hand-computed cases ---------------------------------------------------------------------- */

/* Codes 0,0,8,1,2,A,3,4,5,D,5,6,6,E,7,7 (NVFP4_SPEC §8): values 0,0,-0,.5,1,-1,1.5,2,3,-3,3,4,4,-4,6,6. */
static const uint8_t spec_bytes[8] = {0x00, 0x18, 0xA2, 0x43, 0xD5, 0x65, 0xE6, 0x77};

static void linear_hand_block_exact(void **state)
{
    (void)state;
    const uint8_t scale = 0x38; /* E4M3 1.0 */
    ref_linear l;
    ref_linear_nvfp4(&l, TD_NVFP4_MODELOPT, 1, 16, spec_bytes, &scale, 1.0f);
    float x[16], y = NAN, scratch[REF_LINEAR_SCRATCH(16)];
    for (int k = 0; k < 16; k++) x[k] = (float)(k + 1);
    const float *xp[1] = {x};
    float *yp[1] = {&y};
    ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    ref_linear_rows(&l, &nx, 0, 1, xp, yp, 1, scratch);
    assert_true(y == 287.5f);
    nx.accum = TD_ACCUM_FP64;
    ref_linear_rows(&l, &nx, 0, 1, xp, yp, 1, scratch);
    assert_true(y == 287.5f);
    /* swapped nibbles: byte j adds lo - hi, so + sum(even-index values) - sum(odd-index values) = 18.5 - 4.5 */
    nx.fault = TD_FAULT_NIBBLE_ORDER;
    ref_linear_rows(&l, &nx, 0, 1, xp, yp, 1, scratch);
    assert_true(y == 301.5f);
    /* the decoded row itself */
    float row[16];
    nx.fault = TD_FAULT_NONE;
    ref_linear_decode_row(&l, &nx, 0, row);
    static const float want[16] = {0, 0, -0.0f, 0.5f, 1, -1, 1.5f, 2, 3, -3, 3, 4, 4, -4, 6, 6};
    for (int k = 0; k < 16; k++) assert_true(same_bits(row[k], want[k]));
    assert_true(signbit(row[2]));
}

static void linear_hand_spec_vector(void **state)
{
    (void)state;
    /* NVFP4_SPEC §8: scale 0x6D = 104, g = 0x3A924925, divisor fl32(104 g) = 0.1160714328289032 */
    const uint8_t scale = 0x6D;
    const float g = td_f32_from_bits(0x3A924925u);
    ref_linear l;
    ref_linear_nvfp4(&l, TD_NVFP4_MODELOPT, 1, 16, spec_bytes, &scale, g);
    ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    const float eff = ref_nvfp4_eff_scale(scale, g, TD_NVFP4_MODELOPT, &nx);
    assert_true(eff == 0.1160714328289032f);
    float row[16];
    ref_linear_decode_row(&l, &nx, 0, row);
    assert_true(row[15] == 6.0f * eff);
    assert_true(row[9] == -3.0f * eff);
    /* fp16 storage: fp16_rn(0.11607143...) = 0.11608886... (0x2F6E) */
    nx.scale = TD_SCALE_FP16;
    assert_true(ref_nvfp4_eff_scale(scale, g, TD_NVFP4_MODELOPT, &nx) == td_f16_to_f32(0x2F6E));
    /* reciprocal global fault: 104 / g */
    nx.scale = TD_SCALE_EXACT;
    nx.fault = TD_FAULT_RECIPROCAL_GLOBAL;
    assert_true(ref_nvfp4_eff_scale(scale, g, TD_NVFP4_MODELOPT, &nx) == 104.0f / g);
}

/* ---- decoding against the independent formulas ------------------------------------------------- */

static void linear_decode_all_codes(void **state)
{
    (void)state;
    /* one row of 256 blocks: block b has scale code b and element codes 0..15 */
    enum { COLS = 256 * 16 };
    uint8_t *packed = malloc(COLS / 2), scales[256];
    float *row = malloc(COLS * sizeof(float));
    assert_true(packed && row);
    for (int b = 0; b < 256; b++) {
        scales[b] = (uint8_t)b;
        for (int j = 0; j < 8; j++) packed[b * 8 + j] = (uint8_t)((2 * j) | (2 * j + 1) << 4);
    }
    static const float globals[] = {1.0f, 0x1p-10f, 0.0011160714784637094f, 3.0e-5f, 0x1p-126f, 1e30f, -1.0f, 0.0f, 7.0f};
    static const td_fault faults[] = {TD_FAULT_NONE, TD_FAULT_NIBBLE_ORDER, TD_FAULT_RECIPROCAL_GLOBAL};
    for (int conv = 0; conv < 2; conv++)
        for (size_t gi = 0; gi < sizeof globals / sizeof globals[0]; gi++)
            for (int mode = 0; mode < 2; mode++)
                for (size_t fi = 0; fi < 3; fi++) {
                    ref_linear l;
                    ref_linear_nvfp4(&l, (td_nvfp4_conv)conv, 1, COLS, packed, scales, globals[gi]);
                    ref_numerics nx = {TD_ACCUM_FP32, (td_scale_mode)mode, faults[fi]};
                    for (int k = 0; k < COLS; k++) row[k] = -12345.0f;
                    ref_linear_decode_row(&l, &nx, 0, row);
                    t_nv t = {packed, scales, globals[gi], (td_nvfp4_conv)conv, COLS};
                    for (int k = 0; k < COLS; k++) {
                        float want = t_decode(&t, 0, k, (td_scale_mode)mode, faults[fi]);
                        if (!same_bits(row[k], want))
                            fail_msg("conv %d global %g mode %d fault %d element %d (scale 0x%02X code %d): %a vs %a",
                                     conv, (double)globals[gi], mode, (int)faults[fi], k, k / 16, k % 16,
                                     (double)row[k], (double)want);
                    }
                }
    free(packed);
    free(row);
}

static void linear_decode_dense(void **state)
{
    (void)state;
    enum { N = 4096 };
    uint16_t h[N];
    float f[N], row[N];
    td_rng rng;
    td_rng_seed(&rng, 3);
    for (int i = 0; i < N; i++) {
        h[i] = (uint16_t)td_rng_u32(&rng);
        f[i] = td_f32_from_bits(td_rng_u32(&rng));
    }
    h[0] = 0x8000; /* -0 */
    h[1] = 0x0001; /* smallest subnormal */
    ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    ref_linear l;
    ref_linear_dense(&l, TD_BF16, 1, N, h);
    ref_linear_decode_row(&l, &nx, 0, row);
    for (int i = 0; i < N; i++) assert_true(same_bits(row[i], (float)mf_bf16(h[i])));
    ref_linear_dense(&l, TD_F16, 1, N, h);
    ref_linear_decode_row(&l, &nx, 0, row);
    for (int i = 0; i < N; i++) {
        const int e = (h[i] >> 10) & 31, m = h[i] & 1023;
        double v = e == 31 ? (m ? (double)NAN : HUGE_VAL) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        if (h[i] & 0x8000) v = -v;
        assert_true(same_bits(row[i], (float)v));
    }
    ref_linear_dense(&l, TD_F32, 1, N, f);
    ref_linear_decode_row(&l, &nx, 0, row);
    assert_memory_equal(row, f, sizeof f);
}

/* ---- ref_linear_rows against the naive loops ----------------------------------------------------- */

typedef struct wbuf {
    uint8_t *packed, *scales;
    uint16_t *h;
    float *f;
} wbuf;

/* A weight of kind 0 NVFP4-ModelOpt, 1 NVFP4-CT, 2 BF16, 3 F16, 4 F32 with seeded content. */
static void make_weight(td_rng *rng, int kind, int64_t rows, int64_t cols, wbuf *b, ref_linear *l)
{
    memset(b, 0, sizeof *b);
    if (kind <= 1) {
        b->packed = malloc((size_t)(rows * cols / 2));
        b->scales = malloc((size_t)(rows * cols / 16));
        assert_true(b->packed && b->scales);
        for (int64_t i = 0; i < rows * cols / 2; i++) b->packed[i] = (uint8_t)td_rng_u32(rng);
        for (int64_t i = 0; i < rows * cols / 16; i++) b->scales[i] = (uint8_t)(8 + td_rng_below(rng, 118));
        ref_linear_nvfp4(l, kind ? TD_NVFP4_CT : TD_NVFP4_MODELOPT, rows, cols, b->packed, b->scales,
                         kind ? 2688.0f / 3.0f : 3.0f / 2688.0f);
    } else if (kind <= 3) {
        b->h = malloc((size_t)(rows * cols) * 2);
        assert_non_null(b->h);
        for (int64_t i = 0; i < rows * cols; i++) {
            float v = td_rng_normal_f32(rng);
            b->h[i] = kind == 2 ? td_f32_to_bf16(v) : td_f32_to_f16(v);
        }
        ref_linear_dense(l, kind == 2 ? TD_BF16 : TD_F16, rows, cols, b->h);
    } else {
        b->f = malloc((size_t)(rows * cols) * sizeof(float));
        assert_non_null(b->f);
        for (int64_t i = 0; i < rows * cols; i++) b->f[i] = td_rng_normal_f32(rng);
        ref_linear_dense(l, TD_F32, rows, cols, b->f);
    }
}

static void free_weight(wbuf *b)
{
    free(b->packed);
    free(b->scales);
    free(b->h);
    free(b->f);
}

#define GUARD 3
static const float guard_value = -777.25f;

/* Run ref_linear_rows over rows [r0, r1) for n inputs and compare with the naive loop over
 * rows decoded one at a time by ref_linear_decode_row (checked separately above). */
static void check_rows(const ref_linear *l, const ref_numerics *nx, int64_t r0, int64_t r1, const float *xs, int64_t n)
{
    const int64_t cols = l->cols, nr = r1 - r0;
    float *ys = malloc((size_t)(n * (nr + GUARD)) * sizeof(float)); /* [n, nr + GUARD] */
    const float **xp = malloc((size_t)n * sizeof *xp);
    float **yp = malloc((size_t)n * sizeof *yp);
    float *scratch = malloc(REF_LINEAR_SCRATCH(cols) * sizeof(float));
    float *w = malloc((size_t)cols * sizeof(float));
    assert_true(ys && xp && yp && scratch && w);
    for (int64_t i = 0; i < n; i++) {
        xp[i] = xs + i * cols;
        yp[i] = ys + i * (nr + GUARD);
        for (int64_t j = 0; j < nr; j++) yp[i][j] = NAN; /* poison */
        for (int64_t j = nr; j < nr + GUARD; j++) yp[i][j] = guard_value;
    }
    ref_linear_rows(l, nx, r0, r1, xp, yp, n, scratch);
    for (int64_t r = r0; r < r1; r++) {
        ref_linear_decode_row(l, nx, r, w);
        for (int64_t i = 0; i < n; i++) {
            float want = nx->accum == TD_ACCUM_FP64 ? naive_f64(w, xp[i], cols) : naive_f32(w, xp[i], cols);
            float got = yp[i][r - r0];
            if (!same_bits(got, want))
                fail_msg("rows [%lld,%lld) n %lld cols %lld: row %lld input %lld: %a, naive %a", (long long)r0,
                         (long long)r1, (long long)n, (long long)cols, (long long)r, (long long)i, (double)got,
                         (double)want);
        }
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = nr; j < nr + GUARD; j++) assert_true(yp[i][j] == guard_value);
    free(ys);
    free(xp);
    free(yp);
    free(scratch);
    free(w);
}

static void linear_rows_match_naive_every_tiling(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 11);
    static const int64_t widths[] = {16, 48, 160};
    for (int kind = 0; kind < 5; kind++)
        for (size_t wi = 0; wi < 3; wi++) {
            const int64_t cols = widths[wi], rows = 11;
            wbuf b;
            ref_linear l;
            make_weight(&rng, kind, rows, cols, &b, &l);
            float *xs = malloc((size_t)(9 * cols) * sizeof(float));
            assert_non_null(xs);
            for (int64_t i = 0; i < 9 * cols; i++) xs[i] = td_rng_normal_f32(&rng);
            for (int acc = 0; acc < 2; acc++)
                for (int mode = 0; mode < 2; mode++) {
                    ref_numerics nx = {(td_accum)acc, (td_scale_mode)mode, TD_FAULT_NONE};
                    for (int64_t nr = 1; nr <= 9; nr++)
                        for (int64_t n = 1; n <= 9; n++) check_rows(&l, &nx, 1, 1 + nr, xs, n);
                }
            free(xs);
            free_weight(&b);
        }
}

static void linear_rows_edge_inputs(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 12);
    const int64_t cols = 64, rows = 6;
    static const float edge[] = {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, FLT_MAX, -FLT_MAX, INFINITY,
                                 -INFINITY, NAN, 1.0f, -1.0f, 3.0e38f};
    for (int kind = 0; kind < 5; kind++) {
        wbuf b;
        ref_linear l;
        make_weight(&rng, kind, rows, cols, &b, &l);
        float *xs = malloc((size_t)(6 * cols) * sizeof(float));
        assert_non_null(xs);
        for (int64_t i = 0; i < 6 * cols; i++)
            xs[i] = td_rng_below(&rng, 4) == 0 ? edge[td_rng_below(&rng, sizeof edge / sizeof edge[0])]
                                               : td_rng_normal_f32(&rng);
        /* input 0: only signed zeros and subnormals (no overflow, exact zeros kept) */
        for (int64_t k = 0; k < cols; k++) xs[k] = (k & 1) ? -0.0f : 0x1p-149f * (float)(k % 5);
        for (int acc = 0; acc < 2; acc++) {
            ref_numerics nx = {(td_accum)acc, TD_SCALE_EXACT, TD_FAULT_NONE};
            for (int64_t n = 1; n <= 6; n++) check_rows(&l, &nx, 0, rows, xs, n);
        }
        free(xs);
        free_weight(&b);
    }
    /* an all -0 product sum: +0 start, so -0 + ... gives +0 under RNE */
    const uint8_t scale = 0x38, packed[8] = {0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
    ref_linear l;
    ref_linear_nvfp4(&l, TD_NVFP4_MODELOPT, 1, 16, packed, &scale, 1.0f);
    float x[16], y = NAN, scratch[REF_LINEAR_SCRATCH(16)];
    for (int k = 0; k < 16; k++) x[k] = 1.0f;
    const float *xp[1] = {x};
    float *yp[1] = {&y};
    ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    ref_linear_rows(&l, &nx, 0, 1, xp, yp, 1, scratch);
    assert_true(y == 0.0f && !signbit(y));
}

static void linear_rows_accuracy_vs_double(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    td_rng rng;
    td_rng_seed(&rng, 13);
    static const double scales[] = {1e-3, 1.0, 1e3};
    for (int fmt = 0; fmt < 3; fmt++) {
        mf_linear w;
        const int64_t rows = 24, cols = 2560;
        mf_quant(&rng, (mf_fmt)fmt, &w, NULL, rows, cols, 0.05f);
        ref_linear l;
        mf_view(&w, &l);
        for (size_t si = 0; si < 3; si++) {
            const int64_t n = 5;
            float *xs = malloc((size_t)(n * cols) * sizeof(float)), *ys = malloc((size_t)(n * rows) * sizeof(float));
            float *scratch = malloc(REF_LINEAR_SCRATCH(cols) * sizeof(float));
            const float *xp[5];
            float *yp[5];
            assert_true(xs && ys && scratch);
            for (int64_t i = 0; i < n * cols; i++) xs[i] = (float)(scales[si] * td_rng_normal(&rng));
            for (int64_t i = 0; i < n; i++) {
                xp[i] = xs + i * cols;
                yp[i] = ys + i * rows;
            }
            for (int acc = 0; acc < 2; acc++) {
                ref_numerics nx = {(td_accum)acc, TD_SCALE_EXACT, TD_FAULT_NONE};
                ref_linear_rows(&l, &nx, 0, rows, xp, yp, n, scratch);
                const double gamma = acc ? 0x1p-24 : (double)(cols + 2) * 0x1p-24;
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t i = 0; i < n; i++) {
                        double exact = 0.0, mag = 0.0; /* products are exact in double; cols*|p| sums well */
                        for (int64_t k = 0; k < cols; k++) {
                            double p = mf_weight(&w, r, k) * (double)xp[i][k];
                            exact += p;
                            mag += fabs(p);
                        }
                        double err = fabs((double)yp[i][r] - exact);
                        if (err > gamma * mag + 1e-300)
                            fail_msg("fmt %d scale %g accum %d row %lld: |%g - %g| = %g > %g", fmt, scales[si], acc,
                                     (long long)r, (double)yp[i][r], exact, err, gamma * mag);
                    }
            }
            free(xs);
            free(ys);
            free(scratch);
        }
        mf_linear_free(&w);
    }
}

/* ---- slices ------------------------------------------------------------------------------------ */

static void linear_slices(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 14);
    for (int kind = 0; kind < 5; kind++) {
        const int64_t rows = 16, cols = 64;
        wbuf b;
        ref_linear l, rs, cs;
        make_weight(&rng, kind, rows, cols, &b, &l);
        td_err err;
        assert_int_equal(ref_linear_rows_slice(&l, 4, 8, &rs, &err), TD_OK);
        assert_int_equal(ref_linear_cols_slice(&l, 16, 32, &cs, &err), TD_OK);
        assert_int_equal(rs.rows, 8);
        assert_int_equal(cs.cols, 32);
        ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
        float full[64], part[64];
        for (int64_t r = 0; r < 8; r++) {
            ref_linear_decode_row(&l, &nx, r + 4, full);
            ref_linear_decode_row(&rs, &nx, r, part);
            assert_memory_equal(full, part, sizeof full);
        }
        for (int64_t r = 0; r < rows; r++) {
            ref_linear_decode_row(&l, &nx, r, full);
            ref_linear_decode_row(&cs, &nx, r, part);
            assert_memory_equal(full + 16, part, 32 * sizeof(float));
        }
        /* out of range, and off the NVFP4 block grid */
        assert_int_equal(ref_linear_rows_slice(&l, 10, 8, &rs, &err), TD_ERR_RANGE);
        assert_int_equal(ref_linear_cols_slice(&l, 48, 32, &cs, &err), TD_ERR_RANGE);
        td_status st = ref_linear_cols_slice(&l, 8, 16, &cs, &err);
        if (kind <= 1) {
            assert_int_equal(st, TD_ERR_RANGE);
            assert_non_null(strstr(err.msg, "16-element blocks"));
        } else {
            assert_int_equal(st, TD_OK);
            ref_linear_decode_row(&l, &nx, 3, full);
            ref_linear_decode_row(&cs, &nx, 3, part);
            assert_memory_equal(full + 8, part, 16 * sizeof(float));
        }
        free_weight(&b);
    }
}

static void linear_dot(void **state)
{
    (void)state;
    const float w[4] = {1.0f, 0x1p-24f, 0x1p-24f, -1.0f}, x[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    /* ascending FP32: 1 + 2^-24 rounds to 1 (tie to even), twice, then -1 -> 0 */
    assert_true(ref_dot(w, x, 4, TD_ACCUM_FP32) == 0.0f);
    /* FP64: exact 2^-23 */
    assert_true(ref_dot(w, x, 4, TD_ACCUM_FP64) == 0x1p-23f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(linear_hand_block_exact),
        cmocka_unit_test(linear_hand_spec_vector),
        cmocka_unit_test(linear_decode_all_codes),
        cmocka_unit_test(linear_decode_dense),
        cmocka_unit_test(linear_rows_match_naive_every_tiling),
        cmocka_unit_test(linear_rows_edge_inputs),
        cmocka_unit_test(linear_rows_accuracy_vs_double),
        cmocka_unit_test(linear_slices),
        cmocka_unit_test(linear_dot),
    };
    return cmocka_run_group_tests_name("ref_linear", tests, NULL, NULL);
}
