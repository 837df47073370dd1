/* fuzz_safetensors.c — libFuzzer target for td_st_parse_header (core/safetensors).
 *
 * The input is a whole safetensors file image. When the header is accepted, every tensor's
 * byte range is touched (first and last byte) and every invariant the reader promises is
 * asserted, so an accepted header that points outside the image is a crash, not a pass.
 * Seeds: fuzz/corpus/fuzz_safetensors.
 */
#include "safetensors.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td_st_header h;
    td_err err;
    if (td_st_parse_header(data, size, "fuzz.safetensors", &h, &err) != TD_OK) {
        TD_ASSERT(h.n == 0 && h.tensors == NULL && h.n_meta == 0);
        TD_ASSERT(err.code != TD_OK && strstr(err.msg, "fuzz.safetensors") != NULL);
        return 0;
    }
    TD_ASSERT(h.header_len >= 2 && 8 + h.header_len + h.data_len == size);
    const uint8_t *base = data + 8 + h.header_len;
    volatile uint8_t sink = 0;
    uint64_t covered = 0;
    for (size_t i = 0; i < h.n; i++) {
        const td_st_info *t = &h.tensors[i];
        TD_ASSERT(t->begin <= t->end && t->end <= h.data_len);
        TD_ASSERT(t->ndim >= 0 && t->ndim <= TD_MAX_DIMS);
        TD_ASSERT(t->dtype > TD_DTYPE_INVALID && t->dtype < TD_DTYPE_COUNT);
        int64_t numel = 0, nbytes = 0;
        TD_ASSERT(td_shape_numel(t->ndim, t->shape, &numel, NULL) == TD_OK);
        TD_ASSERT(td_dtype_nbytes(t->dtype, numel, &nbytes, NULL) == TD_OK);
        TD_ASSERT((uint64_t)nbytes == t->end - t->begin);
        if (t->end > t->begin) {
            sink ^= base[t->begin];
            sink ^= base[t->end - 1];
        }
        covered += t->end - t->begin;
        TD_ASSERT(td_st_header_find(&h, t->name) == t);
        if (i > 0) TD_ASSERT(strcmp(h.tensors[i - 1].name, t->name) < 0);
    }
    TD_ASSERT(covered == h.data_len); /* tiling: no hole, no overlap */
    for (size_t i = 0; i < h.n_meta; i++)
        TD_ASSERT(td_st_header_meta(&h, h.meta_keys[i]) == h.meta_vals[i]);
    (void)sink;
    td_st_header_free(&h);
    return 0;
}
