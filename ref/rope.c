/* rope.c — partial half-split RoPE (numerics in rope.h). */
#include "rope.h"

#include <math.h>

void ref_rope_table(int64_t rot, double theta, int64_t pos, float *cos_out, float *sin_out)
{
    const int64_t h = rot / 2;
    for (int64_t i = 0; i < h; i++) {
        const float e = (float)(2 * i) / (float)rot;
        const float pw = (float)pow(theta, (double)e);
        const float inv = 1.0f / pw;
        const float a = (float)pos * inv;
        cos_out[i] = (float)cos((double)a);
        sin_out[i] = (float)sin((double)a);
    }
}

void ref_rope_apply(float *x, int64_t rot, const float *cos_t, const float *sin_t)
{
    const int64_t h = rot / 2;
    for (int64_t i = 0; i < h; i++) {
        const float a = x[i], b = x[i + h];
        x[i] = a * cos_t[i] - b * sin_t[i];
        x[i + h] = b * cos_t[i] + a * sin_t[i];
    }
}
