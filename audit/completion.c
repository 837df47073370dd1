/* completion.c — greedy generation and completion hashes (contract in completion.h). */
#include "completion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void td_completion_hash(const int32_t *ids, int64_t n, char hex[TD_SHA256_HEX_LEN])
{
    td_sha256_ctx c;
    td_sha256_init(&c);
    for (int64_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)ids[i];
        const uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
        td_sha256_update(&c, b, 4);
    }
    uint8_t d[TD_SHA256_DIGEST_LEN];
    td_sha256_final(&c, d);
    td_sha256_hex(d, hex);
}

int32_t td_greedy_pick(const float *logits, int64_t v, double *margin)
{
    int64_t best = -1, second = -1;
    for (int64_t i = 0; i < v; i++) {
        if (isnan(logits[i])) continue;
        if (best < 0 || logits[i] > logits[best]) {
            second = best;
            best = i;
        } else if (second < 0 || logits[i] > logits[second]) {
            second = i;
        }
    }
    if (best < 0) {
        *margin = NAN;
        return 0;
    }
    *margin = second < 0 ? (double)INFINITY : (double)logits[best] - (double)logits[second];
    return (int32_t)best;
}

void td_completion_free(td_completion *c)
{
    if (!c) return;
    free(c->tokens);
    free(c->margins);
    c->tokens = NULL;
    c->margins = NULL;
    c->n = 0;
}

static void step_done(td_completion *c, const float *logits, int64_t vocab, const td_gen_params *p, bool *done)
{
    double m;
    const int32_t id = td_greedy_pick(logits, vocab, &m);
    c->tokens[c->n] = id;
    c->margins[c->n] = m;
    c->n++;
    if (c->n >= p->max_new || (!p->ignore_eos && p->eos >= 0 && id == p->eos)) *done = true;
}

td_status td_generate(td_engine *e, int64_t vocab, const td_prompt *prompts, int64_t n_prompts,
                      const td_gen_params *p, td_completion *out, td_err *err)
{
    const int64_t B = p->batch;
    for (int64_t i = 0; i < n_prompts; i++) out[i] = (td_completion){0};
    float *logits = malloc((size_t)(B * vocab) * sizeof *logits);
    td_decode_item *items = malloc((size_t)B * sizeof *items);
    int64_t *which = malloc((size_t)B * sizeof *which);
    bool *done = malloc((size_t)B * sizeof *done);
    td_status st = TD_OK;
    if (!logits || !items || !which || !done) {
        st = td_err_set(err, TD_ERR_NOMEM, "generate: out of memory");
        goto end;
    }
    for (int64_t i = 0; i < n_prompts && !st; i++) {
        const size_t cap = (size_t)(p->max_new > 0 ? p->max_new : 1);
        out[i].tokens = malloc(cap * sizeof *out[i].tokens);
        out[i].margins = malloc(cap * sizeof *out[i].margins);
        if (!out[i].tokens || !out[i].margins) st = td_err_set(err, TD_ERR_NOMEM, "generate: out of memory");
    }
    for (int64_t g0 = 0; g0 < n_prompts && !st; g0 += B) {
        const int64_t nb = n_prompts - g0 < B ? n_prompts - g0 : B;
        for (int64_t s = 0; s < nb && !st; s++) {
            done[s] = p->max_new == 0;
            st = td_engine_prefill(e, s, prompts[g0 + s].tokens, prompts[g0 + s].n, logits, err);
            if (st) {
                td_err_prefix(err, "request %lld: ", (long long)(g0 + s));
                break;
            }
            if (!done[s]) step_done(&out[g0 + s], logits, vocab, p, &done[s]);
        }
        while (!st) {
            int64_t n = 0;
            for (int64_t s = 0; s < nb; s++)
                if (!done[s]) {
                    const td_completion *c = &out[g0 + s];
                    items[n] = (td_decode_item){s, c->tokens[c->n - 1]};
                    which[n++] = s;
                }
            if (!n) break;
            st = td_engine_decode(e, items, n, logits, err);
            if (st) break;
            for (int64_t j = 0; j < n; j++) step_done(&out[g0 + which[j]], logits + j * vocab, vocab, p, &done[which[j]]);
        }
    }
    for (int64_t i = 0; i < n_prompts && !st; i++) td_completion_hash(out[i].tokens, out[i].n, out[i].hash);
end:
    if (st)
        for (int64_t i = 0; i < n_prompts; i++) td_completion_free(&out[i]);
    free(logits);
    free(items);
    free(which);
    free(done);
    return st;
}

td_divergence td_completion_compare(const td_completion *a, const td_completion *b)
{
    td_divergence d = {-1, NAN, NAN};
    const int64_t n = a->n < b->n ? a->n : b->n;
    int64_t i = 0;
    while (i < n && a->tokens[i] == b->tokens[i]) i++;
    if (i == n && a->n == b->n) return d;
    d.pos = i;
    if (i < a->n) d.margin_a = a->margins[i];
    if (i < b->n) d.margin_b = b->margins[i];
    return d;
}
