/* engine_test.h — helpers for the tests that drive engines through the engine contract
 * (core/engine.h) and the engines built into the binary (audit/engines.h).
 *
 * td_test_engine(dir, variant) loads the engine of a variant text ("ref:threads=2",
 * "cuda:act_dtype=fp16", ...) on the checkpoint `dir`, or fails the test naming the variant
 * and the error. td_test_poisoned(n) returns n floats set to NaN (free() them), so that an
 * output element the code under test never writes is caught.
 */
#ifndef TD_TEST_ENGINE_TEST_H
#define TD_TEST_ENGINE_TEST_H

#include "test_common.h"
#include "audit/engines.h"

#include <math.h>

static inline td_engine *td_test_engine(const char *dir, const char *variant)
{
    td_variant v;
    td_err err;
    if (td_variant_parse(variant, &v, &err)) fail_msg("%s", err.msg);
    td_engine *e = NULL;
    if (td_engine_load(dir, &v, &e, &err)) fail_msg("load %s: %s", variant, err.msg);
    return e;
}

static inline float *td_test_poisoned(int64_t n)
{
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

#endif /* TD_TEST_ENGINE_TEST_H */
