/* completion.h — greedy generation and completion hashes (docs/ref-model.md).
 *
 * Completion hash: SHA-256 over the completion's token ids (the generated tokens only, not
 * the prompt), each written as a 4-byte little-endian two's-complement int32, concatenated in
 * order; lower-case hex. Independent of language and machine: [1, 2] hashes the 8 bytes
 * 01 00 00 00 02 00 00 00. The empty completion hashes the empty string.
 *
 * Greedy decoding: the next token is the arg max of the logits; among equal maxima the lowest
 * id wins; a NaN never wins (a row of NaN gives id 0). The margin of a step is top-1 minus
 * top-2 logit (in double; +inf when the vocabulary has one entry). Generation stops after
 * max_new tokens or, unless ignore_eos, right after the eos token (which is kept).
 *
 * Batches: td_generate() runs requests in groups of `batch`: each request of a group is
 * prefilled as sequence id = its slot in the group (0 .. batch-1; ids are reused by the next
 * group, which restarts them), then all unfinished sequences of the group step together in
 * one td_engine_decode call per step, in slot order.
 *
 * Contract: results own their arrays (td_completion_free, NULL-safe). Errors name the request.
 */
#ifndef TD_COMPLETION_H
#define TD_COMPLETION_H

#include "engine.h"
#include "sha256.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct td_completion {
    int32_t *tokens;            /* [n] generated ids */
    double *margins;            /* [n] top-1 minus top-2 logit at each step */
    int64_t n;
    char hash[TD_SHA256_HEX_LEN];
} td_completion;

typedef struct td_prompt {
    const int32_t *tokens;
    int64_t n;                  /* >= 1 */
} td_prompt;

typedef struct td_gen_params {
    int64_t max_new;            /* >= 0 */
    int64_t batch;              /* >= 1 */
    int32_t eos;                /* < 0: none */
    bool ignore_eos;
} td_gen_params;

void td_completion_hash(const int32_t *ids, int64_t n, char hex[TD_SHA256_HEX_LEN]);
/* Arg max (lowest id on ties) and top-1 minus top-2 margin of logits [v]. */
int32_t td_greedy_pick(const float *logits, int64_t v, double *margin);

/* out [n_prompts] completions. */
td_status td_generate(td_engine *e, int64_t vocab, const td_prompt *prompts, int64_t n_prompts,
                      const td_gen_params *p, td_completion *out, td_err *err);
void td_completion_free(td_completion *c);

/* First position where a and b differ (-1 when identical; a shorter completion that is a
 * prefix of the other diverges at its length) and the margins of both there (NAN where a
 * completion has no step at that position). */
typedef struct td_divergence {
    int64_t pos;
    double margin_a, margin_b;
} td_divergence;

td_divergence td_completion_compare(const td_completion *a, const td_completion *b);

#endif /* TD_COMPLETION_H */
