/* metrics.c — comparison metrics and verdicts (see metrics.h for the definitions). */
#include "metrics.h"
#include "formats.h"

#include <math.h>
#include <string.h>

const char *td_expect_name(td_expect e)
{
    switch (e) {
    case TD_EXPECT_EXACT: return "exact";
    case TD_EXPECT_BOUNDED: return "bounded";
    default: return NULL;
    }
}

double td_metrics_bound(td_dtype dtype)
{
    switch (dtype) {
    case TD_F16: return 2e-3;
    case TD_BF16: return 1e-2;
    default: return 1e-5;
    }
}

/* Signed-magnitude bits -> a monotonic integer (+0 and -0 both map to 0). */
static int64_t ordered(uint32_t bits, uint32_t sign_bit)
{
    int64_t mag = (int64_t)(bits & (sign_bit - 1u));
    return (bits & sign_bit) ? -mag : mag;
}

int64_t td_ulp_distance(float a, float b, td_dtype dtype)
{
    if (isnan(a) || isnan(b)) return -1;
    int64_t oa, ob;
    switch (dtype) {
    case TD_F16:
        oa = ordered(td_f32_to_f16(a), 0x8000u);
        ob = ordered(td_f32_to_f16(b), 0x8000u);
        break;
    case TD_BF16:
        oa = ordered(td_f32_to_bf16(a), 0x8000u);
        ob = ordered(td_f32_to_bf16(b), 0x8000u);
        break;
    default:
        oa = ordered(td_f32_bits(a), 0x80000000u);
        ob = ordered(td_f32_bits(b), 0x80000000u);
        break;
    }
    return oa > ob ? oa - ob : ob - oa;
}

static void init(td_metrics *m, td_dtype dtype, int64_t n)
{
    memset(m, 0, sizeof *m);
    m->dtype = dtype;
    m->numel = n;
    m->first_diff = -1;
    m->first_a = m->first_b = (double)NAN;
}

/* The double-precision summaries shared by both element types. */
typedef struct sums {
    double d2, a2, b2, ab, max_d;
    bool d_inf;
} sums;

static void finish(td_metrics *m, const sums *s)
{
    m->exact = m->mismatches == 0;
    m->finite_a = m->nan_a == 0 && m->inf_a == 0;
    m->finite_b = m->nan_b == 0 && m->inf_b == 0;
    m->finite = m->finite_a && m->finite_b;
    m->max_abs = s->d_inf ? HUGE_VAL : s->max_d;
    if (s->d_inf) {
        m->rel_l2 = HUGE_VAL;
        m->nmse = HUGE_VAL;
    } else {
        double nb = sqrt(s->b2);
        m->rel_l2 = sqrt(s->d2) / (nb > 1e-12 ? nb : 1e-12);
        m->nmse = s->d2 / (s->b2 > 1e-24 ? s->b2 : 1e-24);
    }
    if (!m->finite) m->cosine = (double)NAN;
    else if (s->a2 == 0.0 && s->b2 == 0.0) m->cosine = 1.0;
    else if (s->a2 == 0.0 || s->b2 == 0.0) m->cosine = 0.0;
    else m->cosine = s->ab / (sqrt(s->a2) * sqrt(s->b2));
}

void td_metrics_f32(const float *a, const float *b, int64_t n, td_dtype dtype, td_metrics *m)
{
    TD_ASSERT(dtype == TD_F32 || dtype == TD_F16 || dtype == TD_BF16);
    TD_ASSERT(n >= 0 && (n == 0 || (a && b)));
    init(m, dtype, n);
    sums s;
    memset(&s, 0, sizeof s);
    bool ulp_unknown = false;
    for (int64_t i = 0; i < n; i++) {
        const float x = a[i], y = b[i];
        const bool xf = isfinite(x), yf = isfinite(y);
        if (isnan(x)) m->nan_a++;
        else if (!xf) m->inf_a++;
        if (isnan(y)) m->nan_b++;
        else if (!yf) m->inf_b++;
        if (xf) s.a2 += (double)x * (double)x;
        if (yf) s.b2 += (double)y * (double)y;
        if (xf && yf) s.ab += (double)x * (double)y;
        const bool equal = td_f32_bits(x) == td_f32_bits(y) && !isnan(x);
        if (equal) continue;
        if (m->mismatches++ == 0) {
            m->first_diff = i;
            m->first_a = (double)x;
            m->first_b = (double)y;
        }
        if (xf && yf) {
            double d = fabs((double)x - (double)y);
            s.d2 += d * d;
            if (d > s.max_d) s.max_d = d;
        } else {
            s.d_inf = true;
        }
        int64_t u = td_ulp_distance(x, y, dtype);
        if (u < 0) ulp_unknown = true;
        else if (u > m->max_ulp) m->max_ulp = u;
    }
    if (ulp_unknown) m->max_ulp = -1;
    finish(m, &s);
}

void td_metrics_i32(const int32_t *a, const int32_t *b, int64_t n, td_metrics *m)
{
    TD_ASSERT(n >= 0 && (n == 0 || (a && b)));
    init(m, TD_I32, n);
    sums s;
    memset(&s, 0, sizeof s);
    for (int64_t i = 0; i < n; i++) {
        const double x = (double)a[i], y = (double)b[i];
        s.a2 += x * x;
        s.b2 += y * y;
        s.ab += x * y;
        if (a[i] == b[i]) continue;
        if (m->mismatches++ == 0) {
            m->first_diff = i;
            m->first_a = x;
            m->first_b = y;
        }
        const double d = fabs(x - y);
        s.d2 += d * d;
        if (d > s.max_d) s.max_d = d;
        if ((int64_t)d > m->max_ulp) m->max_ulp = (int64_t)d;
    }
    finish(m, &s);
}

bool td_metrics_pass(const td_metrics *m, td_expect e, double bound)
{
    if (!m->finite) return false;
    if (m->exact) return true;
    if (e == TD_EXPECT_EXACT) return false;
    return m->rel_l2 <= bound;
}
