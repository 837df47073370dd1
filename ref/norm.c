/* norm.c — reference normalizations (numerics in norm.h). */
#include "norm.h"
#include "moe.h"

#include <math.h>

static float sumsq(const float *x, int64_t n)
{
    float ss = 0.0f;
    for (int64_t j = 0; j < n; j++) ss = ss + x[j] * x[j];
    return ss;
}

static float inv_sqrt(float v)
{
    return (float)(1.0 / sqrt((double)v));
}

static float rms_inv(const float *x, int64_t n, float eps)
{
    const float mean = sumsq(x, n) / (float)n;
    return inv_sqrt(mean + eps);
}

void ref_rmsnorm_zc(const float *x, int64_t n, const float *w, float eps, float *y)
{
    const float inv = rms_inv(x, n, eps);
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] * inv) * (1.0f + w[i]);
}

void ref_rmsnorm_gated(const float *x, const float *z, int64_t n, const float *w, float eps, float *y)
{
    const float inv = rms_inv(x, n, eps);
    for (int64_t i = 0; i < n; i++) y[i] = ((x[i] * inv) * w[i]) * ref_silu(z[i]);
}

void ref_rmsnorm_gated_sigmoid(const float *x, const float *z, int64_t n, const float *w, float eps, float *y)
{
    const float inv = rms_inv(x, n, eps);
    for (int64_t i = 0; i < n; i++) y[i] = ((x[i] * inv) * w[i]) * ref_sigmoid(z[i]);
}

void ref_l2norm(const float *x, int64_t n, float eps, float *y)
{
    const float inv = inv_sqrt(sumsq(x, n) + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv;
}

float ref_softplus(float x)
{
    if (x > 20.0f) return x;
    return (float)log1p(exp((double)x));
}
