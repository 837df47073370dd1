/* gen_fixture.h — a synthetic checkpoint of a `tandem gen` preset for the model tests.
 *
 * td_test_gen() writes preset `preset` (seed, experts per MoE layer, unquantized or the
 * preset's quantization) into the test scratch directory under `name` and copies that path
 * into dir [cap]; any failure fails the calling test with the library's message.
 */
#ifndef TD_TEST_GEN_FIXTURE_H
#define TD_TEST_GEN_FIXTURE_H

#include "test_common.h"
#include "gen.h"

static inline void td_test_gen(const char *preset, uint64_t seed, bool unquantized, int64_t experts, const char *name,
                               char *dir, size_t cap)
{
    snprintf(dir, cap, "%s", td_test_path(name));
    td_gen_opts o;
    td_gen_opts_init(&o);
    o.preset = preset;
    o.seed = seed;
    o.unquantized = unquantized;
    o.num_experts = experts;
    o.force = true;
    td_gen_plan plan;
    td_err err = {0};
    if (td_gen_plan_build(&o, &plan, &err)) fail_msg("gen %s: %s", preset, err.msg);
    td_gen_result res;
    td_status st = td_gen_write(&plan, &o, dir, &res, &err);
    td_gen_plan_free(&plan);
    if (st) fail_msg("gen %s into %s: %s", preset, dir, err.msg);
}

#endif /* TD_TEST_GEN_FIXTURE_H */
