/* proof_common.h — shared pieces of the proofs against the public implementation
 * (tests/test_ref_proof*.c): the logit error measure and the greedy-completion check.
 *
 * td_proof_rel(): max |got - want| / max |want| over a logit row of V entries (in double).
 * td_proof_greedy(): greedy-decodes the prompt ids [T] on engine e (sequence ids are the
 * engine's own; batch 1, no EOS stop) for as many tokens as the expected int32 tensor `want`
 * holds and asserts they are identical.
 */
#ifndef TD_TEST_PROOF_COMMON_H
#define TD_TEST_PROOF_COMMON_H

#include "test_common.h"
#include "audit/completion.h"
#include "engine.h"
#include "tensor.h"

#include <math.h>

static inline double td_proof_rel(const float *got, const float *want, int64_t V)
{
    double mx = 0, md = 0;
    for (int64_t k = 0; k < V; k++) {
        mx = fmax(mx, fabs((double)want[k]));
        md = fmax(md, fabs((double)got[k] - (double)want[k]));
    }
    return md / mx;
}

static inline void td_proof_greedy(td_engine *e, int64_t V, const int32_t *ids, int64_t T, const td_tensor *want_t)
{
    td_err err = {0};
    const int64_t N = want_t->shape[0];
    int32_t *want = malloc((size_t)N * sizeof *want);
    assert_non_null(want);
    memcpy(want, want_t->data, (size_t)N * sizeof *want); /* mapped data may be unaligned */
    const td_prompt pr = {ids, T};
    const td_gen_params gp = {.max_new = N, .batch = 1, .eos = -1};
    td_completion c;
    if (td_generate(e, V, &pr, 1, &gp, &c, &err)) fail_msg("greedy: %s", err.msg);
    assert_int_equal(c.n, N);
    assert_memory_equal(c.tokens, want, (size_t)N * sizeof *want);
    td_completion_free(&c);
    free(want);
}

#endif /* TD_TEST_PROOF_COMMON_H */
